"""The outbox store: staged enqueues, claimed under a lease, moved only by their claimant."""

from __future__ import annotations

from ultimat3.jobs.core import EnqueueRequest

from .target import Conformance

__all__ = ["OutboxRules"]


async def _staged(jobs: Conformance, count: int) -> list[EnqueueRequest]:
    requests = [jobs.request(input={"n": n}) for n in range(count)]
    for request in requests:
        await jobs.outbox.stage(request)
    return requests


class OutboxRules:
    async def test_an_empty_outbox_hands_out_nothing(self, jobs: Conformance) -> None:
        assert await jobs.outbox.claim(claimant="r1", limit=10, lease=30) == []

    async def test_a_claim_hands_out_the_staged_request_stamped(self, jobs: Conformance) -> None:
        (request,) = await _staged(jobs, 1)
        staged_at = jobs.now()
        jobs.advance(2)
        (record,) = await jobs.outbox.claim(claimant="r1", limit=10, lease=30)
        assert record.request == request
        assert (record.staged_at, record.claimed_by, record.claimed_at) == (
            staged_at,
            "r1",
            jobs.now(),
        )

    async def test_a_claim_hands_out_in_staged_order(self, jobs: Conformance) -> None:
        first = jobs.request()
        jobs.advance(1)
        second = jobs.request()
        await jobs.outbox.stage(second)
        jobs.advance(1)
        await jobs.outbox.stage(first)
        records = await jobs.outbox.claim(claimant="r1", limit=10, lease=30)
        assert [r.request.id for r in records] == [second.id, first.id]

    async def test_a_claim_breaks_staged_at_ties_by_id(self, jobs: Conformance) -> None:
        ids = ["0190a000-0000-7000-8000-00000000000" + digit for digit in "3172"]
        for job_id in ids:
            await jobs.outbox.stage(jobs.request(id=job_id))
        records = await jobs.outbox.claim(claimant="r1", limit=10, lease=30)
        assert [r.request.id for r in records] == sorted(ids)

    async def test_a_claim_takes_at_most_its_limit(self, jobs: Conformance) -> None:
        requests = await _staged(jobs, 3)
        first = await jobs.outbox.claim(claimant="r1", limit=2, lease=30)
        assert [r.request.id for r in first] == [r.id for r in requests[:2]]

    async def test_claimed_rows_and_every_row_after_them_wait_for_the_claimant(
        self, jobs: Conformance
    ) -> None:
        """Another claimant takes neither the rows a live claim holds nor any row staged after
        them: a later row never overtakes a batch still being published."""
        requests = await _staged(jobs, 3)
        await jobs.outbox.claim(claimant="r1", limit=2, lease=30)
        jobs.advance(29)
        assert await jobs.outbox.claim(claimant="r2", limit=10, lease=30) == []
        jobs.advance(2)  # r1's claim lapsed: its rows go first again
        rest = await jobs.outbox.claim(claimant="r2", limit=10, lease=30)
        assert [r.request.id for r in rest] == [r.id for r in requests]

    async def test_a_claimant_asking_again_gets_its_own_rows_back(self, jobs: Conformance) -> None:
        staged = await _staged(jobs, 3)
        first = await jobs.outbox.claim(claimant="r1", limit=2, lease=30)
        again = await jobs.outbox.claim(claimant="r1", limit=2, lease=30)
        assert [r.request.id for r in again] == [r.request.id for r in first]
        assert [r.request.id for r in first] == [r.id for r in staged[:2]]

    async def test_a_lapsed_claim_frees_its_rows(self, jobs: Conformance) -> None:
        (request,) = await _staged(jobs, 1)
        await jobs.outbox.claim(claimant="r1", limit=10, lease=30)
        jobs.advance(30)
        (record,) = await jobs.outbox.claim(claimant="r2", limit=10, lease=30)
        assert (record.request.id, record.claimed_by) == (request.id, "r2")

    async def test_release_hands_rows_back_at_once(self, jobs: Conformance) -> None:
        requests = await _staged(jobs, 2)
        await jobs.outbox.claim(claimant="r1", limit=10, lease=30)
        assert await jobs.outbox.release([r.id for r in requests], claimant="r1") == 2
        again = await jobs.outbox.claim(claimant="r2", limit=10, lease=30)
        assert [r.request.id for r in again] == [r.id for r in requests]

    async def test_release_by_another_claimant_moves_nothing(self, jobs: Conformance) -> None:
        (request,) = await _staged(jobs, 1)
        await jobs.outbox.claim(claimant="r1", limit=10, lease=30)
        assert await jobs.outbox.release([request.id], claimant="r2") == 0
        assert await jobs.outbox.claim(claimant="r2", limit=10, lease=30) == []

    async def test_a_lapsed_claimant_cannot_release_the_new_claim(self, jobs: Conformance) -> None:
        (request,) = await _staged(jobs, 1)
        await jobs.outbox.claim(claimant="r1", limit=10, lease=30)
        jobs.advance(30)
        await jobs.outbox.claim(claimant="r2", limit=10, lease=30)
        assert await jobs.outbox.release([request.id], claimant="r1") == 0
        assert await jobs.outbox.claim(claimant="r3", limit=10, lease=30) == []

    async def test_mark_published_retires_the_rows(self, jobs: Conformance) -> None:
        requests = await _staged(jobs, 2)
        await jobs.outbox.claim(claimant="r1", limit=10, lease=30)
        assert await jobs.outbox.mark_published([r.id for r in requests], claimant="r1") == 2
        jobs.advance(3600)
        assert await jobs.outbox.claim(claimant="r2", limit=10, lease=30) == []

    async def test_a_lapsed_claimant_cannot_mark_the_new_claim_published(
        self, jobs: Conformance
    ) -> None:
        (request,) = await _staged(jobs, 1)
        await jobs.outbox.claim(claimant="r1", limit=10, lease=30)
        jobs.advance(30)
        await jobs.outbox.claim(claimant="r2", limit=10, lease=30)
        assert await jobs.outbox.mark_published([request.id], claimant="r1") == 0
        assert await jobs.outbox.mark_published([request.id], claimant="r2") == 1

    async def test_unknown_ids_move_nothing(self, jobs: Conformance) -> None:
        unknown = ["0190a000-0000-7000-8000-0000000000ff"]
        assert await jobs.outbox.release(unknown, claimant="r1") == 0
        assert await jobs.outbox.mark_published(unknown, claimant="r1") == 0

    async def test_an_unclaimed_row_cannot_be_marked_published(self, jobs: Conformance) -> None:
        (request,) = await _staged(jobs, 1)
        assert await jobs.outbox.mark_published([request.id], claimant="r1") == 0
        assert len(await jobs.outbox.claim(claimant="r1", limit=10, lease=30)) == 1
