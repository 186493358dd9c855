"""The operator's bulk actions: at most ``MAX_BULK_ROWS`` per call, with an honest ``remaining``.

``remaining`` is what a second call could still move, so a caller looping "until zero" ends.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from ultimat3.jobs.core import (
    MAX_BULK_ROWS,
    BulkFilter,
    BulkResult,
    InvariantError,
    JobNotPromotableError,
    JobNotRemovableError,
    JobNotRequeueableError,
    JobState,
)

from .target import Conformance

__all__ = ["BulkRules"]


async def _cancelled(jobs: Conformance, count: int, **fields: Any) -> list[str]:
    """``count`` rows cancelled while queued (finished without a claim); their ids."""
    requests = [jobs.request(**fields) for _ in range(count)]
    await jobs.driver.enqueue_many(requests)
    for request in requests:
        assert await jobs.introspect.cancel(request.id) is not None
    return [request.id for request in requests]


class BulkRules:
    async def test_requeue_many_makes_finished_rows_ready(self, jobs: Conformance) -> None:
        ids = await _cancelled(jobs, 3)
        result = await jobs.introspect.requeue_many(BulkFilter(state=JobState.CANCELLED))
        assert result == BulkResult(affected=3, remaining=0)
        assert sorted(await jobs.claimed_ids(slots=5)) == sorted(ids)

    async def test_requeue_many_filters_by_queue_name_and_tenant(self, jobs: Conformance) -> None:
        (wanted,) = await _cancelled(jobs, 1, queue="a", name="n", tenant="org-1")
        await _cancelled(jobs, 1, queue="b", name="n", tenant="org-1")
        await _cancelled(jobs, 1, queue="a", name="m", tenant="org-1")
        await _cancelled(jobs, 1, queue="a", name="n", tenant="org-2")
        narrow = BulkFilter(state=JobState.CANCELLED, queue="a", name="n", tenant_id="org-1")
        assert await jobs.introspect.requeue_many(narrow) == BulkResult(1, 0)
        assert await jobs.claimed_ids("a", slots=5) == [wanted]

    async def test_a_state_named_by_its_string_moves_the_rows_of_that_state(
        self, jobs: Conformance
    ) -> None:
        """A filter built from a CLI argument or JSON names its state as a string; one naming
        no state is refused before anything moves."""
        ids = await _cancelled(jobs, 2)
        with pytest.raises(InvariantError):
            BulkFilter(state=cast(JobState, "canceled"))
        result = await jobs.introspect.requeue_many(BulkFilter(state=cast(JobState, "cancelled")))
        assert result == BulkResult(affected=2, remaining=0)
        assert sorted(await jobs.claimed_ids(slots=5)) == sorted(ids)

    async def test_requeue_many_refuses_a_live_state(self, jobs: Conformance) -> None:
        for state in (JobState.READY, JobState.DELAYED, JobState.RUNNING, JobState.SUSPENDED):
            with pytest.raises(JobNotRequeueableError):
                await jobs.introspect.requeue_many(BulkFilter(state=state))

    async def test_requeue_many_leaves_a_row_whose_key_a_live_job_holds(
        self, jobs: Conformance
    ) -> None:
        (held,) = await _cancelled(jobs, 1, key="k")
        await _cancelled(jobs, 1)
        await jobs.enqueue(key="k")
        result = await jobs.introspect.requeue_many(BulkFilter(state=JobState.CANCELLED))
        assert result == BulkResult(affected=1, remaining=0)
        assert (await jobs.row(held)).state is JobState.CANCELLED

    async def test_requeue_many_requeues_the_oldest_of_rows_sharing_a_key(
        self, jobs: Conformance
    ) -> None:
        oldest = (await _cancelled(jobs, 1, key="k"))[0]
        jobs.advance(1)
        await _cancelled(jobs, 1, key="k")
        result = await jobs.introspect.requeue_many(BulkFilter(state=JobState.CANCELLED))
        assert result == BulkResult(affected=1, remaining=0)
        assert (await jobs.row(oldest)).state is JobState.READY

    async def test_requeue_many_moves_at_most_the_bound(self, jobs: Conformance) -> None:
        await _cancelled(jobs, MAX_BULK_ROWS + 1)
        everything = BulkFilter(state=JobState.CANCELLED)
        assert await jobs.introspect.requeue_many(everything) == BulkResult(MAX_BULK_ROWS, 1)
        assert await jobs.introspect.requeue_many(everything) == BulkResult(1, 0)

    async def test_requeue_many_spends_its_bound_only_on_rows_it_can_move(
        self, jobs: Conformance
    ) -> None:
        """A row whose key a live job holds, ahead of the rest, takes none of the bound, and is
        not counted in ``remaining``: no later call could move it either."""
        (held,) = await _cancelled(jobs, 1, key="k")
        await jobs.enqueue(key="k")
        jobs.advance(1)
        await _cancelled(jobs, MAX_BULK_ROWS)
        everything = BulkFilter(state=JobState.CANCELLED)
        assert await jobs.introspect.requeue_many(everything) == BulkResult(MAX_BULK_ROWS, 0)
        assert (await jobs.row(held)).state is JobState.CANCELLED

    async def test_remove_many_deletes_the_matching_rows(self, jobs: Conformance) -> None:
        await jobs.driver.enqueue_many([jobs.request(queue="a") for _ in range(2)])
        kept = await jobs.enqueue(queue="b")
        gone = BulkFilter(state=JobState.READY, queue="a")
        assert await jobs.introspect.remove_many(gone) == BulkResult(2, 0)
        assert [row.id for row in await jobs.all_rows()] == [kept.id]

    async def test_remove_many_filters_by_name_and_tenant(self, jobs: Conformance) -> None:
        gone = await jobs.enqueue(name="n", tenant="org-1")
        await jobs.enqueue(name="n", tenant="org-2")
        await jobs.enqueue(name="m", tenant="org-1")
        narrow = BulkFilter(state=JobState.READY, name="n", tenant_id="org-1")
        assert await jobs.introspect.remove_many(narrow) == BulkResult(1, 0)
        assert await jobs.introspect.get(gone.id) is None

    async def test_remove_many_refuses_running_rows(self, jobs: Conformance) -> None:
        held = await jobs.running()
        with pytest.raises(JobNotRemovableError):
            await jobs.introspect.remove_many(BulkFilter(state=JobState.RUNNING))
        assert (await jobs.row(held.id)).state is JobState.RUNNING

    async def test_remove_many_moves_at_most_the_bound(self, jobs: Conformance) -> None:
        await jobs.driver.enqueue_many([jobs.request() for _ in range(MAX_BULK_ROWS + 2)])
        ready = BulkFilter(state=JobState.READY)
        assert await jobs.introspect.remove_many(ready) == BulkResult(MAX_BULK_ROWS, 2)
        assert await jobs.introspect.remove_many(ready) == BulkResult(2, 0)

    async def test_promote_many_makes_waiting_rows_due_now(self, jobs: Conformance) -> None:
        a = await jobs.enqueue(delay=60)
        b = await jobs.enqueue(delay=3600)
        result = await jobs.introspect.promote_many(BulkFilter(state=JobState.DELAYED))
        assert result == BulkResult(2, 0)
        for job_id in (a.id, b.id):
            row = await jobs.row(job_id)
            assert (row.state, row.run_at) == (JobState.READY, jobs.now())

    async def test_promote_many_moves_only_ready_rows_still_backing_off(
        self, jobs: Conformance
    ) -> None:
        due = await jobs.enqueue(delay=-5)
        held = await jobs.running()
        assert await jobs.nack(held, error="boom", run_at=jobs.at(600))
        result = await jobs.introspect.promote_many(BulkFilter(state=JobState.READY))
        assert result == BulkResult(1, 0)
        assert (await jobs.row(held.id)).run_at == jobs.now()
        assert (await jobs.row(due.id)).run_at == jobs.at(-5)

    async def test_promote_many_refuses_a_state_with_nothing_to_promote(
        self, jobs: Conformance
    ) -> None:
        for state in (JobState.RUNNING, JobState.SUSPENDED, JobState.DONE, JobState.DEAD):
            with pytest.raises(JobNotPromotableError):
                await jobs.introspect.promote_many(BulkFilter(state=state))

    async def test_promote_many_moves_at_most_the_bound(self, jobs: Conformance) -> None:
        await jobs.driver.enqueue_many([jobs.request(delay=60) for _ in range(MAX_BULK_ROWS + 2)])
        delayed = BulkFilter(state=JobState.DELAYED)
        assert await jobs.introspect.promote_many(delayed) == BulkResult(MAX_BULK_ROWS, 2)
        assert await jobs.introspect.promote_many(delayed) == BulkResult(2, 0)

    async def test_bulk_actions_on_nothing_move_nothing(self, jobs: Conformance) -> None:
        nothing = BulkResult(0, 0)
        assert await jobs.introspect.requeue_many(BulkFilter(JobState.DEAD)) == nothing
        assert await jobs.introspect.remove_many(BulkFilter(JobState.DONE)) == nothing
        assert await jobs.introspect.promote_many(BulkFilter(JobState.DELAYED)) == nothing
