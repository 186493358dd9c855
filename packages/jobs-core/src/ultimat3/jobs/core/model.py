"""The records that cross the driver boundary.

Plain frozen dataclasses, shared by every driver, the worker and the operator surface. Times are
aware UTC datetimes; payloads are JSON values (``JsonValue``) exactly as a driver stores them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, Self, TypeAlias

from .constants import MAX_WORKER_IN_FLIGHT
from .errors import InvariantError

__all__ = [
    "COUNTER_KINDS",
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "LIVE_STATES",
    "PROMOTABLE_STATES",
    "REQUEUEABLE_STATES",
    "STEP_KINDS",
    "AckOptions",
    "BackfillRow",
    "BulkFilter",
    "BulkResult",
    "ClaimRef",
    "ClaimedJob",
    "CounterBucket",
    "CounterKind",
    "CounterTotals",
    "Counts",
    "EnqueueRequest",
    "Enqueued",
    "EventRecord",
    "ExhaustedJob",
    "JobDetail",
    "JobFilter",
    "JobPage",
    "JobRow",
    "JobState",
    "JsonValue",
    "NackOptions",
    "OutboxRecord",
    "Progress",
    "QueueStats",
    "StepKind",
    "StepRecord",
    "TaskFire",
    "WorkerInfo",
    "claim_of",
    "job_state",
    "stored_step_kind",
    "without_done",
]

JsonValue: TypeAlias = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged: None, bool, int, float, str,
lists and string-keyed dicts of those."""

LEASE_LAPSED_FINAL_ATTEMPT = "LEASE_LAPSED_FINAL_ATTEMPT"
"""``last_error`` of a row the claim buried: its lease lapsed on its final attempt."""


class JobState(StrEnum):
    READY = "ready"
    DELAYED = "delayed"
    RUNNING = "running"
    SUSPENDED = "suspended"
    DONE = "done"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"


def job_state(value: JobState | str) -> JobState:
    """``value`` as a member: a filter built from a CLI argument or JSON names its state as a
    string, and every driver compares members."""
    try:
        return JobState(value)
    except ValueError:
        raise InvariantError(
            f"state={value!r} is not a job state; use one of {', '.join(JobState)}",
            meta={"field": "state", "value": str(value)[:80]},
        ) from None


LIVE_STATES = frozenset({JobState.READY, JobState.DELAYED, JobState.RUNNING, JobState.SUSPENDED})
"""The states the live-key index covers: one row per (name, tenant, idempotency key) among them."""
REQUEUEABLE_STATES = frozenset({JobState.DONE, JobState.FAILED, JobState.DEAD, JobState.CANCELLED})
PROMOTABLE_STATES = frozenset({JobState.DELAYED, JobState.READY})

CounterKind: TypeAlias = Literal["done", "retried", "failed", "dead"]
COUNTER_KINDS: tuple[CounterKind, ...] = ("done", "retried", "failed", "dead")

StepKind: TypeAlias = Literal["run", "sleep", "wait"]
"""Which call wrote a step: ``step.run``, ``step.sleep`` or ``step.wait_for_event``."""
STEP_KINDS: tuple[StepKind, ...] = ("run", "sleep", "wait")


def stored_step_kind(stored: str | None) -> StepKind | None:
    """The kind a driver read back as text; None when the text names none (a record stored
    before steps carried their kind)."""
    return next((kind for kind in STEP_KINDS if kind == stored), None)


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """One job to insert. Every field is decided by the enqueuer, the ids and ``run_at`` too."""

    id: str
    run_id: str
    name: str
    queue: str
    input: JsonValue
    idempotency_key: str
    tenant_id: str | None
    max_attempts: int
    run_at: datetime
    enqueued_by: str | None = None
    traceparent: str | None = None


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The job's own ids. ``deduped``: nothing was inserted; the ids name the row that was there
    (a live row holding the key, or the row already under this id)."""

    id: str
    run_id: str
    deduped: bool = False


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What fences every write after a claim: the claiming worker and this claim's token."""

    worker_id: str
    claim: str


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a run. ``completed=False`` marks a wait still open (its output holds when the
    wait began); ``seq`` is the order steps started in, which ``requeue(from_step=)`` cuts by.
    ``kind`` lets a replay refuse a record another kind of step wrote under the same name; it is
    None on records stored before steps carried it, which any kind replays."""

    name: str
    seq: int
    output: JsonValue
    completed: bool = True
    kind: StepKind | None = None


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A row handed to one worker. ``attempt`` is this claim's number (1 for the first claim)."""

    id: str
    run_id: str
    name: str
    queue: str
    input: JsonValue
    idempotency_key: str
    tenant_id: str | None
    attempt: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    lease_until: datetime
    claim: ClaimRef
    steps: Mapping[str, StepRecord] = field(default_factory=dict)
    enqueued_by: str | None = None
    traceparent: str | None = None


