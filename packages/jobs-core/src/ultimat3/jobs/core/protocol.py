"""The driver protocol: what a backend must do so a job's code never names it.

``JobDriver`` is small and async. Its optional parts (``introspect``, ``leases``, ``backfills``,
``events``) are declared by the driver as attributes — ``None`` when not offered — never inferred
from a backend's name. The conformance suite in ``ultimat3.jobs.testing`` holds every driver to
the rules written here.

Fencing: every write a run makes after its claim (ack, nack, heartbeat, a step, progress) carries
the ``ClaimRef`` of that claim and matches only while the row is ``running`` under exactly that
claim. A miss changes nothing and answers ``False``: a body whose lease lapsed, or whose row was
cancelled, cannot settle, renew or report on the run that replaced it. One exception makes an ack
safe to send again when its answer was lost with a connection: an ack under the claim whose ack
already finished the row answers ``True`` and changes nothing.

Time: a driver reads ``now`` from its ``clock`` for every decision (due rows, lapsed leases, TTLs),
so a frozen clock drives it in tests. ``EnqueueRequest.run_at`` comes from the enqueuer.

Outages: a backend out of reach (refused, timed out, its connection broken) raises
``DriverUnavailableError`` (``X_DRIVER_UNAVAILABLE``) or a subclass of it, so a caller catches an
outage without naming the backend.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar, overload, runtime_checkable

from .clock import Clock
from .model import (
    AckOptions,
    BackfillRow,
    BulkFilter,
    BulkResult,
    ClaimedJob,
    ClaimRef,
    CounterBucket,
    CounterTotals,
    Enqueued,
    EnqueueRequest,
    EventRecord,
    ExhaustedJob,
    JobDetail,
    JobFilter,
    JobPage,
    JobRow,
    JsonValue,
    NackOptions,
    OutboxRecord,
    Progress,
    QueueStats,
    StepRecord,
    TaskFire,
    WorkerInfo,
)

__all__ = [
    "BackfillLedger",
    "ClaimBatch",
    "ClaimedOnRead",
    "EventBus",
    "JobDriver",
    "JobIntrospection",
    "JobsFacade",
    "Leader",
    "LeaseLeader",
    "LeaseStore",
    "OutboxStore",
    "QueueWake",
    "SchedulerState",
]


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    """What one claim call handed out, and what it buried.

    ``exhausted`` lists each row whose lease lapsed on its final attempt and that this call settled
    dead (or failed, for names in ``drop_exhausted``) instead of handing out — once per row, ever.
    """

    jobs: Sequence[ClaimedJob] = ()
    exhausted: Sequence[ExhaustedJob] = field(default_factory=tuple)


RowT = TypeVar("RowT")


class ClaimedOnRead(Sequence[ClaimedJob], Generic[RowT]):
    """A claim's jobs as the backend answered them, decoded by ``decode`` when first read.

    A driver may hand this as ``ClaimBatch.jobs``: counting the jobs decodes nothing, and a worker
    whose batch came back full sends its next claim before it pays for decoding this one."""

    __slots__ = ("_decode", "_jobs", "_rows")

    def __init__(
        self, rows: Sequence[RowT], decode: Callable[[Sequence[RowT]], list[ClaimedJob]]
    ) -> None:
        self._rows = rows
        self._decode = decode
        self._jobs: list[ClaimedJob] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> ClaimedJob: ...
    @overload
    def __getitem__(self, index: slice) -> list[ClaimedJob]: ...
    def __getitem__(self, index: int | slice) -> ClaimedJob | list[ClaimedJob]:
        return self._decoded()[index]

    def __iter__(self) -> Iterator[ClaimedJob]:
        return iter(self._decoded())

    def __repr__(self) -> str:
        return repr(self._decoded())

    def _decoded(self) -> list[ClaimedJob]:
        if self._jobs is None:
            self._jobs = self._decode(self._rows)
        return self._jobs


@runtime_checkable
class JobDriver(Protocol):
    """A queue backend.

    Rules every driver keeps (the conformance suite checks each):

    - ``enqueue`` inserts nothing when a LIVE row (ready, delayed, running, suspended) already holds
      ``(name, tenant_id, idempotency_key)`` — ``tenant_id`` None counts as its own tenant — and
      answers that row's ids with ``deduped=True``. It also inserts nothing when ``request.id``
      already names a row in any state, and answers that row. A new row is ``delayed`` when
      ``run_at`` is after the driver's now, else ``ready``.
    - ``claim`` hands out, per queue in ``slots``, up to that many due rows (ready, delayed or
      suspended with ``run_at <= now``; running rows whose ``lease_until`` passed), oldest
      ``run_at`` first and ties in id order, skipping paused queues; each becomes ``running`` under
      a claim token that row has never held (one token may serve a whole batch) with
      ``lease_until = now + visibility_timeout`` and its attempt number raised by one. A lapsed
      running row already at ``attempt >= max_attempts`` is never handed out: it is settled dead
      (failed when its name is in ``drop_exhausted``) with ``last_error =
      LEASE_LAPSED_FINAL_ATTEMPT``, counted, and reported in ``exhausted``. Every such row the
      claim passes on its way to filling the slots is buried (all of them when the queue cannot
      fill the slots); burying ones beyond that is allowed. A driver may bound how many lapsed
      rows one claim examines per queue (the longest-lapsed first; Redis: 5 x (1,000 + free));
      a later claim goes on with the rest.
      A claimed job carries the run's stored steps.
    - ``ack`` moves a running row to ``done``; ``nack`` moves it to ``nack_state(options)``, at
      ``options.run_at``; when ``count_attempt`` is false the attempt number drops back by one.
      Both are fenced on the claim and count into the per-job counters in the same operation
      (``nack_counter``).
    - ``heartbeat`` extends ``lease_until`` to ``now + visibility_timeout``, fenced.
    - ``save_step`` upserts one step of the run, fenced on the claim of the job that runs it.
    """

    @property
    def clock(self) -> Clock: ...

    @property
    def introspect(self) -> JobIntrospection | None: ...

    @property
    def leases(self) -> LeaseStore | None: ...

    @property
    def backfills(self) -> BackfillLedger | None: ...

    @property
    def events(self) -> EventBus | None: ...

    async def enqueue(self, request: EnqueueRequest) -> Enqueued: ...

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> builtins.list[Enqueued]:
        """The same rules as ``enqueue`` for each request, answers in request order."""
        ...

    async def claim(
        self,
        *,
        worker_id: str,
        slots: Mapping[str, int],
        visibility_timeout: float,
        drop_exhausted: Collection[str] = (),
    ) -> ClaimBatch: ...

    async def ack(self, job_id: str, options: AckOptions) -> bool: ...

    async def nack(self, job_id: str, options: NackOptions) -> bool: ...

    async def heartbeat(self, job_id: str, ref: ClaimRef, visibility_timeout: float) -> bool: ...

    async def save_step(
        self, job_id: str, ref: ClaimRef, run_id: str, step: StepRecord
    ) -> bool: ...

    async def stats(self, *, include_done: bool = True) -> builtins.list[QueueStats]:
        """One entry per queue that holds any row.

        ``include_done=False`` is the read a metrics scrape or an autoscaler makes: ``done``
        counts 0, a queue holding nothing but done rows is not listed, and a driver need not
        read its done rows at all (on Postgres they are most of a table that keeps them, and
        reading them made each scrape cost a pass over the table). Every other figure is the
        same as with them (``without_done``)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class JobIntrospection(Protocol):
    """The operator surface: everything ``ujobs jobs …`` and a dashboard read or do.

    Bounds: ``list`` pages at most ``MAX_JOB_PAGE`` rows (default ``DEFAULT_JOB_PAGE``); the bulk
    members move at most ``MAX_BULK_ROWS`` per call. Errors, on every driver alike: a running row is
    ``JobNotRemovableError``; requeue of a live row is ``JobNotRequeueableError``, of a key a live
    row holds ``JobDuplicateError``, of an unknown id ``JobNotFoundError``.
    """

    async def list(self, filter: JobFilter) -> JobPage: ...

    async def get(self, job_id: str) -> JobDetail | None: ...

    async def remove(self, job_id: str) -> bool: ...

    async def requeue(self, job_id: str, *, from_step: str | None = None) -> JobRow: ...

    async def cancel(self, job_id: str, reason: str | None = None) -> JobRow | None:
        """Cancel a LIVE row; a finished one is left as it ended and answers None."""
        ...

    async def requeue_many(self, filter: BulkFilter) -> BulkResult: ...

    async def remove_many(self, filter: BulkFilter) -> BulkResult: ...

    async def promote_many(self, filter: BulkFilter) -> BulkResult: ...

    async def promote(self, job_id: str) -> JobRow: ...

    async def pause_queue(self, queue: str) -> None: ...

    async def resume_queue(self, queue: str) -> None: ...

    async def paused_queues(self) -> builtins.list[str]: ...

    async def pause_task(self, task: str) -> None: ...

    async def resume_task(self, task: str) -> None: ...

    async def paused_tasks(self) -> builtins.list[str]: ...

    async def workers(self) -> builtins.list[WorkerInfo]:
        """Live workers: a row expires ``ttl`` after its last ``record_worker``."""
        ...

    async def record_worker(self, info: WorkerInfo, *, ttl: float) -> None: ...

    async def remove_worker(self, worker_id: str) -> None: ...

    async def counters(self, job: str, *, since: datetime) -> builtins.list[CounterBucket]: ...

    async def counter_totals(self, *, since: datetime) -> builtins.list[CounterTotals]: ...

    async def rollup_counters(self) -> None: ...

    async def record_progress(self, job_id: str, ref: ClaimRef, progress: Progress) -> bool: ...

    async def task_fires(self) -> builtins.list[TaskFire]: ...

    async def record_task_fire(self, task: str, occurrence_ms: int) -> None: ...


