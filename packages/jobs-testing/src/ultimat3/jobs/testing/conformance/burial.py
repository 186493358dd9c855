"""Final-attempt burial: a lease that lapses on a row's last attempt is settled by the claim.

Such a row is never handed out again. The claim settles it dead (failed for names in
``drop_exhausted``) with ``last_error = LEASE_LAPSED_FINAL_ATTEMPT``, counts it, and reports it in
``ClaimBatch.exhausted`` — once per row, ever. It spends no slot: the claim goes on to the next
row. A claim buries at least every such row it passes on its way to the rows it hands out (all
of them in a queue it could not fill); rows past the last one it handed out may wait for a
later claim.
"""

from __future__ import annotations

from typing import Any

from ultimat3.jobs.core import LEASE_LAPSED_FINAL_ATTEMPT, ClaimedJob, JobState

from .target import Conformance

__all__ = ["BurialRules"]


async def _lapsed_on_final_attempt(jobs: Conformance, **fields: Any) -> ClaimedJob:
    held = await jobs.running(max_attempts=1, **fields)
    jobs.clock.set(held.lease_until)
    return held


class BurialRules:
    async def test_a_lapsed_final_attempt_is_buried_not_handed_out(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs)
        batch = await jobs.claim(held.queue, worker="w2")
        assert list(batch.jobs) == []
        assert [(e.id, e.state, e.attempt, e.max_attempts) for e in batch.exhausted] == [
            (held.id, JobState.DEAD, 1, 1)
        ]
        assert (await jobs.queue_stats(held.queue)).dead == 1

    async def test_a_buried_row_is_reported_with_its_identity(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs, name="buried", tenant="org-1")
        (buried,) = (await jobs.claim(held.queue)).exhausted
        assert (buried.run_id, buried.name, buried.queue) == (held.run_id, "buried", held.queue)
        assert (buried.input, buried.tenant_id) == (held.input, "org-1")

    async def test_a_buried_row_is_reported_once(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs)
        assert len((await jobs.claim(held.queue)).exhausted) == 1
        jobs.advance(3600)
        again = await jobs.claim(held.queue)
        assert (list(again.jobs), list(again.exhausted)) == ([], [])

    async def test_drop_exhausted_buries_the_named_jobs_failed(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs, name="droppable")
        batch = await jobs.claim(held.queue, drop_exhausted={"droppable"})
        assert [e.state for e in batch.exhausted] == [JobState.FAILED]
        stats = await jobs.queue_stats(held.queue)
        assert (stats.failed, stats.dead) == (1, 0)

    async def test_drop_exhausted_leaves_other_names_dead(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs, name="kept")
        batch = await jobs.claim(held.queue, drop_exhausted={"another-job"})
        assert [e.state for e in batch.exhausted] == [JobState.DEAD]

    async def test_a_buried_row_carries_the_lapse_as_its_error(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs)
        await jobs.claim(held.queue)
        row = await jobs.row(held.id)
        assert (row.state, row.last_error) == (JobState.DEAD, LEASE_LAPSED_FINAL_ATTEMPT)
        assert (row.finished_at, row.worker_id, row.lease_until) == (jobs.now(), None, None)

    async def test_burial_spends_no_slot(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs, queue="q", delay=-60)
        waiting = await jobs.enqueue(queue="q")
        batch = await jobs.claim("q", 1, worker="w2")
        assert [job.id for job in batch.jobs] == [waiting.id]
        assert [e.id for e in batch.exhausted] == [held.id]

    async def test_a_lapsed_row_with_attempts_left_is_handed_out(self, jobs: Conformance) -> None:
        held = await jobs.running(max_attempts=2)
        jobs.clock.set(held.lease_until)
        batch = await jobs.claim(held.queue, worker="w2")
        assert [(job.id, job.attempt) for job in batch.jobs] == [(held.id, 2)]
        assert list(batch.exhausted) == []

    async def test_a_live_final_attempt_is_left_running(self, jobs: Conformance) -> None:
        held = await jobs.running(max_attempts=1)
        batch = await jobs.claim(held.queue, worker="w2")
        assert list(batch.exhausted) == []
        assert (await jobs.queue_stats(held.queue)).running == 1

    async def test_a_buried_row_frees_its_key(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs, key="k")
        await jobs.claim(held.queue)
        assert not (await jobs.enqueue(key="k", queue=held.queue)).deduped

    async def test_a_buried_row_refuses_its_old_claim(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs)
        await jobs.claim(held.queue)
        assert not await jobs.ack(held)
        assert (await jobs.queue_stats(held.queue)).dead == 1

    async def test_a_paused_queue_buries_nothing(self, jobs: Conformance) -> None:
        held = await _lapsed_on_final_attempt(jobs)
        await jobs.introspect.pause_queue(held.queue)
        assert list((await jobs.claim(held.queue)).exhausted) == []
        assert (await jobs.queue_stats(held.queue)).running == 1