def claim_of(job: ClaimedJob) -> ClaimRef:
    """The ``{worker_id, claim}`` that fences every write about ``job``."""
    return job.claim


@dataclass(frozen=True, slots=True)
class ExhaustedJob:
    """A row the claim buried because its lease lapsed on its final attempt."""

    id: str
    run_id: str
    name: str
    queue: str
    input: JsonValue
    tenant_id: str | None
    attempt: int
    max_attempts: int
    state: JobState  # DEAD, or FAILED when the claimant named the job in ``drop_exhausted``


@dataclass(frozen=True, slots=True)
class AckOptions:
    worker_id: str
    claim: str
    duration_ms: int | None = None

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.worker_id, self.claim)


@dataclass(frozen=True, slots=True)
class NackOptions:
    """How a claimed attempt ends without completing. ``nack_state()`` reads the target state.

    - ``dead_letter``: dead, kept for an operator;
    - ``fail``: failed, terminal and out of the dead-letter queue;
    - ``park``: suspended until ``run_at`` (a sleep, a wait for an event);
    - otherwise ready again at ``run_at`` (``None``: now).

    ``count_attempt=False`` hands the attempt back: the row's attempt number returns to what it
    was before this claim (a suspension, a drain, a busy key under ``when_busy='wait'``).
    """

    worker_id: str
    claim: str
    error: str | None = None
    run_at: datetime | None = None
    dead_letter: bool = False
    fail: bool = False
    park: bool = False
    count_attempt: bool = True
    duration_ms: int | None = None

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.worker_id, self.claim)


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    ready: int = 0
    delayed: int = 0
    running: int = 0
    suspended: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0
    oldest_ready_at: datetime | None = None
    """``run_at`` of the oldest row that is due and waiting (ready or delayed, run_at <= now)."""

    @property
    def depth(self) -> int:
        """Work waiting to run: ready + delayed + suspended."""
        return self.ready + self.delayed + self.suspended

    @classmethod
    def from_counts(
        cls, queue: str, counts: Mapping[str, int], oldest_ready_at: datetime | None = None
    ) -> QueueStats:
        """Stats from a per-state count (state value -> rows); absent states count zero."""
        return cls(
            queue=queue,
            ready=counts.get("ready", 0),
            delayed=counts.get("delayed", 0),
            running=counts.get("running", 0),
            suspended=counts.get("suspended", 0),
            done=counts.get("done", 0),
            failed=counts.get("failed", 0),
            dead=counts.get("dead", 0),
            cancelled=counts.get("cancelled", 0),
            oldest_ready_at=oldest_ready_at,
        )


def without_done(entries: Iterable[QueueStats]) -> list[QueueStats]:
    """``entries`` as ``stats(include_done=False)`` answers them: ``done`` counted 0, and a
    queue that holds nothing else left out."""
    return [
        replace(entry, done=0)
        for entry in entries
        if entry.depth + entry.running + entry.failed + entry.dead + entry.cancelled
    ]