@runtime_checkable
class LeaseStore(Protocol):
    """Fleet-wide slots: at most ``limit`` live holders per key, each expiring ``ttl`` after its
    last acquire or renew."""

    async def acquire(self, key: str, holder: str, *, limit: int, ttl: float) -> bool:
        """Take a slot (or renew the one ``holder`` has); False when ``limit`` others hold it."""
        ...

    async def renew(self, key: str, holder: str, *, ttl: float) -> bool: ...

    async def release(self, key: str, holder: str) -> None: ...

    async def holders(self, key: str) -> builtins.list[str]:
        """The live holders of ``key``, in slot order (the order they acquired in)."""
        ...


@runtime_checkable
class BackfillLedger(Protocol):
    """One row per backfill pass: what has already been swept.

    Passes have ONE total order, newest first: by ``started_at``, and among passes with the same
    ``started_at`` (a coarse or frozen clock) by the order their first ``begin`` was recorded,
    the later first. Run ids are no tiebreak (a caller may choose its own); an adopting ``begin``
    keeps a pass's place. ``latest`` and ``list`` both answer in this order."""

    async def begin(
        self, *, name: str, run_id: str, checksum: str, app_version: str | None = None
    ) -> BackfillRow:
        """Open the row for ``run_id``, or adopt it if this run opened it on an earlier attempt
        (``started_at`` kept; a row the last attempt left ``failed`` is ``running`` again, its
        error cleared: the pass is in flight)."""
        ...

    async def checkpoint(self, run_id: str, *, rows: int, cursor: JsonValue) -> None: ...

    async def complete(self, run_id: str, *, rows: int, cursor: JsonValue) -> None: ...

    async def fail(self, run_id: str, error: str) -> None: ...

    async def latest(self, name: str) -> BackfillRow | None:
        """The newest pass under ``name``, in any status: ``list(name=name)[0]``."""
        ...

    async def list(
        self, *, name: str | None = None, status: str | None = None, limit: int = 100
    ) -> builtins.list[BackfillRow]:
        """Up to ``limit`` passes, newest first in the ledger's order."""
        ...


