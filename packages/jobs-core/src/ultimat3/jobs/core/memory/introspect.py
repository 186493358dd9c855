"""The operator surface of the memory driver, over the same heap as the driver."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from .. import refusals
from ..constants import MAX_BULK_ROWS, MAX_TASK_FIRES
from ..counters import rollup
from ..cursor import page_limit, parse_cursor
from ..model import (
    LIVE_STATES,
    PROMOTABLE_STATES,
    REQUEUEABLE_STATES,
    BulkFilter,
    BulkResult,
    ClaimRef,
    CounterBucket,
    CounterTotals,
    JobDetail,
    JobFilter,
    JobPage,
    JobRow,
    JobState,
    Progress,
    TaskFire,
    WorkerInfo,
)
from ..wake import signal_enqueued
from .state import MemoryState, Row, copied_step

__all__ = ["MemoryIntrospection"]


class MemoryIntrospection:
    """Every operation that makes rows due (requeue, promote, their bulk forms, resume_queue)
    announces their queues through ``signal_enqueued``, the memory driver's whole wake, as the
    other drivers' statements announce theirs on the backend."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    # -- reading ---------------------------------------------------------------------------

    async def list(self, filter: JobFilter) -> JobPage:
        limit = page_limit(filter)
        rows = sorted(
            (row for row in self._state.rows.values() if _matches(row, filter)),
            key=_order,
            reverse=True,
        )
        if filter.after is not None:
            cursor = parse_cursor(filter.after, which="after")
            page = [row for row in rows if _order(row) < cursor][:limit]
        elif filter.before is not None:
            cursor = parse_cursor(filter.before, which="before")
            page = [row for row in rows if _order(row) > cursor][-limit:]
        else:
            page = rows[:limit]
        return JobPage(rows=[row.public() for row in page], limit=limit)

    async def get(self, job_id: str) -> JobDetail | None:
        row = self._state.rows.get(job_id)
        if row is None:
            return None
        steps = sorted(self._state.steps.get(row.run_id, {}).values(), key=lambda s: s.seq)
        return JobDetail(row=row.public(), steps=[copied_step(step) for step in steps])

    # -- one row -----------------------------------------------------------------------------

    def _row(self, job_id: str) -> Row:
        row = self._state.rows.get(job_id)
        if row is None:
            raise refusals.job_not_found(job_id)
        return row

    async def remove(self, job_id: str) -> bool:
        row = self._state.rows.get(job_id)
        if row is None:
            return False
        if row.state is JobState.RUNNING:
            raise refusals.running_not_removable(job_id)
        self._state.delete(row)
        return True

    async def requeue(self, job_id: str, *, from_step: str | None = None) -> JobRow:
        row = self._row(job_id)
        if row.state not in REQUEUEABLE_STATES:
            raise refusals.not_requeueable(job_id, row.state.value)
        holder = self._state.live.get(row.live_key)
        if holder is not None:
            raise refusals.key_held(job_id, holder)
        if from_step is not None:
            steps = self._state.steps.get(row.run_id, {})
            cut = steps.get(from_step)
            if cut is None:
                raise refusals.step_not_found(job_id, from_step)
            for name in [name for name, step in steps.items() if step.seq >= cut.seq]:
                del steps[name]
        self._ready(row)
        signal_enqueued(row.queue)
        return row.public()

    def _ready(self, row: Row) -> None:
        """Back in its queue from scratch: due now, or, a row cancelled while it ran, once that
        run's lease is over (by then its worker has stopped it, or lost it)."""
        now = self._state.now()
        row.attempt = 0
        row.run_at = max(now, row.lease_until or now)
        row.last_error = None
        row.progress = None
        self._state.move(row, JobState.READY)
        row.finished_at = None

    async def cancel(self, job_id: str, reason: str | None = None) -> JobRow | None:
        row = self._state.rows.get(job_id)
        if row is None or row.state not in LIVE_STATES:
            return None
        row.last_error = refusals.cancel_note(reason)
        stops_by = row.lease_until if row.state is JobState.RUNNING else None
        self._state.move(row, JobState.CANCELLED)
        row.lease_until = stops_by  # the cancelled run stops by then: a requeue waits for it
        return row.public()

    async def promote(self, job_id: str) -> JobRow:
        row = self._row(job_id)
        if row.state not in PROMOTABLE_STATES or row.run_at <= self._state.now():
            raise refusals.not_promotable(job_id, row.state.value)
        row.run_at = self._state.now()
        self._state.move(row, JobState.READY)
        signal_enqueued(row.queue)
        return row.public()

    # -- many rows ---------------------------------------------------------------------------

    def _selected(self, filter: BulkFilter) -> builtins.list[Row]:
        return sorted(
            (
                row
                for row in self._state.rows.values()
                if row.state is filter.state
                and (filter.queue is None or row.queue == filter.queue)
                and (filter.name is None or row.name == filter.name)
                and (filter.tenant_id is None or row.tenant_id == filter.tenant_id)
            ),
            key=_order,
        )

    async def requeue_many(self, filter: BulkFilter) -> BulkResult:
        refusals.check_requeue_many(filter)
        moved: builtins.list[Row] = []
        for row in self._selected(filter):
            if len(moved) == MAX_BULK_ROWS:
                break
            if row.live_key in self._state.live:
                continue
            self._ready(row)
            moved.append(row)
        _announce(moved)
        free_keys = {
            row.live_key for row in self._selected(filter) if row.live_key not in self._state.live
        }
        return BulkResult(affected=len(moved), remaining=len(free_keys))

    async def remove_many(self, filter: BulkFilter) -> BulkResult:
        refusals.check_remove_many(filter)
        rows = self._selected(filter)
        for row in rows[:MAX_BULK_ROWS]:
            self._state.delete(row)
        return BulkResult(
            affected=min(len(rows), MAX_BULK_ROWS), remaining=max(0, len(rows) - MAX_BULK_ROWS)
        )

    async def promote_many(self, filter: BulkFilter) -> BulkResult:
        refusals.check_promote_many(filter)
        now = self._state.now()
        waiting = [row for row in self._selected(filter) if row.run_at > now]
        for row in waiting[:MAX_BULK_ROWS]:
            row.run_at = now
            self._state.move(row, JobState.READY)
        _announce(waiting[:MAX_BULK_ROWS])
        return BulkResult(
            affected=min(len(waiting), MAX_BULK_ROWS),
            remaining=max(0, len(waiting) - MAX_BULK_ROWS),
        )

    # -- pauses --------------------------------------------------------------------------------

    async def pause_queue(self, queue: str) -> None:
        self._state.paused_queues.add(queue)

    async def resume_queue(self, queue: str) -> None:
        self._state.paused_queues.discard(queue)
        signal_enqueued(queue)

    async def paused_queues(self) -> builtins.list[str]:
        return sorted(self._state.paused_queues)

    async def pause_task(self, task: str) -> None:
        self._state.paused_tasks.add(task)

    async def resume_task(self, task: str) -> None:
        self._state.paused_tasks.discard(task)

    async def paused_tasks(self) -> builtins.list[str]:
        return sorted(self._state.paused_tasks)

    # -- workers, progress, counters, task fires ----------------------------------------------

    async def workers(self) -> builtins.list[WorkerInfo]:
        now = self._state.now()
        for worker_id, (_, expires) in list(self._state.workers.items()):
            if expires <= now:
                del self._state.workers[worker_id]
        return sorted((info for info, _ in self._state.workers.values()), key=lambda w: w.id)

    async def record_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        expires = self._state.now() + timedelta(seconds=ttl)
        self._state.workers[info.id] = (info, expires)

    async def remove_worker(self, worker_id: str) -> None:
        self._state.workers.pop(worker_id, None)

    async def record_progress(self, job_id: str, ref: ClaimRef, progress: Progress) -> bool:
        row = self._state.rows.get(job_id)
        if row is None or not row.owned_by(ref.worker_id, ref.claim):
            return False
        row.progress = progress
        return True

    async def counters(self, job: str, *, since: datetime) -> builtins.list[CounterBucket]:
        return sorted(
            (
                bucket
                for bucket in self._state.counters.values()
                if bucket.name == job and bucket.start + timedelta(seconds=bucket.width_s) > since
            ),
            key=lambda b: (b.start, b.width_s),
        )

    async def counter_totals(self, *, since: datetime) -> builtins.list[CounterTotals]:
        totals: dict[str, CounterTotals] = {}
        for bucket in self._state.counters.values():
            if bucket.start + timedelta(seconds=bucket.width_s) <= since:
                continue
            held = totals.get(bucket.name) or CounterTotals(name=bucket.name)
            totals[bucket.name] = held.merged(bucket)
        return sorted(totals.values(), key=lambda t: t.name)

    async def rollup_counters(self) -> None:
        folded = rollup(self._state.counters.values(), self._state.now())
        self._state.counters = {(b.name, b.start, b.width_s): b for b in folded}

    async def task_fires(self) -> builtins.list[TaskFire]:
        return sorted(self._state.task_fires.values(), key=lambda f: f.task)[:MAX_TASK_FIRES]

    async def record_task_fire(self, task: str, occurrence_ms: int) -> None:
        held = self._state.task_fires.get(task)
        if held is None or held.occurrence_ms <= occurrence_ms:
            self._state.task_fires[task] = TaskFire(task, occurrence_ms, self._state.now())


def _order(row: Row) -> tuple[datetime, str]:
    return (row.created_at, row.id)


def _matches(row: Row, filter: JobFilter) -> bool:
    checks: Iterable[Callable[[], bool]] = (
        lambda: filter.queue is None or row.queue == filter.queue,
        lambda: filter.name is None or row.name == filter.name,
        lambda: filter.state is None or row.state is filter.state,
        lambda: filter.tenant_id is None or row.tenant_id == filter.tenant_id,
        lambda: filter.id_prefix is None or row.id.startswith(filter.id_prefix),
        lambda: filter.created_from is None or row.created_at >= filter.created_from,
        lambda: filter.created_to is None or row.created_at < filter.created_to,
    )
    return all(check() for check in checks)


def _announce(rows: Iterable[Row]) -> None:
    """Each queue of ``rows`` announced once."""
    for queue in sorted({row.queue for row in rows}):
        signal_enqueued(queue)
