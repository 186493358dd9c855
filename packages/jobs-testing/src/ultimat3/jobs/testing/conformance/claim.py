"""Claim: which rows a claim hands out, in what order, and for how long."""

from __future__ import annotations

from datetime import timedelta

from ultimat3.jobs.core import JobState

from .target import Conformance

__all__ = ["ClaimRules"]


class ClaimRules:
    async def test_claim_on_an_empty_backend_hands_out_nothing(self, jobs: Conformance) -> None:
        batch = await jobs.claim(slots=5)
        assert (list(batch.jobs), list(batch.exhausted)) == ([], [])

    async def test_claim_hands_out_the_oldest_run_at_first(self, jobs: Conformance) -> None:
        late = await jobs.enqueue(delay=-10)
        early = await jobs.enqueue(delay=-30)
        middle = await jobs.enqueue(delay=-20)
        assert [(await jobs.claim_one()).id for _ in range(3)] == [early.id, middle.id, late.id]

    async def test_a_batch_lists_its_rows_oldest_run_at_first(self, jobs: Conformance) -> None:
        late = await jobs.enqueue(delay=-10)
        early = await jobs.enqueue(delay=-30)
        middle = await jobs.enqueue(delay=-20)
        assert await jobs.claimed_ids(slots=3) == [early.id, middle.id, late.id]

    async def test_claim_breaks_run_at_ties_in_id_order(self, jobs: Conformance) -> None:
        at = jobs.at(-1)
        ids = ["0190a000-0000-7000-8000-00000000000" + digit for digit in "3172"]
        for job_id in ids:
            await jobs.enqueue(id=job_id, run_at=at)
        assert [(await jobs.claim_one()).id for _ in ids] == sorted(ids)

    async def test_claim_takes_the_oldest_rows_up_to_its_slots(self, jobs: Conformance) -> None:
        newest = await jobs.enqueue(delay=-1)
        oldest = await jobs.enqueue(delay=-3)
        older = await jobs.enqueue(delay=-2)
        assert set(await jobs.claimed_ids(slots=2)) == {oldest.id, older.id}
        assert await jobs.claimed_ids(slots=2) == [newest.id]

    async def test_claim_with_no_free_slot_takes_nothing(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        assert await jobs.claimed_ids(slots=0) == []
        assert (await jobs.queue_stats()).ready == 1

    async def test_a_claim_is_attempt_one(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        assert (await jobs.claim_one()).attempt == 1

    async def test_a_claim_leases_the_row_for_the_visibility_timeout(
        self, jobs: Conformance
    ) -> None:
        await jobs.enqueue()
        claimed = await jobs.claim_one(visibility_timeout=45)
        assert claimed.lease_until == jobs.now() + timedelta(seconds=45)

    async def test_a_claim_stamps_the_worker_and_a_claim_token(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        claimed = await jobs.claim_one(worker="worker-7")
        assert claimed.claim.worker_id == "worker-7"
        assert isinstance(claimed.claim.claim, str)
        assert claimed.claim.claim

    async def test_a_claimed_row_is_running(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        await jobs.claim_one()
        stats = await jobs.queue_stats()
        assert (stats.ready, stats.running) == (0, 1)

    async def test_the_operator_sees_the_claim_on_the_row(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        claimed = await jobs.claim_one(worker="worker-7", visibility_timeout=45)
        row = await jobs.row(claimed.id)
        assert row.state is JobState.RUNNING
        assert (row.worker_id, row.lease_until, row.attempt) == ("worker-7", claimed.lease_until, 1)

    async def test_a_claimed_row_is_invisible_while_its_lease_holds(
        self, jobs: Conformance
    ) -> None:
        await jobs.enqueue()
        await jobs.claim_one(visibility_timeout=30)
        jobs.advance(29.999)
        assert await jobs.claimed_ids(worker="w2") == []

    async def test_a_lapsed_lease_hands_the_row_out_again(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        first = await jobs.claim_one(visibility_timeout=30)
        jobs.advance(30)
        again = await jobs.claim_one(worker="w2")
        assert (again.id, again.attempt, again.claim.worker_id) == (first.id, 2, "w2")

    async def test_every_claim_mints_a_fresh_token(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        first = await jobs.claim_one(visibility_timeout=30)
        jobs.advance(30)
        again = await jobs.claim_one(worker="w1")
        assert again.claim.worker_id == first.claim.worker_id
        assert again.claim.claim != first.claim.claim

    async def test_a_reclaimed_row_keeps_its_run_at_place(self, jobs: Conformance) -> None:
        lapsed = await jobs.enqueue(delay=-10)
        await jobs.claim_one(visibility_timeout=30)
        jobs.advance(30)
        newer = await jobs.enqueue(delay=-5)
        assert [(await jobs.claim_one()).id for _ in range(2)] == [lapsed.id, newer.id]

    async def test_a_row_due_later_is_not_handed_out(self, jobs: Conformance) -> None:
        await jobs.enqueue(delay=1)
        assert await jobs.claimed_ids() == []

    async def test_a_row_is_handed_out_at_its_run_at(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue(delay=60)
        jobs.advance(60)
        assert await jobs.claimed_ids() == [queued.id]

    async def test_each_row_goes_to_one_claim(self, jobs: Conformance) -> None:
        for _ in range(3):
            await jobs.enqueue()
        first = await jobs.claimed_ids(slots=2, worker="w1")
        second = await jobs.claimed_ids(slots=2, worker="w2")
        assert len(first) == 2
        assert len(second) == 1
        assert not set(first) & set(second)

    async def test_finished_rows_are_never_handed_out(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.ack(held)
        jobs.advance(3600)
        assert await jobs.claimed_ids(held.queue) == []
