"""The rows of the memory driver: plain dicts, no cleverness — with one exception.

The memory driver is the executable specification the conformance model is checked against, so
everything here is written to be obviously right rather than fast. The exception is what a claim
reads. Scanning the live rows of a queue made a claim cost O(backlog): 24 ms for a claim of 50
beside 100,000 waiting rows, so a single process drained a burst at 2,000 jobs/s. A claim now
reads the running rows of its queue (few: bounded by the workers' slots) and the top of a heap
of its waiting rows.
"""

from __future__ import annotations

import heapq
from copy import deepcopy
from dataclasses import dataclass, field, replace
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

__all__ = ["WAITING_STATES", "MemoryState", "Row", "copied_step"]

WAITING_STATES = frozenset({JobState.READY, JobState.DELAYED, JobState.SUSPENDED})
"""The states a claim takes a row from once its run_at is due."""


def copied_step(step: StepRecord) -> StepRecord:
    """``step`` with an output of its own: what goes in or comes out is never the stored value
    (a server stores bytes), so no caller changes what a later attempt replays."""
    return replace(step, output=deepcopy(step.output))


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

    def acked_under(self, claim: str) -> bool:
        """Whether an ack under ``claim`` finished this row: a done row keeps the token of the
        claim whose ack moved it there (the only way in), so an ack sent again can be told
        apart from one under any other claim."""
        return self.state is JobState.DONE and self.claim == claim

    def public(self) -> JobRow:
        return JobRow(
            id=self.id,
            run_id=self.run_id,
            name=self.name,
            queue=self.queue,
            state=self.state,
            input=deepcopy(self.input),
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
    running_in_queue: dict[str, dict[str, Row]] = field(default_factory=dict)
    """queue -> its running rows by id: where a claim looks for leases that lapsed."""
    due_in_queue: dict[str, list[tuple[datetime, str]]] = field(default_factory=dict)
    """queue -> a heap of (run_at, id) holding an entry for each of its waiting rows. An entry
    goes stale when its row leaves the waiting states, is deleted, or waits again under another
    run_at (a new entry is pushed then); ``due_rows`` drops the stale entries it meets."""
    waiting_in_queue: dict[str, int] = field(default_factory=dict)
    """queue -> how many of its rows wait: a heap that grew past twice that is rebuilt."""
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
        self._index(row)

    def move(self, row: Row, state: JobState) -> None:
        """Change a row's state, keeping the live-key and per-queue indexes true. A caller that
        changes ``run_at`` does it BEFORE the move, so the waiting heap gets the new one."""
        was_live = row.live
        self._unindex(row)
        row.state = state
        row.updated_at = self.now()
        self._index(row)
        if was_live and not row.live:
            if self.live.get(row.live_key) == row.id:
                del self.live[row.live_key]
        elif row.live and not was_live:
            self.live[row.live_key] = row.id
        if not row.live:
            row.finished_at = row.updated_at
        if state is not JobState.RUNNING:
            row.worker_id = row.lease_until = None
            if state is not JobState.DONE:
                row.claim = None

    def count(self, name: str, kind: CounterKind, duration_ms: int | None = None) -> None:
        width = COUNTER_TIERS[0][0]
        start = bucket_start(self.now(), width)
        key = (name, start, width)
        bucket = self.counters.get(key) or CounterBucket(name=name, start=start, width_s=width)
        self.counters[key] = bucket.added(kind, duration_ms)

    def delete(self, row: Row) -> None:
        if self.live.get(row.live_key) == row.id:
            del self.live[row.live_key]
        self._unindex(row)
        del self.rows[row.id]
        left = self.rows_in_run[row.run_id] - 1
        if left:
            self.rows_in_run[row.run_id] = left
        else:
            del self.rows_in_run[row.run_id]
            self.steps.pop(row.run_id, None)

    # -- what a claim reads ------------------------------------------------------------------

    def lapsed_rows(self, queue: str, now: datetime) -> list[Row]:
        """The running rows of ``queue`` whose lease ran out by ``now``."""
        return [
            row
            for row in self.running_in_queue.get(queue, {}).values()
            if row.lease_until is not None and row.lease_until <= now
        ]

    def due_rows(self, queue: str, now: datetime, count: int) -> list[Row]:
        """The first ``count`` waiting rows of ``queue`` due by ``now``, in claim order
        (run_at, then id). Their entries stay in the heap: one the claim then takes goes stale
        with its move to running."""
        heap = self.due_in_queue.get(queue)
        if not heap:
            return []
        found: list[Row] = []
        seen: set[str] = set()
        while heap and len(found) < count and heap[0][0] <= now:
            run_at, row_id = heapq.heappop(heap)
            row = self.rows.get(row_id)
            if row is None or row_id in seen or not _waits_under(row, queue, run_at):
                continue  # stale, or a second entry for a row already found
            seen.add(row_id)
            found.append(row)
        for row in found:
            heapq.heappush(heap, (row.run_at, row.id))
        return found

    def _index(self, row: Row) -> None:
        queue = row.queue
        if row.state is JobState.RUNNING:
            self.running_in_queue.setdefault(queue, {})[row.id] = row
        elif row.state in WAITING_STATES:
            waiting = self.waiting_in_queue.get(queue, 0) + 1
            self.waiting_in_queue[queue] = waiting
            heap = self.due_in_queue.setdefault(queue, [])
            heapq.heappush(heap, (row.run_at, row.id))
            if len(heap) > 2 * waiting + 64:
                self._rebuild(queue)

    def _unindex(self, row: Row) -> None:
        queue = row.queue
        if row.state is JobState.RUNNING:
            del self.running_in_queue[queue][row.id]
        elif row.state in WAITING_STATES:
            self.waiting_in_queue[queue] -= 1

    def _rebuild(self, queue: str) -> None:
        """The heap of ``queue`` with its stale entries gone: one entry per waiting row."""
        heap = set()
        for run_at, row_id in self.due_in_queue[queue]:
            row = self.rows.get(row_id)
            if row is not None and _waits_under(row, queue, run_at):
                heap.add((run_at, row_id))
        self.due_in_queue[queue] = list(heap)
        heapq.heapify(self.due_in_queue[queue])


def _waits_under(row: Row, queue: str, run_at: datetime) -> bool:
    """Whether a heap entry (queue, run_at) still stands for ``row``."""
    return row.state in WAITING_STATES and row.run_at == run_at and row.queue == queue
