"""The rows of the memory driver: one heap, plain dicts, no cleverness.

The memory driver is the executable specification the conformance model is checked against, so
everything here is written to be obviously right rather than fast — with one exception kept just
as plain: the live rows of each queue are indexed, so a claim reads those and not every finished
row a long-running process has piled up (which made each claim slower than the last).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ..clock import Clock
from ..constants import COUNTER_TIERS
from ..counters import bucket_start
from ..model import (
    LIVE_STATES,
    CounterBucket,
    CounterKind,
    JobRow,
    JobState,
    JsonValue,
    Progress,
    StepRecord,
    TaskFire,
    WorkerInfo,
)

__all__ = ["MemoryState", "Row"]


@dataclass
class Row:
    id: str
    run_id: str
    name: str
    queue: str
    input: JsonValue
    idempotency_key: str
    tenant_id: str | None
    state: JobState
    attempt: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    last_error: str | None = None
    progress: Progress | None = None
    worker_id: str | None = None
    claim: str | None = None
    lease_until: datetime | None = None
    enqueued_by: str | None = None
    traceparent: str | None = None

    @property
    def live_key(self) -> tuple[str, str, str]:
        return (self.name, self.tenant_id or "", self.idempotency_key)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def owned_by(self, worker_id: str, claim: str) -> bool:
        return (
            self.state is JobState.RUNNING and self.worker_id == worker_id and self.claim == claim
        )

    def public(self) -> JobRow:
        return JobRow(
            id=self.id,
            run_id=self.run_id,
            name=self.name,
            queue=self.queue,
            state=self.state,
            input=self.input,
            idempotency_key=self.idempotency_key,
            tenant_id=self.tenant_id,
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            run_at=self.run_at,
            created_at=self.created_at,
            updated_at=self.updated_at,
            finished_at=self.finished_at,
            last_error=self.last_error,
            progress=self.progress,
            worker_id=self.worker_id,
            lease_until=self.lease_until,
            enqueued_by=self.enqueued_by,
            traceparent=self.traceparent,
        )


@dataclass
class MemoryState:
    clock: Clock
    rows: dict[str, Row] = field(default_factory=dict)
    live: dict[tuple[str, str, str], str] = field(default_factory=dict)
    """(name, tenant or '', idempotency key) -> id of the live row holding it."""
    live_in_queue: dict[str, dict[str, Row]] = field(default_factory=dict)
    """queue -> its live rows (ready, delayed, running, suspended) by id: what a claim reads."""
    rows_in_run: dict[str, int] = field(default_factory=dict)
    """run id -> how many rows share it (a run's steps go when its last row does)."""
    steps: dict[str, dict[str, StepRecord]] = field(default_factory=dict)
    counters: dict[tuple[str, datetime, int], CounterBucket] = field(default_factory=dict)
    paused_queues: set[str] = field(default_factory=set)
    paused_tasks: set[str] = field(default_factory=set)
    workers: dict[str, tuple[WorkerInfo, datetime]] = field(default_factory=dict)
    task_fires: dict[str, TaskFire] = field(default_factory=dict)

    def now(self) -> datetime:
        return self.clock.now()

    def add(self, row: Row) -> None:
        """A new row (live: the driver inserts only ready or delayed rows)."""
        self.rows[row.id] = row
        self.rows_in_run[row.run_id] = self.rows_in_run.get(row.run_id, 0) + 1
        self.live[row.live_key] = row.id
        self.live_in_queue.setdefault(row.queue, {})[row.id] = row

    def live_rows(self, queue: str) -> list[Row]:
        return list(self.live_in_queue.get(queue, {}).values())

    def move(self, row: Row, state: JobState) -> None:
        """Change a row's state, keeping the live-key and per-queue indexes true."""
        was_live = row.live
        row.state = state
        row.updated_at = self.now()
        if was_live and not row.live:
            if self.live.get(row.live_key) == row.id:
                del self.live[row.live_key]
            del self.live_in_queue[row.queue][row.id]
        elif row.live and not was_live:
            self.live[row.live_key] = row.id
            self.live_in_queue.setdefault(row.queue, {})[row.id] = row
        if not row.live:
            row.finished_at = row.updated_at
        if state is not JobState.RUNNING:
            row.worker_id = row.claim = row.lease_until = None

    def count(self, name: str, kind: CounterKind, duration_ms: int | None = None) -> None:
        width = COUNTER_TIERS[0][0]
        start = bucket_start(self.now(), width)
        key = (name, start, width)
        bucket = self.counters.get(key) or CounterBucket(name=name, start=start, width_s=width)
        self.counters[key] = bucket.added(kind, duration_ms)

    def delete(self, row: Row) -> None:
        if self.live.get(row.live_key) == row.id:
            del self.live[row.live_key]
        self.live_in_queue.get(row.queue, {}).pop(row.id, None)
        del self.rows[row.id]
        left = self.rows_in_run[row.run_id] - 1
        if left:
            self.rows_in_run[row.run_id] = left
        else:
            del self.rows_in_run[row.run_id]
            self.steps.pop(row.run_id, None)
