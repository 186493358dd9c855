"""The operator surface on Postgres: ``JobIntrospection`` over the driver's tables.

The same answers and the same errors as the memory driver's, one statement per call — except
``get`` (the row, then its run's steps) and the counter rollup, which reads, folds in Python with
the core's ``rollup``, and writes back, in one transaction.
"""

from __future__ import annotations

import builtins
from datetime import datetime, timedelta
from typing import Any

import psycopg

from ultimat3.jobs.core import refusals
from ultimat3.jobs.core.clock import Clock
from ultimat3.jobs.core.constants import COUNTER_TIERS, MAX_BULK_ROWS, MAX_TASK_FIRES
from ultimat3.jobs.core.counters import rollup
from ultimat3.jobs.core.cursor import page_limit, parse_cursor
from ultimat3.jobs.core.jsonvalue import json_text
from ultimat3.jobs.core.model import (
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

from .executor import PgExecutor, on_the_wire
from .rows import job_row, progress_json, step_record, utc
from .sql_counters import (
    SQL_COUNTER_TOTALS,
    SQL_COUNTERS,
    SQL_COUNTERS_DUE_FOR_ROLLUP,
    SQL_COUNTERS_FOLD,
)
from .sql_operator import (
    SQL_JOB_CANCEL,
    SQL_JOB_PROMOTE,
    SQL_JOB_REMOVE,
    SQL_JOB_REQUEUE,
    SQL_PROMOTE_MANY,
    SQL_REMOVE_MANY,
    SQL_REQUEUE_MANY,
    SQL_RUN_STEPS_SWEEP,
)
from .sql_pauses import (
    SQL_PAUSE_QUEUE,
    SQL_PAUSE_TASK,
    SQL_PAUSED_QUEUES,
    SQL_PAUSED_TASKS,
    SQL_RESUME_QUEUE,
    SQL_RESUME_TASK,
)
from .sql_read import SQL_JOB_GET, SQL_JOB_LIST, SQL_JOB_LIST_BEFORE, SQL_JOB_STEPS
from .sql_settle import SQL_RECORD_PROGRESS
from .sql_tasks import SQL_RECORD_TASK_FIRE, SQL_TASK_FIRES
from .sql_workers import SQL_RECORD_WORKER, SQL_REMOVE_WORKER, SQL_WORKERS

__all__ = ["PostgresIntrospection"]

_BULK_RETRIES = 5


def _unstorable(*texts: str | None) -> bool:
    """Whether a text holds NUL, which no Postgres text column can: an id or filter holding one
    names no row (the other drivers find none), where sending it would raise a driver error."""
    return any(text is not None and "\x00" in text for text in texts)


class PostgresIntrospection:
    def __init__(self, executor: PgExecutor, clock: Clock) -> None:
        self._executor = executor
        self._clock = clock

    def __repr__(self) -> str:
        return f"PostgresIntrospection({self._executor!r})"

    # -- reading ---------------------------------------------------------------------------

    async def list(self, filter: JobFilter) -> JobPage:
        limit = page_limit(filter)
        before = None if filter.before is None else parse_cursor(filter.before, which="before")
        after = None if filter.after is None else parse_cursor(filter.after, which="after")
        if _unstorable(filter.queue, filter.name, filter.tenant_id, filter.id_prefix):
            return JobPage(rows=[], limit=limit)  # no row holds it (the cursors were checked)
        params: dict[str, Any] = {
            "queue": filter.queue,
            "name": filter.name,
            "state": None if filter.state is None else filter.state.value,
            "tenant_id": filter.tenant_id,
            "id_prefix": filter.id_prefix,
            "created_from": filter.created_from,
            "created_to": filter.created_to,
            "page": limit,
        }
        if before is not None:
            params["before_at"], params["before_id"] = before
            rows = await self._executor.fetch_dicts(SQL_JOB_LIST_BEFORE, params, idempotent=True)
            rows.reverse()
        else:
            params["after_at"], params["after_id"] = (None, None) if after is None else after
            rows = await self._executor.fetch_dicts(SQL_JOB_LIST, params, idempotent=True)
        return JobPage(rows=[job_row(row) for row in rows], limit=limit)

    async def get(self, job_id: str) -> JobDetail | None:
        if _unstorable(job_id):
            return None
        rows = await self._executor.fetch_dicts(SQL_JOB_GET, {"id": job_id}, idempotent=True)
        if not rows:
            return None
        row = job_row(rows[0])
        steps = await self._executor.fetch(SQL_JOB_STEPS, {"run_id": row.run_id}, idempotent=True)
        return JobDetail(row=row, steps=[step_record(*step) for step in steps])

    # -- one row ---------------------------------------------------------------------------

    async def remove(self, job_id: str) -> bool:
        if _unstorable(job_id):
            return False
        rows = await self._executor.fetch(SQL_JOB_REMOVE, {"id": job_id})
        if not rows:
            return False
        state, shared_run = rows[0]
        if state == JobState.RUNNING:
            raise refusals.running_not_removable(job_id)
        if shared_run is not None:
            await self._sweep_steps([shared_run])
        return True

    async def _sweep_steps(self, run_ids: builtins.list[str]) -> None:
        """The steps of runs a remove left to another row, deleted if no row names them now."""
        await self._executor.fetch(SQL_RUN_STEPS_SWEEP, {"run_ids": run_ids}, idempotent=True)

    async def requeue(self, job_id: str, *, from_step: str | None = None) -> JobRow:
        if _unstorable(job_id):
            raise refusals.job_not_found(job_id)
        if _unstorable(from_step):
            raise refusals.step_not_found(job_id, from_step)
        params = {"id": job_id, "from_step": from_step, "now": self._clock.now()}
        try:
            rows = await self._executor.fetch_dicts(SQL_JOB_REQUEUE, params)
        except psycopg.errors.UniqueViolation as exc:
            raise refusals.key_held(job_id, None) from exc
        answer = rows[0]
        state = answer["found_state"]
        if state is None:
            raise refusals.job_not_found(job_id)
        if JobState(state) not in REQUEUEABLE_STATES:
            raise refusals.not_requeueable(job_id, state)
        if answer["holder_id"] is not None:
            raise refusals.key_held(job_id, answer["holder_id"])
        if answer["id"] is None:
            raise refusals.step_not_found(job_id, from_step)
        return job_row(answer)

    async def cancel(self, job_id: str, reason: str | None = None) -> JobRow | None:
        if _unstorable(job_id):
            return None
        params = {"id": job_id, "error": refusals.cancel_note(reason), "now": self._clock.now()}
        rows = await self._executor.fetch_dicts(SQL_JOB_CANCEL, params)
        return job_row(rows[0]) if rows else None

    async def promote(self, job_id: str) -> JobRow:
        if _unstorable(job_id):
            raise refusals.job_not_found(job_id)
        rows = await self._executor.fetch_dicts(
            SQL_JOB_PROMOTE, {"id": job_id, "now": self._clock.now()}
        )
        answer = rows[0]
        if answer["found_state"] is None:
            raise refusals.job_not_found(job_id)
        if answer["id"] is None:
            raise refusals.not_promotable(job_id, answer["found_state"])
        return job_row(answer)

    # -- many rows -------------------------------------------------------------------------

    async def requeue_many(self, filter: BulkFilter) -> BulkResult:
        refusals.check_requeue_many(filter)
        if _unstorable(filter.queue, filter.name, filter.tenant_id):
            return BulkResult(affected=0, remaining=0)
        params = {**_bulk_params(filter), "now": self._clock.now()}
        for _ in range(_BULK_RETRIES):
            try:
                rows = await self._executor.fetch(SQL_REQUEUE_MANY, params)
            except psycopg.errors.UniqueViolation:
                continue  # an enqueue took one of the keys meanwhile: choose again
            affected, remaining, _ = rows[0]
            return BulkResult(affected=affected, remaining=remaining)
        raise refusals.key_held("(bulk)", None)

    async def remove_many(self, filter: BulkFilter) -> BulkResult:
        refusals.check_remove_many(filter)
        if _unstorable(filter.queue, filter.name, filter.tenant_id):
            return BulkResult(affected=0, remaining=0)
        rows = await self._executor.fetch(SQL_REMOVE_MANY, _bulk_params(filter))
        affected, remaining, shared_runs = rows[0]
        if shared_runs:
            await self._sweep_steps(shared_runs)
        return BulkResult(affected=affected, remaining=remaining)

    async def promote_many(self, filter: BulkFilter) -> BulkResult:
        refusals.check_promote_many(filter)
        if _unstorable(filter.queue, filter.name, filter.tenant_id):
            return BulkResult(affected=0, remaining=0)
        params = {**_bulk_params(filter), "now": self._clock.now()}
        rows = await self._executor.fetch(SQL_PROMOTE_MANY, params)
        affected, remaining, _ = rows[0]
        return BulkResult(affected=affected, remaining=remaining)

    # -- pauses ----------------------------------------------------------------------------

    async def pause_queue(self, queue: str) -> None:
        await self._executor.fetch(
            SQL_PAUSE_QUEUE, {"queue": queue, "now": self._clock.now()}, idempotent=True
        )

    async def resume_queue(self, queue: str) -> None:
        await self._executor.fetch(SQL_RESUME_QUEUE, {"queue": queue}, idempotent=True)

    async def paused_queues(self) -> builtins.list[str]:
        return [row[0] for row in await self._executor.fetch(SQL_PAUSED_QUEUES, idempotent=True)]

    async def pause_task(self, task: str) -> None:
        await self._executor.fetch(
            SQL_PAUSE_TASK, {"task": task, "now": self._clock.now()}, idempotent=True
        )

    async def resume_task(self, task: str) -> None:
        await self._executor.fetch(SQL_RESUME_TASK, {"task": task}, idempotent=True)

    async def paused_tasks(self) -> builtins.list[str]:
        return [row[0] for row in await self._executor.fetch(SQL_PAUSED_TASKS, idempotent=True)]

    # -- workers, progress, counters, task fires ------------------------------------------

    async def workers(self) -> builtins.list[WorkerInfo]:
        rows = await self._executor.fetch(SQL_WORKERS, {"now": self._clock.now()}, idempotent=True)
        return [
            WorkerInfo(
                id=worker_id,
                host=host,
                started_at=utc(started_at),
                queues=tuple(queues),
                slots=dict(slots),
                in_flight=tuple(in_flight),
                last_heartbeat=utc(last_heartbeat),
            )
            for worker_id, host, started_at, queues, slots, in_flight, last_heartbeat in rows
        ]

    async def record_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        await self._executor.fetch(
            SQL_RECORD_WORKER,
            {
                "id": info.id,
                "host": info.host,
                "started_at": info.started_at,
                "queues": list(info.queues),
                "slots": json_text(dict(info.slots)),
                "in_flight": list(info.in_flight),
                "last_heartbeat": info.last_heartbeat,
                "expires_at": self._clock.now() + timedelta(seconds=ttl),
            },
            idempotent=True,
            relaxed_commit=True,
        )

    async def remove_worker(self, worker_id: str) -> None:
        await self._executor.fetch(SQL_REMOVE_WORKER, {"id": worker_id}, idempotent=True)

    async def record_progress(self, job_id: str, ref: ClaimRef, progress: Progress) -> bool:
        rows = await self._executor.fetch(
            SQL_RECORD_PROGRESS,
            {
                "id": job_id,
                "worker_id": ref.worker_id,
                "claim": ref.claim,
                "progress": progress_json(progress),
            },
            idempotent=True,
            relaxed_commit=True,
        )
        return bool(rows)

    async def counters(self, job: str, *, since: datetime) -> builtins.list[CounterBucket]:
        rows = await self._executor.fetch(
            SQL_COUNTERS, {"name": job, "since": since}, idempotent=True
        )
        return [_bucket(row) for row in rows]

    async def counter_totals(self, *, since: datetime) -> builtins.list[CounterTotals]:
        rows = await self._executor.fetch(SQL_COUNTER_TOTALS, {"since": since}, idempotent=True)
        return [
            CounterTotals(
                name=name, done=done, retried=retried, failed=failed, dead=dead, duration_ms=ms
            )
            for name, done, retried, failed, dead, ms in rows
        ]

    async def rollup_counters(self) -> None:
        now = self._clock.now()

        async def fold(conn: psycopg.AsyncConnection[Any]) -> None:
            cursor = await conn.execute(
                on_the_wire(SQL_COUNTERS_DUE_FOR_ROLLUP),
                {
                    "widths": [width for width, _ in COUNTER_TIERS],
                    "retentions": [retention for _, retention in COUNTER_TIERS],
                    "now": now,
                },
            )
            due = [_bucket(row) for row in await cursor.fetchall()]
            if not due:
                return
            folded = rollup(due, now)
            await conn.execute(
                on_the_wire(SQL_COUNTERS_FOLD),
                {
                    "gone_names": [b.name for b in due],
                    "gone_starts": [b.start for b in due],
                    "gone_widths": [b.width_s for b in due],
                    "names": [b.name for b in folded],
                    "starts": [b.start for b in folded],
                    "widths": [b.width_s for b in folded],
                    "done": [b.done for b in folded],
                    "retried": [b.retried for b in folded],
                    "failed": [b.failed for b in folded],
                    "dead": [b.dead for b in folded],
                    "durations": [b.duration_ms for b in folded],
                },
            )

        # Idempotent: run again, it reads the due buckets again, and a fold that committed left
        # none of them.
        await self._executor.transact(fold, idempotent=True)

    async def task_fires(self) -> builtins.list[TaskFire]:
        rows = await self._executor.fetch(
            SQL_TASK_FIRES, {"max_rows": MAX_TASK_FIRES}, idempotent=True
        )
        return [TaskFire(task, occurrence, utc(fired_at)) for task, occurrence, fired_at in rows]

    async def record_task_fire(self, task: str, occurrence_ms: int) -> None:
        await self._executor.fetch(
            SQL_RECORD_TASK_FIRE,
            {"task": task, "occurrence_ms": occurrence_ms, "now": self._clock.now()},
            idempotent=True,
        )


def _bulk_params(filter: BulkFilter) -> dict[str, Any]:
    return {
        "state": filter.state.value,
        "queue": filter.queue,
        "name": filter.name,
        "tenant_id": filter.tenant_id,
        "max_rows": MAX_BULK_ROWS,
    }


def _bucket(row: tuple[Any, ...]) -> CounterBucket:
    name, start, width_s, done, retried, failed, dead, duration_ms = row
    return CounterBucket(
        name=name,
        start=utc(start),
        width_s=width_s,
        done=done,
        retried=retried,
        failed=failed,
        dead=dead,
        duration_ms=duration_ms,
    )
