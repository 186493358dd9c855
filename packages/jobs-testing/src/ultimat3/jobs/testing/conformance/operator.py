"""The operator's one-row actions: remove, requeue (from a step), cancel and promote."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from ultimat3.jobs.core import (
    BulkFilter,
    BulkResult,
    ClaimedJob,
    JobDuplicateError,
    JobFilter,
    JobNotFoundError,
    JobNotPromotableError,
    JobNotRemovableError,
    JobNotRequeueableError,
    JobPageInvalidError,
    JobState,
    Progress,
    StepRecord,
    job_cursor,
)

from .target import Conformance

__all__ = ["OperatorRules"]

_UNKNOWN = "0190a000-0000-7000-8000-0000000000ff"


async def _finished(jobs: Conformance, state: JobState, **fields: Any) -> ClaimedJob:
    """A row that ran once and ended in ``state``."""
    held = await jobs.running(**fields)
    if state is JobState.DONE:
        assert await jobs.ack(held)
    elif state is JobState.CANCELLED:
        assert await jobs.introspect.cancel(held.id) is not None
    else:
        assert await jobs.nack(
            held, error="boom", dead_letter=state is JobState.DEAD, fail=state is JobState.FAILED
        )
    return held


async def _with_steps(jobs: Conformance, names: list[str]) -> ClaimedJob:
    held = await jobs.running()
    for seq, name in enumerate(names):
        step = StepRecord(name, seq, {"step": name})
        assert await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
    return held


class OperatorRules:
    # -- remove ---------------------------------------------------------------------------------

    async def test_remove_deletes_the_row(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue()
        assert await jobs.introspect.remove(queued.id) is True
        assert await jobs.introspect.get(queued.id) is None
        assert await jobs.driver.stats() == []

    async def test_remove_of_an_unknown_id_answers_false(self, jobs: Conformance) -> None:
        assert await jobs.introspect.remove(_UNKNOWN) is False

    async def test_a_running_row_is_not_removable(self, jobs: Conformance) -> None:
        held = await jobs.running()
        with pytest.raises(JobNotRemovableError) as refused:
            await jobs.introspect.remove(held.id)
        assert refused.value.code == "X_JOB_NOT_REMOVABLE"
        assert (await jobs.row(held.id)).state is JobState.RUNNING

    async def test_remove_takes_the_steps_with_the_row(self, jobs: Conformance) -> None:
        held = await _with_steps(jobs, ["a"])
        assert await jobs.ack(held)
        assert await jobs.introspect.remove(held.id)
        await jobs.enqueue(queue=held.queue, run_id=held.run_id)
        assert (await jobs.claim_one(held.queue)).steps == {}

    async def test_remove_keeps_the_steps_another_row_of_the_run_still_needs(
        self, jobs: Conformance
    ) -> None:
        held = await _with_steps(jobs, ["a"])
        assert await jobs.ack(held)
        await jobs.enqueue(queue=held.queue, run_id=held.run_id)
        assert await jobs.introspect.remove(held.id)
        assert set((await jobs.claim_one(held.queue)).steps) == {"a"}

    async def test_removing_every_row_of_a_run_at_once_takes_its_steps(
        self, jobs: Conformance
    ) -> None:
        """Two removes side by side, each of a row the other's run shares: each sees the other
        row, and neither may leave the steps behind for a later row of the run to replay."""
        for _ in range(5):
            held = await _with_steps(jobs, ["a"])
            assert await jobs.ack(held)
            other = await jobs.enqueue(queue="other", run_id=held.run_id)
            removed = await asyncio.gather(
                jobs.introspect.remove(held.id), jobs.introspect.remove(other.id)
            )
            assert list(removed) == [True, True]
            await jobs.enqueue(queue="later", run_id=held.run_id)
            assert (await jobs.claim_one("later")).steps == {}

    async def test_removing_in_bulk_beside_a_remove_of_the_runs_last_row_takes_its_steps(
        self, jobs: Conformance
    ) -> None:
        for _ in range(5):
            held = await _with_steps(jobs, ["a"])
            assert await jobs.ack(held)
            other = await jobs.enqueue(queue="other", run_id=held.run_id)
            done = BulkFilter(JobState.DONE, queue=held.queue)
            affected, removed = await asyncio.gather(
                jobs.introspect.remove_many(done), jobs.introspect.remove(other.id)
            )
            assert (affected, removed) == (BulkResult(1, 0), True)
            await jobs.enqueue(queue="later", run_id=held.run_id)
            assert (await jobs.claim_one("later")).steps == {}

    async def test_removing_a_live_row_frees_its_key(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue(key="k")
        assert await jobs.introspect.remove(queued.id)
        assert not (await jobs.enqueue(key="k")).deduped

    # -- requeue --------------------------------------------------------------------------------

    async def test_requeue_makes_a_finished_row_ready_from_scratch(self, jobs: Conformance) -> None:
        held = await _finished(jobs, JobState.DEAD)
        jobs.advance(60)
        row = await jobs.introspect.requeue(held.id)
        assert (row.id, row.run_id, row.state) == (held.id, held.run_id, JobState.READY)
        assert (row.attempt, row.run_at, row.updated_at) == (0, jobs.now(), jobs.now())
        assert (row.last_error, row.progress, row.finished_at) == (None, None, None)
        assert await jobs.row(held.id) == row

    async def test_every_finished_state_is_requeueable(self, jobs: Conformance) -> None:
        for state in (JobState.DONE, JobState.FAILED, JobState.DEAD, JobState.CANCELLED):
            held = await _finished(jobs, state)
            assert (await jobs.introspect.requeue(held.id)).state is JobState.READY

    async def test_a_requeued_row_runs_again_as_attempt_one(self, jobs: Conformance) -> None:
        held = await _finished(jobs, JobState.FAILED)
        await jobs.introspect.requeue(held.id)
        again = await jobs.claim_one(held.queue)
        assert (again.id, again.attempt) == (held.id, 1)

    async def test_requeue_keeps_the_steps(self, jobs: Conformance) -> None:
        held = await _with_steps(jobs, ["a", "b"])
        assert await jobs.nack(held, dead_letter=True)
        await jobs.introspect.requeue(held.id)
        assert set((await jobs.claim_one(held.queue)).steps) == {"a", "b"}

    async def test_requeue_from_a_step_drops_it_and_every_later_step(
        self, jobs: Conformance
    ) -> None:
        held = await _with_steps(jobs, ["a", "b", "c", "d"])
        assert await jobs.nack(held, dead_letter=True)
        await jobs.introspect.requeue(held.id, from_step="b")
        assert set((await jobs.claim_one(held.queue)).steps) == {"a"}

    async def test_requeue_from_a_step_goes_by_start_order_not_by_name(
        self, jobs: Conformance
    ) -> None:
        held = await _with_steps(jobs, ["d", "c", "b", "a"])
        assert await jobs.nack(held, dead_letter=True)
        await jobs.introspect.requeue(held.id, from_step="c")
        assert set((await jobs.claim_one(held.queue)).steps) == {"d"}

    async def test_requeue_from_an_unknown_step_is_not_found(self, jobs: Conformance) -> None:
        held = await _with_steps(jobs, ["a"])
        assert await jobs.nack(held, dead_letter=True)
        before = await jobs.snapshot(held.id)
        for step in ("nope", ""):  # "" names a step too: it is not "keep every step"
            with pytest.raises(JobNotFoundError):
                await jobs.introspect.requeue(held.id, from_step=step)
        assert await jobs.snapshot(held.id) == before

    async def test_a_live_row_is_not_requeueable(self, jobs: Conformance) -> None:
        ready = await jobs.enqueue()
        delayed = await jobs.enqueue(delay=60)
        running = await jobs.running()
        parked = await jobs.running()
        assert await jobs.nack(parked, park=True, run_at=jobs.at(60), count_attempt=False)
        for job_id in (ready.id, delayed.id, running.id, parked.id):
            with pytest.raises(JobNotRequeueableError) as refused:
                await jobs.introspect.requeue(job_id)
            assert refused.value.code == "X_JOB_NOT_REQUEUEABLE"

    async def test_requeue_over_a_live_key_is_a_duplicate(self, jobs: Conformance) -> None:
        held = await _finished(jobs, JobState.DEAD, key="k")
        await jobs.enqueue(key="k")
        before = await jobs.snapshot(held.id)
        with pytest.raises(JobDuplicateError) as refused:
            await jobs.introspect.requeue(held.id)
        assert refused.value.code == "X_JOB_DUPLICATE"
        assert await jobs.snapshot(held.id) == before

    async def test_requeue_of_an_unknown_id_is_not_found(self, jobs: Conformance) -> None:
        with pytest.raises(JobNotFoundError) as refused:
            await jobs.introspect.requeue(_UNKNOWN)
        assert refused.value.code == "X_JOB_NOT_FOUND"

    async def test_a_requeued_row_holds_its_key_again(self, jobs: Conformance) -> None:
        held = await _finished(jobs, JobState.DONE, key="k")
        await jobs.introspect.requeue(held.id)
        assert (await jobs.enqueue(key="k")).id == held.id

    # -- cancel ---------------------------------------------------------------------------------

    async def test_cancel_stops_a_queued_row(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue()
        row = await jobs.introspect.cancel(queued.id, "runaway")
        assert row is not None
        assert (row.state, row.last_error) == (JobState.CANCELLED, "cancelled: runaway")
        assert row.finished_at == jobs.now()
        assert await jobs.claimed_ids() == []

    async def test_cancel_without_a_reason_says_cancelled(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue(delay=60)
        row = await jobs.introspect.cancel(queued.id)
        assert row is not None
        assert row.last_error == "cancelled"

    async def test_a_cancelled_run_cannot_settle_renew_or_report(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.introspect.cancel(held.id) is not None
        assert not await jobs.driver.heartbeat(held.id, held.claim, 30)
        assert not await jobs.ack(held)
        assert not await jobs.nack(held, error="late")
        assert not await jobs.driver.save_step(
            held.id, held.claim, held.run_id, StepRecord("late", 0, 1)
        )
        assert not await jobs.introspect.record_progress(held.id, held.claim, Progress(1, 2))
        row = await jobs.row(held.id)
        assert (row.state, row.progress) == (JobState.CANCELLED, None)

    async def test_a_cancelled_running_row_is_not_handed_out_when_its_lease_lapses(
        self, jobs: Conformance
    ) -> None:
        held = await jobs.running()
        row = await jobs.introspect.cancel(held.id, "runaway")
        assert row is not None
        assert (row.state, row.worker_id) == (JobState.CANCELLED, None)
        assert row.lease_until == held.lease_until  # when the cancelled run stops at the latest
        jobs.clock.set(held.lease_until)
        jobs.advance(1)
        batch = await jobs.claim(held.queue, 10)
        assert (list(batch.jobs), list(batch.exhausted)) == ([], [])
        assert (await jobs.row(held.id)).state is JobState.CANCELLED

    async def test_a_row_cancelled_while_it_ran_is_requeued_due_when_that_run_is_over(
        self, jobs: Conformance
    ) -> None:
        """The cancelled run stops at its worker's next heartbeat, or when its lease is lost:
        until then a requeued row claimed at once would run beside it."""
        held = await jobs.running()
        assert await jobs.introspect.cancel(held.id) is not None
        jobs.advance(1)
        row = await jobs.introspect.requeue(held.id)
        assert (row.state, row.run_at, row.lease_until) == (JobState.READY, held.lease_until, None)
        assert await jobs.claimed_ids(held.queue) == []
        jobs.clock.set(held.lease_until)
        assert await jobs.claimed_ids(held.queue) == [held.id]

    async def test_a_row_cancelled_while_it_waited_is_requeued_due_now(
        self, jobs: Conformance
    ) -> None:
        queued = await jobs.enqueue()
        cancelled = await jobs.introspect.cancel(queued.id)
        assert cancelled is not None
        assert cancelled.lease_until is None
        jobs.advance(1)
        assert (await jobs.introspect.requeue(queued.id)).run_at == jobs.now()

    async def test_requeue_many_waits_for_the_runs_its_rows_were_cancelled_in(
        self, jobs: Conformance
    ) -> None:
        held = await jobs.running()
        assert await jobs.introspect.cancel(held.id) is not None
        assert await jobs.introspect.requeue_many(BulkFilter(JobState.CANCELLED)) == BulkResult(
            1, 0
        )
        assert (await jobs.row(held.id)).run_at == held.lease_until
        assert await jobs.claimed_ids(held.queue) == []

    async def test_cancel_of_a_finished_row_answers_none_and_leaves_it(
        self, jobs: Conformance
    ) -> None:
        held = await _finished(jobs, JobState.DONE)
        before = await jobs.snapshot(held.id)
        assert await jobs.introspect.cancel(held.id, "too late") is None
        assert await jobs.snapshot(held.id) == before

    async def test_cancel_of_an_unknown_id_answers_none(self, jobs: Conformance) -> None:
        assert await jobs.introspect.cancel(_UNKNOWN) is None

    async def test_a_cancelled_row_frees_its_key(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue(key="k")
        assert await jobs.introspect.cancel(queued.id) is not None
        assert not (await jobs.enqueue(key="k")).deduped

    # -- promote --------------------------------------------------------------------------------

    async def test_promote_makes_a_delayed_row_due_now(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue(delay=3600)
        row = await jobs.introspect.promote(queued.id)
        assert (row.state, row.run_at) == (JobState.READY, jobs.now())
        assert await jobs.claimed_ids() == [queued.id]

    async def test_promote_cuts_a_backoff_short(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="boom", run_at=jobs.at(600))
        row = await jobs.introspect.promote(held.id)
        assert (row.state, row.run_at, row.attempt) == (JobState.READY, jobs.now(), 1)

    async def test_a_row_already_due_is_not_promotable(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue()
        with pytest.raises(JobNotPromotableError) as refused:
            await jobs.introspect.promote(queued.id)
        assert refused.value.code == "X_JOB_NOT_PROMOTABLE"

    async def test_running_suspended_and_finished_rows_are_not_promotable(
        self, jobs: Conformance
    ) -> None:
        running = await jobs.running()
        parked = await jobs.running()
        assert await jobs.nack(parked, park=True, run_at=jobs.at(60), count_attempt=False)
        done = await _finished(jobs, JobState.DONE)
        for job_id in (running.id, parked.id, done.id):
            with pytest.raises(JobNotPromotableError):
                await jobs.introspect.promote(job_id)

    async def test_promote_of_an_unknown_id_is_not_found(self, jobs: Conformance) -> None:
        with pytest.raises(JobNotFoundError):
            await jobs.introspect.promote(_UNKNOWN)

    async def test_an_id_or_filter_holding_nul_names_no_row(self, jobs: Conformance) -> None:
        """No store holds NUL (Postgres text cannot): such an id is not found, such a filter
        matches nothing, and a cursor naming one was not produced by a page."""
        queued = await jobs.enqueue(queue="q")
        held = queued.id + "\x00"
        assert await jobs.introspect.get(held) is None
        assert await jobs.introspect.remove(held) is False
        assert await jobs.introspect.cancel(held) is None
        for action in (jobs.introspect.requeue, jobs.introspect.promote):
            with pytest.raises(JobNotFoundError):
                await action(held)
        for narrowed in (JobFilter(queue="q\x00"), JobFilter(id_prefix=queued.id[:8] + "\x00")):
            assert (await jobs.introspect.list(narrowed)).rows == []
        bulk = BulkFilter(state=JobState.READY, queue="q\x00")
        assert await jobs.introspect.promote_many(bulk) == BulkResult(affected=0, remaining=0)
        (row,) = (await jobs.introspect.list(JobFilter(queue="q"))).rows
        with pytest.raises(JobPageInvalidError):
            await jobs.introspect.list(JobFilter(after=job_cursor(replace(row, id=held))))
        assert [r.id for r in (await jobs.introspect.list(JobFilter())).rows] == [queued.id]