@dataclass(frozen=True, slots=True)
class Progress:
    done: float
    total: float | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as the operator surface sees it."""

    id: str
    run_id: str
    name: str
    queue: str
    state: JobState
    input: JsonValue
    idempotency_key: str
    tenant_id: str | None
    attempt: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    last_error: str | None = None
    progress: Progress | None = None
    worker_id: str | None = None
    lease_until: datetime | None = None
    enqueued_by: str | None = None
    traceparent: str | None = None


@dataclass(frozen=True, slots=True)
class JobDetail:
    row: JobRow
    steps: Sequence[StepRecord]


@dataclass(frozen=True, slots=True)
class JobFilter:
    """One page of ``list()``: newest first; ``after``/``before`` are cursors (never both)."""

    queue: str | None = None
    name: str | None = None
    state: JobState | None = None
    tenant_id: str | None = None
    id_prefix: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    limit: int | None = None
    after: str | None = None
    before: str | None = None

    def __post_init__(self) -> None:
        if self.state is not None:
            object.__setattr__(self, "state", job_state(self.state))
        for bound in ("created_from", "created_to"):
            value = getattr(self, bound)
            if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
                raise InvariantError(
                    f"{bound} must be an aware datetime (a naive one names no instant), "
                    f"got {value!r}",
                    meta={"field": bound},
                )


@dataclass(frozen=True, slots=True)
class JobPage:
    rows: Sequence[JobRow]
    limit: int

    @property
    def last(self) -> bool:
        """A page shorter than its limit is the last one."""
        return len(self.rows) < self.limit


@dataclass(frozen=True, slots=True)
class BulkFilter:
    state: JobState
    queue: str | None = None
    name: str | None = None
    tenant_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", job_state(self.state))


@dataclass(frozen=True, slots=True)
class BulkResult:
    """``remaining`` is what a second call could still move, so "call until zero" ends."""

    affected: int
    remaining: int


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One live worker as ``workers()`` lists it. ``in_flight`` keeps the first
    ``MAX_WORKER_IN_FLIGHT`` ids it is given: a row of the workers table stays small whatever
    the worker's concurrency, and every driver stores the same bounded list."""

    id: str
    host: str
    started_at: datetime
    queues: Sequence[str]
    slots: Mapping[str, int]
    in_flight: Sequence[str]
    last_heartbeat: datetime

    def __post_init__(self) -> None:
        if len(self.in_flight) > MAX_WORKER_IN_FLIGHT:
            object.__setattr__(self, "in_flight", list(self.in_flight[:MAX_WORKER_IN_FLIGHT]))


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts:
    """Settles counted for one job name: what every counter row carries."""

    done: int = 0
    retried: int = 0
    failed: int = 0
    dead: int = 0
    duration_ms: int = 0

    def added(self, kind: CounterKind, duration_ms: int | None = None) -> Self:
        """These counts with one more ``kind`` settle (and its duration)."""
        return replace(
            self,
            done=self.done + (kind == "done"),
            retried=self.retried + (kind == "retried"),
            failed=self.failed + (kind == "failed"),
            dead=self.dead + (kind == "dead"),
            duration_ms=self.duration_ms + (duration_ms or 0),
        )

    def merged(self, other: Counts) -> Self:
        """These counts plus ``other``'s."""
        return replace(
            self,
            done=self.done + other.done,
            retried=self.retried + other.retried,
            failed=self.failed + other.failed,
            dead=self.dead + other.dead,
            duration_ms=self.duration_ms + other.duration_ms,
        )


@dataclass(frozen=True, slots=True)
class CounterBucket(Counts):
    """One bucket of per-job history; ``width_s`` is 60, 300 or 3600 (the tier)."""

    name: str
    start: datetime
    width_s: int


@dataclass(frozen=True, slots=True)
class CounterTotals(Counts):
    name: str


@dataclass(frozen=True, slots=True)
class TaskFire:
    """The last occurrence of a task that dispatched."""

    task: str
    occurrence_ms: int
    fired_at: datetime


@dataclass(frozen=True, slots=True)
class EventRecord:
    id: str
    event: str
    payload: JsonValue
    published_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """A staged enqueue; its ``request.id`` is the job id the publish inserts under."""

    request: EnqueueRequest
    staged_at: datetime
    claimed_by: str | None = None
    claimed_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class BackfillRow:
    """One pass of a backfill, as the ledger reports it."""

    name: str
    run_id: str
    checksum: str
    status: Literal["running", "completed", "failed"]
    started_at: datetime
    rows: int = 0
    cursor: JsonValue = None
    app_version: str | None = None
    completed_at: datetime | None = None
    error: str | None = None
