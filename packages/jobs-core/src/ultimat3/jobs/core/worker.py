"""The worker role: claim rows, run them, keep their leases, drain on SIGTERM.

One loop claims for every queue at once: a pass is ONE ``driver.claim`` over every queue with a free
slot, and a slot coming free asks for a pass at once, so a busy worker refills as fast as its jobs
finish and a full one asks the queue for nothing. A pass asks for at most half of a queue's slots,
and one that comes back full is followed by another at once while slots are free: the next batch
is on the wire while the last one runs, where whole-concurrency batches would leave the worker
idle during every claim and the database idle during every batch (asking for every free slot
measured a quarter fewer jobs a second on a drain). That next claim is sent before the full batch
is launched: the batch gave each queue exactly what it asked, so the slots left are known without
reading its rows, and the claim's round trip overlaps their decoding (``ClaimedOnRead``) and
launch — about a tenth more jobs a second on a Postgres drain.

Idle, the loop backs off from ``poll_interval`` (250 ms) doubling to the idle ceiling — 2 s, or
5 s while a cross-process ``wake`` is proven live — and anything that rings it (an in-process
``signal_enqueued``, a ``QueueWake`` notification, a slot freeing, a row it handed back falling
due) brings a pass now and the floor again. Rings during a pass ask for one more pass, never a
second loop. The wake losing ``live`` rings it too: whatever it would have announced was lost with
it, and a wait stretched to 5 s on its word would hold pickup past the 2 s the poll promises.

Every lease the worker holds — each job's visibility lease, each fleet concurrency slot, its own
registry row — is renewed by one ``RenewalLoop`` every ``heartbeat_interval`` (a third of the
visibility timeout). A renewal that fails is a warning while the window has room; a window with
none landing is ``jobs.lease.lost`` plus ``job_leases_lost_total``, and the run is aborted with
``X_JOB_LEASE_LOST`` because the queue may already have handed it to another worker.

Once a minute (``ROLLUP_INTERVAL_S``) a running worker folds the per-job counters into their tiers
(``introspect.rollup_counters()``, idempotent, reading only the buckets due), as the scheduler
leader does: the counters stay within ``COUNTER_TIERS``' bound in a deployment that runs no
scheduler, instead of gaining a minute bucket per job name for every minute something settled.

A claimed row of a job the worker's process does not declare, enqueued less than
``undeclared_grace`` ago (``UNDECLARED_GRACE_S`` unless the worker names its own), is handed back
uncounted for ``UNDECLARED_RETRY_S``: during a rolling deploy it is the new code's, and the
workers still on the old code must not spend its attempts. An older one fails on its retry path
(``execute_job``), where an operator sees it.

Stopping, two ways:

- ``drain()`` (SIGTERM, SIGINT, ``run()``): *accept* stops claiming and aborts every held job's
  ``ctx.signal`` with ``X_DRAINING`` — a body that unwinds is ``interrupted``, its row ready again
  at once with the attempt uncounted; *close* waits for in-flight work up to ``drain_deadline``
  (else the process's ``configure_lifecycle(deadline=…)``, 25 s by default),
  and past it logs ``jobs.worker.drain-abandoned``: those rows return when their leases lapse.
- ``stop()`` aborts nothing and waits as long as the work takes (a shutdown landing meanwhile binds
  its deadline to that wait).

The worker never closes the driver it was handed: the caller owns it, and other roles of the
process may still be using it.
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Literal

from .clock import Clock
from .concurrency import FleetSlots, SlotDecision, require_lease_store
from .constants import (
    DEFAULT_QUEUE,
    DEFAULT_VISIBILITY_TIMEOUT_S,
    JOBS_CONCURRENCY_DEFAULT,
    POLL_INTERVAL_S,
    RESUME_TIMER_WINDOW_S,
    ROLLUP_INTERVAL_S,
    UNDECLARED_GRACE_S,
    UNDECLARED_RETRY_S,
)
from .context import JobOutcome
from .durations import Duration, parse_duration
from .errors import (
    ClaimQueuesEmptyError,
    InvariantError,
    JobDrainedError,
    JobKeyBusyError,
    JobSlotLostError,
    LeaseLostError,
)
from .execute import JobExecution, announce_exhausted, execute_job, fail_job, refuse_job
from .heap import tune_collector_for_worker
from .ids import new_id
from .job import AnyJobHandle
from .lifecycle import (
    LateDeadline,
    Wakeup,
    idle_ceiling,
    lifecycle_deadline,
    on_shutdown,
    positive_seconds,
    serve_until,
)
from .limits import LimitConfig, ProcessLimits
from .logs import log_event
from .metrics import JobMetrics, job_metrics
from .model import ClaimedJob, ExhaustedJob, JobState, NackOptions, WorkerInfo
from .protocol import ClaimBatch, EventBus, JobDriver, JobIntrospection, QueueWake
from .registry import job_named, registered_jobs, registry_version
from .renewal import Renewal, RenewalLoop
from .signal import AbortController
from .wake import on_enqueued, on_wake_lost

__all__ = ["JobWorker", "WorkerStats", "job_worker"]


@dataclass
class WorkerStats:
    """How the attempts this worker ran ended, and the rows its claims buried (counted ``dead``
    or ``dropped``: their lease had lapsed on the final attempt). ``handed_back``: runs returned
    to the queue before their body started (a limit, a busy key under ``when_busy='wait'``, a
    young row of a job this process does not declare), no attempt burned. ``lease_lost``: runs
    whose settle could not land because the claim no longer held the row."""

    completed: int = 0
    retried: int = 0
    dead: int = 0
    dropped: int = 0
    refused: int = 0
    interrupted: int = 0
    suspended: int = 0
    lease_lost: int = 0
    handed_back: int = 0

    def count(self, outcome: JobOutcome) -> None:
        field = _STAT_OF_OUTCOME[outcome]
        setattr(self, field, getattr(self, field) + 1)


_UNDECLARED_RETRY = timedelta(seconds=UNDECLARED_RETRY_S)
_ROLLUP_EVERY = timedelta(seconds=ROLLUP_INTERVAL_S)

_STAT_OF_OUTCOME: dict[str, str] = {
    "completed": "completed",
    "retried": "retried",
    "dead-lettered": "dead",
    "dropped": "dropped",
    "refused": "refused",
    "interrupted": "interrupted",
    "suspended": "suspended",
    "lease-lost": "lease_lost",
}


class _Run:
    """One claimed row while this worker holds it — and its visibility lease, as the
    ``Renewable`` the worker's renewal loop keeps alive."""

    __slots__ = (
        "began",
        "cancelled",
        "claimed",
        "controller",
        "freed",
        "handle",
        "held",
        "key_refused",
        "lease",
        "placed",
        "settling",
        "slot",
        "task",
        "worker",
    )

    def __init__(self, worker: JobWorker, claimed: ClaimedJob, handle: AnyJobHandle | None) -> None:
        self.worker = worker
        self.claimed = claimed
        self.handle = handle
        self.controller = AbortController()
        self.lease: Renewal | None = None
        self.slot: Renewal | None = None
        self.task: asyncio.Task[None] | None = None
        self.held: SlotDecision | None = None
        """The fleet slot this run holds."""
        self.freed = False
        """Whether its worker slot was given back (at the body's end, ahead of the settle)."""
        self.settling = False
        """Whether its settle is on its way (its body ended, or it never starts one)."""
        self.placed: datetime | None = None
        """When it took a place under the process limits (None: it holds none)."""
        self.began = False
        """Whether its body was started (a run handed back or refused never was): only a run
        that began counts against its tenant's rate."""
        self.key_refused = False
        """Whether its busy key refused it (``when_busy='fail'``)."""
        self.cancelled = False

    async def renew(self) -> bool:
        return await self.worker._heartbeat(self)

    def holds_lease(self) -> bool:
        """Whether the lease is still this run's, as its renewals tell: none was refused, and
        one landed within the last window."""
        return self.lease is not None and self.lease.active

    def refused(self) -> None:
        if not self.settling:  # a refusal now is the settle having landed
            self.worker._lease_refused(self)

    def lapsed(self) -> None:
        if not self.settling:  # a finished job's lease is nobody's loss
            self.worker._lease_lost(
                self, f"no renewal landed for a whole window ({self.worker._vis}s)"
            )

    def failed(self, error: BaseException) -> None:
        log_event(
            logging.WARNING,
            "jobs.heartbeat.failed",
            worker=self.worker.id,
            job=self.claimed.name,
            job_id=self.claimed.id,
            error=repr(error),
        )