@runtime_checkable
class EventBus(Protocol):
    """Events a ``step.wait_for_event`` can match, on ONE clock: ``now()`` is the clock that
    stamps ``published_at``, so "published after I asked" never depends on a process's skew."""

    async def publish(
        self, event: str, payload: JsonValue, *, ttl: float | None = None
    ) -> EventRecord: ...

    async def lookup(
        self,
        event: str,
        *,
        since: datetime,
        until: datetime | None = None,
        match: Mapping[str, JsonValue] | None = None,
    ) -> EventRecord | None:
        """The earliest unexpired ``event`` published at or after ``since`` (and at or before
        ``until``, when given) whose payload contains ``match`` (JSON containment, as Postgres'
        ``@>``)."""
        ...

    async def now(self) -> datetime: ...

    async def purge_expired(self) -> int: ...


@runtime_checkable
class OutboxStore(Protocol):
    """Staged enqueues waiting for the relay. ``stage`` joins the caller's transaction."""

    async def stage(self, request: EnqueueRequest) -> None: ...

    async def claim(
        self, *, claimant: str, limit: int, lease: float
    ) -> builtins.list[OutboxRecord]:
        """Up to ``limit`` rows no live claim holds (or ``claimant`` holds already: a claim
        repeated after a lost answer gets its batch back), in ``(staged_at, id)`` order, stamped
        with ``claimant`` for ``lease`` seconds in the same operation."""
        ...

    async def release(self, ids: Sequence[str], *, claimant: str) -> int:
        """Hand rows back; only rows ``claimant`` still holds move."""
        ...

    async def mark_published(self, ids: Sequence[str], *, claimant: str) -> int:
        """Retire published rows; only rows ``claimant`` still holds move."""
        ...