class _SlotHold:
    """The fleet concurrency slot of one run, kept alive beside its lease."""

    __slots__ = ("fleet", "run", "slot")

    def __init__(self, fleet: FleetSlots, run: _Run, slot: SlotDecision) -> None:
        self.fleet = fleet
        self.run = run
        self.slot = slot

    async def renew(self) -> bool:
        # Over once the run let go of the slot: a renewal answering while the release is on its
        # way must not take the slot again.
        return await self.fleet.renew(self.slot, ended=lambda: self.run.held is not self.slot)

    def refused(self) -> None:
        self.lapsed()

    def lapsed(self) -> None:
        if self.run.settling:
            return  # the body has ended: a slot missed now costs nobody anything
        claimed = self.run.claimed
        log_event(
            logging.ERROR,
            "jobs.worker.slot-lost",
            worker=self.run.worker.id,
            job=claimed.name,
            job_id=claimed.id,
            key=self.slot.key,
        )
        self.run.controller.abort(
            JobSlotLostError(
                f"{claimed.name}: the concurrency slot {self.slot.key!r} of job {claimed.id} was "
                "taken by another run",
                meta={"job": claimed.name, "job_id": claimed.id, "key": self.slot.key},
            )
        )

    def failed(self, error: BaseException) -> None:
        log_event(
            logging.WARNING,
            "jobs.worker.slot-renew-failed",
            job=self.run.claimed.name,
            job_id=self.run.claimed.id,
            key=self.slot.key,
            error=repr(error),
        )


class _RegistryRow:
    """The worker's own row in ``introspect.workers()``: renewed while it runs, never lost —
    a window of failures only re-arms it."""

    __slots__ = ("worker",)

    def __init__(self, worker: JobWorker) -> None:
        self.worker = worker

    async def renew(self) -> bool:
        await self.worker._record_worker()
        return True

    def refused(self) -> None:
        return None

    def lapsed(self) -> None:
        if self.worker._state == "running":
            self.worker._renewals.add(self)

    def failed(self, error: BaseException) -> None:
        self.worker._registry_failed(error)