@runtime_checkable
class SchedulerState(Protocol):
    """Per-task watermarks: the last occurrence dispatched or passed over.

    ``records_fires``: True when ``fire`` also records the fire in the operator surface's task
    fires (in the same statement), so the scheduler does not write it a second time.
    """

    @property
    def records_fires(self) -> bool: ...

    async def watermarks(self, tasks: Sequence[str]) -> dict[str, int]: ...

    async def arm(self, task: str, occurrence_ms: int) -> None:
        """Move the watermark forward without firing (arming, skipped occurrences)."""
        ...

    async def fire(
        self,
        task: str,
        occurrence_ms: int,
        requests: Sequence[EnqueueRequest],
        *,
        previous: int | None,
        fired_ms: int | None = None,
    ) -> builtins.list[Enqueued] | None:
        """Move the watermark from ``previous`` to ``occurrence_ms`` AND enqueue ``requests``,
        together; None when the watermark was no longer ``previous`` (another node fired).
        ``fired_ms`` is the occurrence that dispatched when it differs from the new watermark
        (a ``run-once`` catch-up fires the earliest missed one and moves past the rest)."""
        ...


@runtime_checkable
class Leader(Protocol):
    async def acquire(self) -> bool:
        """Take or renew leadership; False while another node holds it."""
        ...

    async def release(self) -> None: ...


@runtime_checkable
class LeaseLeader(Leader, Protocol):
    """A leader whose leadership is a lease lapsing ``ttl`` seconds after its last ``acquire()``.

    The scheduler reads ``ttl`` to renew the lease (and to ask for it, on a standby) every third
    of it. A ``Leader`` that states no ``ttl`` is asked every ``LEADER_RENEW_S`` (10 s)."""

    @property
    def ttl(self) -> float:
        """Seconds the lease lives without a renewal."""
        ...


@runtime_checkable
class QueueWake(Protocol):
    """Turns "another process committed a row" into a callback naming its queue."""

    @property
    def live(self) -> bool:
        """True once a probe proved notifications arrive (raises the idle ceiling)."""
        ...

    @property
    def hears_outbox(self) -> bool:
        """Whether it also hands on the outbox's stage announcements (``OUTBOX_WAKE``): only
        such a wake, live, raises an outbox relay's idle ceiling."""
        ...

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]: ...

    async def close(self) -> None: ...


@runtime_checkable
class JobsFacade(Protocol):
    """Where a handle's ``enqueue`` goes: straight to the driver, or staged in an outbox."""

    async def enqueue(self, request: EnqueueRequest) -> Enqueued: ...

    def current_tx(self) -> Any:
        """The ambient transaction an enqueue here would be staged in, or None: an enqueue
        then publishes straight to the driver (the fallback facade always answers None)."""
        ...