class JobWorker:
    """Runs the jobs of some queues. Build it with ``job_worker()``."""

    def __init__(
        self,
        *,
        driver: JobDriver,
        context: Callable[[], Any],
        queues: Sequence[str] | None,
        concurrency: int | Mapping[str, int] | None,
        jobs: Sequence[AnyJobHandle] | None,
        visibility_timeout: Duration,
        heartbeat_interval: Duration | None,
        poll_interval: Duration,
        idle_poll_max: Duration | None,
        wake: QueueWake | None,
        limits: LimitConfig | ProcessLimits | None,
        clock: Clock | None,
        worker_id: str | None,
        drain_deadline: Duration | None,
        undeclared_grace: Duration,
        events: EventBus | None,
        metrics: JobMetrics | None,
        on_execution: Callable[[JobExecution], None] | None,
    ) -> None:
        self._driver = driver
        self._context = context
        self._clock = clock or driver.clock
        self._vis = positive_seconds(visibility_timeout, "visibility_timeout")
        beat = (
            self._vis / 3
            if heartbeat_interval is None
            else positive_seconds(heartbeat_interval, "heartbeat_interval")
        )
        if beat >= self._vis:
            raise InvariantError(
                f"heartbeat_interval ({beat}s) must be shorter than the visibility timeout "
                f"({self._vis}s), or every lease lapses before its renewal"
            )
        self._beat = beat
        self._poll = positive_seconds(poll_interval, "poll_interval")
        self._idle_max = (
            None if idle_poll_max is None else positive_seconds(idle_poll_max, "idle_poll_max")
        )
        self._drain_deadline = (
            None if drain_deadline is None else positive_seconds(drain_deadline, "drain_deadline")
        )
        grace = parse_duration(undeclared_grace, field="undeclared_grace")
        if grace < 0:
            raise InvariantError(
                f"undeclared_grace must be zero (no grace) or positive, got {undeclared_grace!r}",
                meta={"field": "undeclared_grace"},
            )
        self._undeclared_grace = timedelta(seconds=grace)
        self._wake = wake
        self._events = events
        self._metrics = metrics or job_metrics()
        self._on_execution = on_execution
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{new_id()[-8:]}"
        self.stats = WorkerStats()

        self._routes = {handle.name: handle for handle in jobs or ()}
        self._slots = _slots_table(_queues_of(queues, concurrency, jobs), concurrency)
        if isinstance(limits, LimitConfig):
            limits = ProcessLimits(limits, self._clock)
        self._limits = limits
        self._fleet = FleetSlots(driver.leases, ttl=self._vis)
        self._drop_exhausted: frozenset[str] = frozenset()
        self._drop_exhausted_of = -1
        """The registry version ``_drop_exhausted`` was read at."""

        self._state: Literal["new", "running", "stopping", "stopped"] = "new"
        self._accepting = False
        self._runs: dict[tuple[str, str], _Run] = {}
        """Held runs by (job id, claim token): a driver may hand one token to a whole claimed
        batch, and the same row re-claimed by this worker (its lease lapsed while the first run
        went on) is a second run, not the first one again."""
        self._busy = dict.fromkeys(self._slots, 0)
        self._background: set[asyncio.Task[Any]] = set()
        self._tally: dict[tuple[str, JobOutcome], int] = {}
        """``jobs_total`` counted since the last pass, flushed once per pass, not per job."""
        self._reminders: list[datetime] = []
        self._undeclared: set[str] = set()
        """Names of jobs this process does not declare whose rows it handed back (reported)."""
        self._sleep_until: datetime | None = None
        """When the claim loop's current wait ends; None while it waits for a ring only."""
        self._wakeup = Wakeup()
        self._renewals = RenewalLoop(self._clock, interval=self._beat, window=self._vis)
        self._deadline = LateDeadline(self._clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._claiming: asyncio.Task[None] | None = None
        self._ahead: tuple[dict[str, int], datetime, asyncio.Future[ClaimBatch]] | None = None
        """The next claim, sent before the batch in hand was launched: what it asked, when."""
        self._winding: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._started_at: datetime | None = None
        self._next_rollup: datetime | None = None
        """When the worker next folds the counters: a minute after it started, then every
        minute while it claims."""
        self._unsubscribe: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"<JobWorker {self.id} {self._state} queues={list(self._slots)}>"

    @property
    def queues(self) -> dict[str, int]:
        """The queues this worker serves and its slots in each."""
        return dict(self._slots)

    @property
    def in_flight(self) -> list[str]:
        """Ids of the jobs this worker holds now."""
        return [run.claimed.id for run in self._runs.values()]

    # -- the surface ------------------------------------------------------------------------

    async def start(self) -> None:
        """Begin claiming. ``X_JOB_CONCURRENCY_UNENFORCEABLE`` when a served job declares
        ``concurrency`` and the driver has no lease store (a capped job's row enqueued onto a
        served queue its declaration does not name fails its attempt with that code instead)."""
        if self._state != "new":
            raise InvariantError(f"worker {self.id} was already started; build a new one")
        routable = self._routable()
        served = [handle for handle in routable if handle.queue in self._slots]
        require_lease_store(served, self._driver.leases)
        named = {handle.queue for handle in served}
        for queue in self._slots:
            if queue not in named:
                log_event(logging.WARNING, "jobs.worker.queue-unregistered", queue=queue)
        self._loop = asyncio.get_running_loop()
        self._state, self._accepting = "running", True
        self._started_at = self._clock.now()
        self._next_rollup = self._started_at + _ROLLUP_EVERY
        self._unsubscribe.append(on_enqueued(self._on_enqueued))
        if self._wake is not None:
            self._unsubscribe.append(self._wake.subscribe(self._on_enqueued))
            self._unsubscribe.append(on_wake_lost(self._on_wake_lost))
        self._unsubscribe.append(on_shutdown(self._accept, self._close))
        self._renewals.start()
        await self._register()
        self._claiming = self._loop.create_task(self._claim_loop())
        log_event(logging.INFO, "jobs.worker.started", worker=self.id, slots=self._slots)

    async def stop(self) -> None:
        """Stop claiming and wait for the jobs in hand to finish; aborts nothing."""
        if self._state == "new":
            self._state = "stopped"
            self._stopped.set()
            return
        self._stop_claiming()
        await self._wind_down()

    async def drain(self, reason: str = "drain") -> None:
        """The SIGTERM path for this worker alone: accept, then close."""
        self._accept(reason)
        await self._close(None)

    async def run(self) -> None:
        """Start, drain on SIGTERM/SIGINT (every role of the process), return once stopped.

        The process is a worker's, so what it built before (modules, declarations, the app) is
        frozen out of the garbage collector's full collections, and young collections wait for
        more new objects (``heap.tune_collector_for_worker``)."""
        tune_collector_for_worker()
        await self.start()
        await serve_until(self._stopped)

    async def __aenter__(self) -> JobWorker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- shutdown ----------------------------------------------------------------------------

    def _stop_claiming(self) -> None:
        if self._state == "running":
            self._state = "stopping"
        self._accepting = False
        self._wakeup.ring()

    def _accept(self, reason: str) -> None:
        if self._state not in ("running", "stopping"):
            return
        self._stop_claiming()
        log_event(
            logging.INFO,
            "jobs.worker.draining",
            worker=self.id,
            signal=reason,
            held=len(self._runs),
        )
        for run in list(self._runs.values()):
            run.controller.abort(self._drained(reason))

    def _drained(self, reason: str) -> JobDrainedError:
        return JobDrainedError(
            f"worker {self.id} is draining ({reason}); the job goes back to the queue with this "
            "attempt uncounted",
            meta={"worker": self.id, "signal": reason},
        )

    async def _close(self, budget: float | None) -> None:
        if self._state in ("new", "stopped"):
            return
        if budget is None:  # the worker's own budget, else the process's lifecycle deadline
            budget = self._drain_deadline or lifecycle_deadline()
        self._deadline.bind_in(budget)
        await self._wind_down()

    async def _wind_down(self) -> None:
        if self._winding is None:
            self._winding = asyncio.get_running_loop().create_task(self._finish())
        await asyncio.shield(self._winding)

    async def _finish(self) -> None:
        if not await self._deadline.wait_for(self._quiesce()):
            log_event(
                logging.ERROR,
                "jobs.worker.drain-abandoned",
                worker=self.id,
                jobs=self.in_flight,
                fix="these rows return when their leases lapse, as a counted attempt; raise "
                "drain_deadline past your slowest job, or make its body honour ctx.signal",
            )
        await self._renewals.stop()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        introspect = self._driver.introspect
        if introspect is not None:
            try:
                await introspect.remove_worker(self.id)
            except Exception as exc:
                log_event(logging.WARNING, "jobs.worker.registry-failed", error=repr(exc))
        self._state = "stopped"
        self._flush_tally()  # from here on, a late settle flushes its own count (_count)
        self._stopped.set()
        log_event(logging.INFO, "jobs.worker.stopped", worker=self.id, stats=self.stats)

    async def _quiesce(self) -> None:
        if self._claiming is not None:
            await asyncio.gather(self._claiming, return_exceptions=True)
        while self._runs or self._background:
            tasks = [run.task for run in self._runs.values() if run.task is not None]
            await asyncio.gather(*tasks, *self._background, return_exceptions=True)

    # -- claiming ----------------------------------------------------------------------------

    def _routable(self) -> list[AnyJobHandle]:
        """The jobs a claimed row can be routed to: the worker's own, then the registry's."""
        handles = dict(self._routes)
        for handle in registered_jobs():
            handles.setdefault(handle.name, handle)
        return list(handles.values())

    def _dropped_when_exhausted(self) -> frozenset[str]:
        """The jobs declaring ``dead_letter=False``, whose rows a claim buries failed rather than
        dead: every job the worker can route, not only those of its queues (a row enqueued with
        ``queue=`` runs here under its job's own retry policy), read again whenever the registry
        changed, so a job declared after ``start()`` (a lazy import) is buried by its own rule."""
        version = registry_version()
        if version != self._drop_exhausted_of:
            self._drop_exhausted_of = version
            self._drop_exhausted = frozenset(
                handle.name for handle in self._routable() if not handle.retry.dead_letter
            )
        return self._drop_exhausted

    def _route(self, name: str) -> AnyJobHandle | None:
        return self._routes.get(name) or job_named(name)

    def _on_enqueued(self, queue: str) -> None:
        if queue in self._slots:
            self._ring()

    def _on_wake_lost(self, wake: QueueWake) -> None:
        if wake is self._wake:
            self._ring()

    def _ring(self) -> None:
        """Ring the claim loop from any thread (a wake may deliver on another one)."""
        loop = self._loop
        if not self._accepting or loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._wakeup.ring()
        else:
            loop.call_soon_threadsafe(self._wakeup.ring)

    def _idle_ceiling(self) -> float:
        return idle_ceiling(self._idle_max, self._wake)

    def _has_a_free_slot(self) -> bool:
        return any(slots > self._busy[queue] for queue, slots in self._slots.items())

    def _free(self) -> dict[str, int]:
        free = {
            queue: slots - self._busy[queue]
            for queue, slots in self._slots.items()
            if slots > self._busy[queue]
        }
        if free and self._limits is not None:
            free = self._limits.room(free)
        return free

    def _half_of_the_slots(self, free: dict[str, int]) -> dict[str, int]:
        """Cap each queue's ask at half its slots (rounded up), so claiming overlaps running."""
        return {queue: min(count, -(-self._slots[queue] // 2)) for queue, count in free.items()}

    def _more_may_be_due(self, asked: dict[str, int], taken: dict[str, int]) -> bool:
        """Whether some queue's batch came back full while it still has a free slot: more of
        its rows may be due, and that slot can take one now rather than at the next ring."""
        return any(
            taken.get(queue) == count and self._slots[queue] > self._busy[queue]
            for queue, count in asked.items()
        )

    async def _claim_loop(self) -> None:
        idle_wait = self._poll
        while self._accepting:
            wait: float | None
            try:
                self._flush_tally()
                self._fold_counters()
                taken_ahead = await self._take_ahead()
                if taken_ahead is not None:
                    asked, began, taken = taken_ahead
                else:
                    began = self._clock.now()
                    asked = self._free()
                    taken = {}
                    if asked:
                        asked = self._half_of_the_slots(asked)
                        taken = await self._take(asked, await self._fetch(asked), began)
                if self._more_may_be_due(asked, taken):
                    idle_wait = self._poll
                    continue
                if taken:
                    wait = idle_wait = self._poll
                elif asked or self._has_a_free_slot():
                    # Nothing due, or the process limits left no room: a limit shared with
                    # another worker frees on ITS ring, not ours, so poll with the back-off.
                    # The ceiling is read now: it drops when the wake stops being live.
                    ceiling = max(self._idle_ceiling(), self._poll)
                    wait = min(idle_wait, ceiling)
                    idle_wait = min(idle_wait * 2, ceiling)
                else:
                    wait = None  # full: a slot coming free rings
                if asked:
                    wait = self._until_reminder(wait, began)
            except Exception as exc:  # a hook (metrics, limits) that throws must not end the loop
                log_event(logging.ERROR, "jobs.worker.tick-failed", worker=self.id, error=repr(exc))
                wait = idle_wait = max(self._idle_ceiling(), self._poll)
            now = self._clock.now()
            self._sleep_until = None if wait is None else now + timedelta(seconds=wait)
            if await self._wakeup.wait(self._clock, wait):
                idle_wait = self._poll
        await self._take_ahead()  # its rows go back: claimed as the drain began

    def _fold_counters(self) -> None:
        """Start the counters' rollup in the background when a minute has passed since the last
        one (or the clock went back past it)."""
        introspect = self._driver.introspect
        due = self._next_rollup
        if introspect is None or due is None:
            return
        now = self._clock.now()
        if due - _ROLLUP_EVERY <= now < due:
            return
        self._next_rollup = now + _ROLLUP_EVERY
        self._spawn(self._rollup(introspect))

    async def _rollup(self, introspect: JobIntrospection) -> None:
        try:
            await introspect.rollup_counters()
        except Exception as exc:
            log_event(logging.WARNING, "jobs.worker.rollup-failed", worker=self.id, error=repr(exc))

    def _flush_tally(self) -> None:
        tally, self._tally = self._tally, {}
        for (queue, outcome), count in tally.items():
            self._metrics.settled(queue, outcome, count)

    async def _fetch(self, asked: dict[str, int]) -> ClaimBatch:
        """One claim of up to ``asked`` rows per queue; an empty batch when it fails."""
        try:
            return await self._driver.claim(
                worker_id=self.id,
                slots=asked,
                visibility_timeout=self._vis,
                drop_exhausted=self._dropped_when_exhausted(),
            )
        except Exception as exc:
            log_event(logging.WARNING, "jobs.worker.claim-failed", worker=self.id, error=repr(exc))
            return ClaimBatch()

    async def _take(
        self, asked: dict[str, int], batch: ClaimBatch, sent: datetime
    ) -> dict[str, int]:
        """Launch the rows of ``batch`` (claimed for ``asked`` by a claim sent at ``sent``);
        answers how many each queue gave. A full batch sends the next claim first, so that
        claim's round trip overlaps the decoding and launching of this one. Each run's lease is
        kept from ``sent``: the queue counts the lease from the claim, not from its answer."""
        for exhausted in batch.exhausted:
            self._announce(exhausted)
        taken: dict[str, int] = {}
        if not batch.jobs:
            return taken
        if len(batch.jobs) == sum(asked.values()):
            await self._claim_ahead(asked)
        try:
            jobs = list(batch.jobs)  # decoded here, when a driver hands ClaimedOnRead
        except Exception as exc:  # its rows return when their leases lapse
            log_event(logging.WARNING, "jobs.worker.claim-failed", worker=self.id, error=repr(exc))
            return taken
        loop = asyncio.get_running_loop()
        for claimed in jobs:
            self._launch(claimed, sent, loop)
            taken[claimed.queue] = taken.get(claimed.queue, 0) + 1
        return taken

    async def _take_ahead(self) -> tuple[dict[str, int], datetime, dict[str, int]] | None:
        """Take the claim sent ahead, if one is out: what it asked, when it was sent, and how
        many rows each queue gave."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        asked, sent, answer = ahead
        return asked, sent, await self._take(asked, await answer, sent)

    async def _claim_ahead(self, asked: dict[str, int]) -> None:
        """Send the claim the loop would send after launching a full batch of ``asked``: a full
        batch gave each queue exactly what it asked, so the slots left are known before its
        rows are read. Not under process limits, whose room depends on the rows themselves."""
        if self._limits is not None or not self._accepting:
            return
        free = {
            queue: left
            for queue, count in self._free().items()
            if (left := count - asked.get(queue, 0)) > 0
        }
        if not free:
            return
        ask = self._half_of_the_slots(free)
        self._ahead = (ask, self._clock.now(), asyncio.ensure_future(self._fetch(ask)))
        await asyncio.sleep(0)  # the claim goes out now, before this batch is launched

    def _until_reminder(self, wait: float | None, began: datetime) -> float | None:
        """Shorten ``wait`` to the earliest row this worker handed back that falls due after the
        pass that began at ``began`` (that pass already looked for the earlier ones)."""
        reminders = self._reminders
        while reminders and reminders[0] <= began:
            heapq.heappop(reminders)
        if not reminders:
            return wait
        due = max(0.0, (reminders[0] - self._clock.now()).total_seconds())
        return due if wait is None else min(wait, due)

    def _remind(self, at: datetime) -> None:
        """Keep a timer for a row this worker handed back that falls due within a minute."""
        now = self._clock.now()
        if not self._accepting or at <= now:
            return
        if (at - now).total_seconds() <= RESUME_TIMER_WINDOW_S:
            heapq.heappush(self._reminders, at)
            if self._sleep_until is not None and at < self._sleep_until:
                self._wakeup.ring()

    def _announce(self, exhausted: ExhaustedJob) -> None:
        dropped = exhausted.state is JobState.FAILED
        self._count(exhausted.queue, "dropped" if dropped else "dead-lettered")
        self._spawn(announce_exhausted(exhausted, handle=self._route(exhausted.name)))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- one run -----------------------------------------------------------------------------

    def _launch(
        self, claimed: ClaimedJob, claimed_at: datetime, loop: asyncio.AbstractEventLoop
    ) -> None:
        run = _Run(self, claimed, self._route(claimed.name))
        if not self._accepting:
            run.controller.abort(self._drained("claimed as the drain began"))
        self._runs[claimed.id, claimed.claim.claim] = run
        self._busy[claimed.queue] = self._busy.get(claimed.queue, 0) + 1
        run.lease = self._renewals.add(run, claimed_at)
        run.task = loop.create_task(self._execute(run))

    async def _execute(self, run: _Run) -> None:
        claimed = run.claimed
        ran = False
        try:
            handle = run.handle
            if handle is None and self._clock.now() - claimed.created_at < self._undeclared_grace:
                admitted, failure = False, None
                await self._leave_for_its_deploy(run)
            elif self._limits is None and (handle is None or handle.concurrency is None):
                admitted, failure = True, None  # nothing to admit it against
            else:
                admitted, failure = await self._admit(run)
            if admitted:
                ran = True
                await self._attempt(run, failure)
            else:
                ran = run.key_refused
        except Exception as exc:
            log_event(
                logging.ERROR,
                "jobs.worker.run-failed",
                worker=self.id,
                job=claimed.name,
                job_id=claimed.id,
                error=repr(exc),
                fix="the row returns when its lease lapses",
            )
        finally:
            if run.lease is not None:
                self._renewals.drop(run.lease)
            if run.slot is not None:
                self._renewals.drop(run.slot)
            if run.held is not None:
                held, run.held = run.held, None
                await self._fleet.release(held)
            if run.placed is not None:
                self._give_place_back(run)
            del self._runs[claimed.id, claimed.claim.claim]
            self._free_slot(run, ring=ran)

    def _body_done(self, run: _Run) -> Awaitable[None] | None:
        """The body ended: the run gives back its fleet slot, then its worker slot, whose ring
        brings the next claim. In that order: a run that no longer runs holds no key, and the
        next run of the key, claimed at once, must not find it held by the settle and the
        ``on_settled`` hook still on their way (``when_busy='fail'`` refused it)."""
        run.settling = True
        if run.placed is not None:
            self._give_place_back(run)
        if run.held is None:
            self._free_slot(run)
            return None
        return self._release_fleet_slot(run)

    def _give_place_back(self, run: _Run) -> None:
        """Give the run's place under the process limits back, once: at its body's end, before
        the slot's ring brings the next claim (which must find the place free, or it hands the
        row straight back), or when it ends without a body."""
        if run.placed is not None and self._limits is not None:
            unstarted = None if run.began else run.placed
            run.placed = None
            self._limits.release(run.claimed.queue, run.claimed.tenant_id, unstarted=unstarted)

    async def _release_fleet_slot(self, run: _Run) -> None:
        held, run.held = run.held, None
        assert held is not None
        if run.slot is not None:
            self._renewals.drop(run.slot)
            run.slot = None
        try:
            await self._fleet.release(held)
        finally:
            self._free_slot(run)

    def _free_slot(self, run: _Run, *, ring: bool = True) -> None:
        """Give the run's worker slot back, once. A handed-back run rings nothing (a pass now
        would only claim it again) unless the claim loop waits for nothing but a ring: it found
        every slot busy, and this one coming free is what it waits for."""
        if run.freed:
            return
        run.freed = True
        self._busy[run.claimed.queue] -= 1
        if ring or self._sleep_until is None:
            self._wakeup.ring()

    async def _admit(self, run: _Run) -> tuple[bool, BaseException | None]:
        """Take the run's place under the process limits and its fleet slot. Answers whether
        the attempt goes ahead (False: handed back or refused instead) and, when it goes ahead
        only to fail without its body, why."""
        claimed = run.claimed
        if run.controller.signal.aborted:
            return True, None
        if self._limits is not None:
            placed = self._clock.now()
            back_at = self._limits.hold(claimed.queue, claimed.tenant_id, now=placed)
            if back_at is not None:
                await self._hand_back(run, back_at)
                return False, None
            run.placed = placed
        if run.handle is None or run.handle.concurrency is None:
            return True, None
        decision = await self._fleet.take(run.handle, claimed)
        if decision.kind == "wait":
            await self._hand_back(run, self._clock.now())
            return False, None
        if decision.kind == "refuse":
            run.key_refused = True
            await self._refuse(run, decision)
            return False, None
        if decision.kind == "held":
            run.held = decision
            run.slot = self._renewals.add(_SlotHold(self._fleet, run, decision))
        return True, decision.error

    async def _attempt(self, run: _Run, failure: BaseException | None) -> None:
        """Run the attempt — or, when ``failure`` is set, fail it on the ordinary retry path
        without starting the body."""
        reason = run.controller.signal.reason
        if reason is not None:
            # Aborted before its body started: a drain hands it straight back, uncounted; a lost
            # lease leaves the row to whoever holds it now.
            if isinstance(reason, JobDrainedError):
                await self._hand_back(run, self._clock.now())
            return
        services: Any = None
        try:
            services = self._context()
            if services is not None and inspect.isawaitable(services):
                services = await services
        except Exception as exc:
            failure = exc
        if failure is not None:
            run.settling = True
            execution = await fail_job(
                run.claimed,
                driver=self._driver,
                handle=run.handle,
                error=failure,
                clock=self._clock,
            )
        else:
            run.began = True
            execution = await execute_job(
                run.claimed,
                driver=self._driver,
                handle=run.handle,
                services=services,
                signal=run.controller.signal,
                events=self._events,
                clock=self._clock,
                on_body_done=lambda: self._body_done(run),
                holds_lease=run.holds_lease,
            )
        self._record(run.claimed.queue, execution)

    def _count(self, queue: str, outcome: JobOutcome) -> None:
        self.stats.count(outcome)
        key = (queue, outcome)
        self._tally[key] = self._tally.get(key, 0) + 1
        if self._state == "stopped":  # a run the drain abandoned: no pass flushes it now
            self._flush_tally()

    def _record(self, queue: str, execution: JobExecution) -> None:
        self._count(queue, execution.outcome)
        if self._on_execution is not None:
            self._on_execution(execution)
        if execution.resume_at is not None and execution.outcome in ("retried", "suspended"):
            self._remind(execution.resume_at)

    async def _hand_back(self, run: _Run, at: datetime, *, remind: bool = True) -> None:
        """Return a run to the queue before its body started: ready at ``at``, uncounted.
        ``remind``: keep a timer to claim it again when it falls due."""
        claimed = run.claimed
        ref = claimed.claim
        run.settling = True
        landed = await self._driver.nack(
            claimed.id, NackOptions(ref.worker_id, ref.claim, run_at=at, count_attempt=False)
        )
        if landed:
            self.stats.handed_back += 1
            if remind:
                self._remind(at)

    async def _leave_for_its_deploy(self, run: _Run) -> None:
        """Hand back, uncounted, a young row of a job this process does not declare, for a
        worker that does (``undeclared_grace``). This one keeps no timer for it: it would only
        claim it again. Reported once per job name."""
        name = run.claimed.name
        if name not in self._undeclared:
            self._undeclared.add(name)
            log_event(
                logging.WARNING,
                "jobs.worker.job-undeclared",
                worker=self.id,
                job=name,
                queue=run.claimed.queue,
                fix="deploy the code that declares it to every worker of the queue; its rows are "
                f"handed back for {self._undeclared_grace.total_seconds():g} s after their "
                "enqueue, then fail on their retry path",
            )
        await self._hand_back(run, self._clock.now() + _UNDECLARED_RETRY, remind=False)

    async def _refuse(self, run: _Run, decision: SlotDecision) -> None:
        assert run.handle is not None
        assert isinstance(decision.error, JobKeyBusyError)
        run.settling = True
        execution = await refuse_job(
            run.claimed,
            driver=self._driver,
            handle=run.handle,
            value=decision.value,
            error=decision.error,
        )
        self._record(run.claimed.queue, execution)

    # -- leases ------------------------------------------------------------------------------

    async def _heartbeat(self, run: _Run) -> bool:
        claimed = run.claimed
        if await self._driver.heartbeat(claimed.id, claimed.claim, self._vis):
            return True
        run.cancelled = await self._was_cancelled(claimed.id)
        return False

    async def _was_cancelled(self, job_id: str) -> bool:
        introspect = self._driver.introspect
        if introspect is None:
            return False
        try:
            detail = await introspect.get(job_id)
        except Exception:
            return False
        return detail is not None and detail.row.state is JobState.CANCELLED

    def _lease_refused(self, run: _Run) -> None:
        if not run.cancelled:
            self._lease_lost(run, "the queue no longer matches this claim (it was re-delivered)")
            return
        log_event(logging.INFO, "jobs.job.cancelled", job=run.claimed.name, job_id=run.claimed.id)
        run.controller.abort(
            LeaseLostError(
                f"{run.claimed.name}: job {run.claimed.id} was cancelled while this worker ran it",
                meta={"job": run.claimed.name, "job_id": run.claimed.id, "cancelled": True},
            )
        )

    def _lease_lost(self, run: _Run, why: str) -> None:
        claimed = run.claimed
        log_event(
            logging.ERROR,
            "jobs.lease.lost",
            worker=self.id,
            job=claimed.name,
            job_id=claimed.id,
            queue=claimed.queue,
            reason=why,
        )
        self._metrics.lease_lost(claimed.queue)
        run.controller.abort(
            LeaseLostError(
                f"{claimed.name}: this worker lost the lease of job {claimed.id} ({why}); the "
                "queue may already run it elsewhere",
                meta={"job": claimed.name, "job_id": claimed.id, "worker": self.id},
            )
        )

    # -- the registry row --------------------------------------------------------------------

    def _info(self) -> WorkerInfo:
        assert self._started_at is not None
        return WorkerInfo(
            id=self.id,
            host=socket.gethostname(),
            started_at=self._started_at,
            queues=list(self._slots),
            slots=dict(self._slots),
            in_flight=[run.claimed.id for run in self._runs.values()],  # WorkerInfo bounds it
            last_heartbeat=self._clock.now(),
        )

    async def _record_worker(self) -> None:
        introspect = self._driver.introspect
        if introspect is not None:
            await introspect.record_worker(self._info(), ttl=self._vis)

    async def _register(self) -> None:
        """Write the registry row now and keep it renewed while the worker runs."""
        try:
            await self._record_worker()
        except Exception as exc:
            self._registry_failed(exc)
        if self._driver.introspect is not None:
            self._renewals.add(_RegistryRow(self))

    def _registry_failed(self, error: BaseException) -> None:
        log_event(logging.WARNING, "jobs.worker.registry-failed", worker=self.id, error=repr(error))


def _queues_of(
    queues: Sequence[str] | None,
    concurrency: int | Mapping[str, int] | None,
    jobs: Sequence[AnyJobHandle] | None,
) -> list[str]:
    """The served queues: as given; else those of the explicit jobs (or of every registered job)
    and those a concurrency table names; else the default queue."""
    if queues is not None:
        if isinstance(queues, str) or not queues:
            raise ClaimQueuesEmptyError(
                "queues must be a non-empty list of queue names, e.g. queues=['default']"
            )
        return list(dict.fromkeys(queues))
    handles = jobs if jobs else registered_jobs()
    named = [handle.queue for handle in handles]
    if isinstance(concurrency, Mapping):
        named.extend(concurrency)
    return list(dict.fromkeys(sorted(named))) or [DEFAULT_QUEUE]


def _slots_table(
    queues: Collection[str], concurrency: int | Mapping[str, int] | None
) -> dict[str, int]:
    table: dict[str, int] = {}
    for queue in queues:
        if isinstance(concurrency, Mapping):
            slots = concurrency.get(queue, JOBS_CONCURRENCY_DEFAULT)
        elif concurrency is None:
            slots = JOBS_CONCURRENCY_DEFAULT
        else:
            slots = concurrency
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise InvariantError(
                f"concurrency for queue {queue!r} must be a whole number >= 1, got {slots!r}",
                meta={"queue": queue},
            )
        table[queue] = slots
    return table


def job_worker(
    *,
    driver: JobDriver,
    context: Callable[[], Any],
    queues: Sequence[str] | None = None,
    concurrency: int | Mapping[str, int] | None = None,
    jobs: Sequence[AnyJobHandle] | None = None,
    visibility_timeout: Duration = DEFAULT_VISIBILITY_TIMEOUT_S,
    heartbeat_interval: Duration | None = None,
    poll_interval: Duration = POLL_INTERVAL_S,
    idle_poll_max: Duration | None = None,
    wake: QueueWake | None = None,
    limits: LimitConfig | ProcessLimits | None = None,
    clock: Clock | None = None,
    worker_id: str | None = None,
    drain_deadline: Duration | None = None,
    undeclared_grace: Duration = UNDECLARED_GRACE_S,
    events: EventBus | None = None,
    metrics: JobMetrics | None = None,
    on_execution: Callable[[JobExecution], None] | None = None,
) -> JobWorker:
    """A worker over ``driver``'s queues; ``await worker.run()`` in a worker process.

    ``context()`` builds what each run's ``ctx.services`` holds (it may be async). ``concurrency``
    is the slots per queue: one number for every queue, or a table (a queue it does not name gets
    ``JOBS_CONCURRENCY_DEFAULT``). ``jobs`` routes rows by name ahead of the registry. ``limits``
    caps what this process runs (see ``LimitConfig``). ``wake`` is a driver's cross-process
    ``QueueWake``; enqueues in this process wake the worker without one. ``on_execution`` is
    told every attempt this worker ran, as it ended (its outcome, step trace and timing).
    ``undeclared_grace`` is how long after its enqueue a row of a job this process does not
    declare is handed back for another worker rather than failed: stretch it past a slow rollout,
    or pass 0 to fail such rows at once. ``events`` is the bus ``step.wait_for_event`` reads;
    without it, the one ``publish_event`` goes to (the bus ``set_event_bus`` installed, else the
    driver's own).
    """
    return JobWorker(
        driver=driver,
        context=context,
        queues=queues,
        concurrency=concurrency,
        jobs=jobs,
        visibility_timeout=visibility_timeout,
        heartbeat_interval=heartbeat_interval,
        poll_interval=poll_interval,
        idle_poll_max=idle_poll_max,
        wake=wake,
        limits=limits,
        clock=clock,
        worker_id=worker_id,
        drain_deadline=drain_deadline,
        undeclared_grace=undeclared_grace,
        events=events,
        metrics=metrics,
        on_execution=on_execution,
    )
