"""The scheduler role: turns each task's cron occurrences into jobs, once each, fleet-wide.

One leader dispatches; every other scheduler process stands by. The leader renews its lease, and
a standby asks for it, every ``leader_renew_interval`` — a third of the lease's ``ttl`` (10 s of
the default 30 s) — not every round. Renewing within the ``ttl`` is what keeps the lease from
lapsing under a leader that still believes it leads. While it leads, the scheduler holds every
task's watermark — the last occurrence dispatched or passed over — in memory, so an idle round
reads no store and resolves no cron: it compares the clock with the next instant something is due.

When a task is due:

- a paused task (``pause_task``) is not dispatched; it is looked at again after
  ``PAUSE_RECHECK_S`` (5 s), and on resume its own ``catch_up`` decides what it missed;
- the occurrence fires through ``SchedulerState.fire``, which moves the watermark from the value
  this leader last saw AND enqueues the task's jobs together, so a crash between the two cannot
  fire it twice and a node that lost the race fires nothing;
- after downtime, ``catch_up`` decides: ``skip`` (default) fires the true latest missed
  occurrence (found by bisection, ``cron.latest_occurrence``) and drops the older ones;
  ``run-once`` fires the earliest and moves the watermark past the rest in the same fire, so it
  fires once, not once per tick; ``run-all`` walks at most ``max_catch_up`` occurrences a round,
  firing each.

A task seen for the first time is armed at now: its watermark moves without a fire. The leader also
folds the per-job counters into their tiers once a minute (``rollup_counters``).

Stopping: dispatch stops, the round in flight finishes, the lease is handed back. A round still
enqueueing at the drain's deadline keeps the lease — promoting a standby onto an occurrence this
node is mid-dispatch for is the double fire election exists to prevent — and it expires on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Literal

from .clock import Clock
from .constants import PAUSE_RECHECK_S, ROLLUP_INTERVAL_S
from .cron import instant_of, latest_occurrence, next_occurrence, occurrence_ms
from .durations import Duration
from .errors import InvariantError
from .lifecycle import (
    LateDeadline,
    Wakeup,
    lifecycle_deadline,
    on_shutdown,
    positive_seconds,
    serve_until,
)
from .logs import log_event
from .memory.scheduler import always_leader, memory_scheduler_state
from .model import TaskFire
from .protocol import JobDriver, Leader, LeaseLeader, SchedulerState
from .registry import registered_tasks
from .retry import error_code
from .task import AnyTaskHandle
from .wake import signal_enqueued

__all__ = ["LEADER_RENEW_S", "ROLLUP_INTERVAL_S", "JobScheduler", "job_scheduler", "next_task_run"]

LEADER_RENEW_S = 10.0
"""How often a scheduler asks a leader that states no ``ttl`` (not a ``LeaseLeader``), such as the
always-leader default. A ``LeaseLeader`` is asked every third of its ``ttl`` instead."""

_ROLLUP_INTERVAL = timedelta(seconds=ROLLUP_INTERVAL_S)


def _not_yet(now: datetime, due: datetime | None, interval: timedelta) -> bool:
    """Whether ``now`` falls inside the interval that ends at ``due``. A clock set back lands
    before it and counts as due: waiting for the old deadline would stop a leader renewing (or
    rolling up) for as long as the clock went back, while it still believed it led."""
    return due is not None and due - interval <= now < due


def _renew_interval(leader: Leader, given: Duration | None) -> float:
    """Seconds between two ``acquire()`` calls: ``given``, else a third of the leader's ``ttl``,
    else ``LEADER_RENEW_S``. A given interval not shorter than the ``ttl`` is ``X_INVARIANT``: the
    lease would lapse under a leader still reading itself as one, and a standby would lead too."""
    ttl = positive_seconds(leader.ttl, "ttl") if isinstance(leader, LeaseLeader) else None
    if given is None:
        return LEADER_RENEW_S if ttl is None else ttl / 3
    seconds = positive_seconds(given, "leader_renew_interval")
    if ttl is not None and seconds >= ttl:
        raise InvariantError(
            f"leader_renew_interval={given!r} must be shorter than the leader's ttl ({ttl:g} s), "
            f"or its lease lapses between renewals and a standby leads beside it; leave it out "
            f"to renew every third of the ttl ({ttl / 3:g} s)",
            meta={"field": "leader_renew_interval", "value": seconds, "ttl": ttl},
        )
    return seconds


def next_task_run(task: AnyTaskHandle, from_: datetime) -> datetime:
    """When ``task`` next fires after ``from_``: the scheduler's own resolver, no scheduler
    needed."""
    return next_occurrence(task.cron, task.zone, from_)


class JobScheduler:
    """Dispatches the occurrences of a set of tasks. Build it with ``job_scheduler()``."""

    def __init__(
        self,
        *,
        driver: JobDriver,
        leader: Leader | None,
        state: SchedulerState | None,
        tasks: Sequence[AnyTaskHandle] | None,
        clock: Clock | None,
        tick_interval: Duration,
        leader_renew_interval: Duration | None,
    ) -> None:
        self._driver = driver
        self._clock = clock or driver.clock
        self._leader = leader if leader is not None else always_leader()
        self._state = state if state is not None else memory_scheduler_state(driver)
        self._given_tasks = list(tasks) if tasks is not None else None
        self._tick = positive_seconds(tick_interval, "tick_interval")
        self._renew_every = timedelta(seconds=_renew_interval(self._leader, leader_renew_interval))

        self._leading = False
        self._next_leader_check: datetime | None = None
        self._next_rollup: datetime | None = None
        self._marks: dict[str, int] | None = None
        """Watermarks while leading, loaded once per term; None when not loaded."""
        self._due: dict[str, datetime] = {}
        self._round_lock = asyncio.Lock()
        self._status: Literal["new", "running", "stopping", "stopped"] = "new"
        self._dispatching = False
        self._wakeup = Wakeup()
        self._deadline = LateDeadline(self._clock)
        self._loop_task: asyncio.Task[None] | None = None
        self._winding: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._unregister: list[Callable[[], None]] = []

    @property
    def leading(self) -> bool:
        return self._leading

    @property
    def tasks(self) -> list[AnyTaskHandle]:
        return self._given_tasks if self._given_tasks is not None else registered_tasks()

    # -- the surface ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._status != "new":
            raise InvariantError("this scheduler was already started; build a new one")
        self._status, self._dispatching = "running", True
        self._unregister.append(on_shutdown(self._accept, self._close))
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        log_event(logging.INFO, "jobs.scheduler.started", tasks=[t.name for t in self.tasks])

    async def stop(self, deadline: datetime | None = None) -> None:
        """Stop dispatching, finish the round in flight (until ``deadline``, bound late: a
        shutdown landing on this wait bounds it too) and hand the lease back."""
        if deadline is not None:
            self._deadline.bind(deadline)
        if self._status == "new":
            self._status = "stopped"
            self._stopped.set()
            return
        self._accept("stop")
        await self._wind_down()

    async def run(self) -> None:
        """Start, drain on SIGTERM/SIGINT (every role of the process), return once stopped."""
        await self.start()
        await serve_until(self._stopped)

    async def run_once(self) -> list[TaskFire]:
        """One dispatch round now; answers the occurrences it fired."""
        async with self._round_lock:
            return await self._round()

    async def __aenter__(self) -> JobScheduler:
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

    def _accept(self, reason: str) -> None:
        if self._status == "running":
            self._status = "stopping"
            log_event(logging.INFO, "jobs.scheduler.draining", signal=reason)
        self._dispatching = False
        self._wakeup.ring()

    async def _close(self, budget: float | None) -> None:
        if self._status in ("new", "stopped"):
            return
        self._deadline.bind_in(lifecycle_deadline() if budget is None else budget)
        await self._wind_down()

    async def _wind_down(self) -> None:
        if self._winding is None:
            self._winding = asyncio.get_running_loop().create_task(self._finish())
        await asyncio.shield(self._winding)

    async def _finish(self) -> None:
        loop_task = self._loop_task
        finished = loop_task is None or await self._deadline.wait_for(
            asyncio.gather(loop_task, return_exceptions=True)
        )
        if not finished:
            log_event(
                logging.ERROR,
                "jobs.scheduler.drain-abandoned",
                fix="the round in flight keeps the leader lease, which expires on its own",
            )
        elif self._leading:
            try:
                await self._leader.release()
            except Exception as exc:
                log_event(logging.WARNING, "jobs.scheduler.leader-failed", error=repr(exc))
            self._leading = False
        for remove in self._unregister:
            remove()
        self._status = "stopped"
        self._stopped.set()
        log_event(logging.INFO, "jobs.scheduler.stopped")

    # -- rounds ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while self._dispatching:
            try:
                await self.run_once()
            except Exception as exc:
                log_event(logging.ERROR, "jobs.scheduler.tick-failed", error=repr(exc))
            # A round at least every renewal interval, whatever the tick: renewals ride on
            # rounds, and a late one would let the lease lapse under this leader.
            await self._wakeup.wait(self._clock, min(self._tick, self._renew_every.total_seconds()))

    async def _round(self) -> list[TaskFire]:
        now = self._clock.now()
        if not await self._lead(now):
            return []
        await self._rollup(now)
        tasks = self.tasks
        if self._marks is None or any(task.name not in self._due for task in tasks):
            await self._load(tasks, now)
        due = [task for task in tasks if self._due[task.name] <= now]
        if not due:
            return []
        paused = await self._paused()
        fires: list[TaskFire] = []
        for task in due:
            if task.name in paused:
                self._due[task.name] = now + timedelta(seconds=PAUSE_RECHECK_S)
                continue
            try:
                fires.extend(await self._dispatch(task, now))
            except Exception as exc:  # one task's failure must not hold back the ones after it
                log_event(
                    logging.ERROR, "jobs.scheduler.tick-failed", task=task.name, error=repr(exc)
                )
        return fires

    async def _lead(self, now: datetime) -> bool:
        if _not_yet(now, self._next_leader_check, self._renew_every):
            return self._leading
        try:
            leading = await self._leader.acquire()
        except Exception as exc:
            log_event(logging.WARNING, "jobs.scheduler.leader-failed", error=repr(exc))
            leading = False
        self._next_leader_check = now + self._renew_every
        if leading != self._leading:
            self._leading = leading
            self._marks = None  # another leader moved them meanwhile: read them again
            log_event(
                logging.INFO, "jobs.scheduler.leading" if leading else "jobs.scheduler.standby"
            )
        return leading

    async def _rollup(self, now: datetime) -> None:
        introspect = self._driver.introspect
        if introspect is None or _not_yet(now, self._next_rollup, _ROLLUP_INTERVAL):
            return
        self._next_rollup = now + _ROLLUP_INTERVAL
        try:
            await introspect.rollup_counters()
        except Exception as exc:
            log_event(logging.WARNING, "jobs.scheduler.rollup-failed", error=repr(exc))

    async def _load(self, tasks: Sequence[AnyTaskHandle], now: datetime) -> None:
        """Read every watermark once for this term; arm the tasks that have none at now."""
        marks = await self._state.watermarks([task.name for task in tasks])
        now_ms = occurrence_ms(now)
        for task in tasks:
            if task.name not in marks:
                await self._state.arm(task.name, now_ms)
                marks[task.name] = now_ms
        self._marks = marks
        self._due = {task.name: self._next_after(task, marks[task.name]) for task in tasks}

    def _next_after(self, task: AnyTaskHandle, mark: int) -> datetime:
        return next_occurrence(task.cron, task.zone, instant_of(mark))

    async def _paused(self) -> set[str]:
        introspect = self._driver.introspect
        if introspect is None:
            return set()
        return set(await introspect.paused_tasks())

    async def _dispatch(self, task: AnyTaskHandle, now: datetime) -> list[TaskFire]:
        assert self._marks is not None
        after = instant_of(self._marks[task.name])
        fires: list[TaskFire] = []
        if task.catch_up == "run-all":
            for _ in range(task.max_catch_up):
                occurrence = next_occurrence(task.cron, task.zone, after)
                if occurrence > now:
                    break
                fired = await self._fire(task, occurrence, occurrence)
                if fired is None:
                    break
                fires.append(fired)
                after = occurrence
        else:
            latest = latest_occurrence(task.cron, task.zone, after, now)
            if latest is not None:  # always, as the task is due; none leaves it to its next
                earliest = latest
                if task.catch_up == "run-once":
                    earliest = next_occurrence(task.cron, task.zone, after)
                fired = await self._fire(task, earliest, latest)
                if fired is not None:
                    fires.append(fired)
        self._due[task.name] = self._next_after(task, self._marks[task.name])
        return fires

    async def _fire(
        self, task: AnyTaskHandle, occurrence: datetime, watermark: datetime
    ) -> TaskFire | None:
        """Fire ``occurrence``'s jobs and move the watermark to ``watermark``, together."""
        assert self._marks is not None
        previous = self._marks[task.name]
        fired_ms, mark_ms = occurrence_ms(occurrence), occurrence_ms(watermark)
        try:
            requests = task.requests(fired_ms, clock=self._clock)
        except Exception as exc:
            log_event(
                logging.ERROR,
                "jobs.scheduler.task-invalid",
                task=task.name,
                occurrence_ms=fired_ms,
                code=error_code(exc),
                error=str(exc),
                fix="this occurrence is passed over; fix the task's enqueue",
            )
            await self._state.arm(task.name, mark_ms)
            self._marks[task.name] = mark_ms
            return None
        try:
            enqueued = await self._state.fire(
                task.name, mark_ms, requests, previous=previous, fired_ms=fired_ms
            )
        except Exception as exc:
            log_event(
                logging.WARNING,
                "jobs.scheduler.fire-failed",
                task=task.name,
                occurrence_ms=fired_ms,
                error=repr(exc),
            )
            return None
        if enqueued is None:
            held = await self._state.watermarks([task.name])
            self._marks[task.name] = held.get(task.name, previous)
            log_event(logging.INFO, "jobs.scheduler.fire-lost", task=task.name)
            return None
        self._marks[task.name] = mark_ms
        await self._record(task.name, fired_ms)
        for queue in {r.queue for r, e in zip(requests, enqueued, strict=True) if not e.deduped}:
            signal_enqueued(queue)
        log_event(logging.INFO, "jobs.scheduler.fired", task=task.name, occurrence_ms=fired_ms)
        return TaskFire(task.name, fired_ms, self._clock.now())

    async def _record(self, task: str, fired_ms: int) -> None:
        introspect = self._driver.introspect
        if self._state.records_fires or introspect is None:
            return
        try:
            await introspect.record_task_fire(task, fired_ms)
        except Exception as exc:
            log_event(logging.WARNING, "jobs.scheduler.record-failed", task=task, error=repr(exc))


def job_scheduler(
    *,
    driver: JobDriver,
    leader: Leader | None = None,
    state: SchedulerState | None = None,
    tasks: Sequence[AnyTaskHandle] | None = None,
    clock: Clock | None = None,
    tick_interval: Duration = 1.0,
    leader_renew_interval: Duration | None = None,
) -> JobScheduler:
    """A scheduler over ``tasks`` (every registered task when omitted).

    ``leader_renew_interval`` is how often the leader renews its lease and a standby asks for it:
    by default a third of the ``leader``'s ``ttl`` when it states one (a ``LeaseLeader``, as
    ``lease_store_leader``, ``postgres_lease_leader`` and ``redis_lease_leader`` do), else
    ``LEADER_RENEW_S`` (10 s). One given explicitly must be shorter than the ``ttl``:
    ``X_INVARIANT`` here otherwise. Renewals ride on rounds, so a ``tick_interval`` longer than
    the renewal interval is shortened to it.

    Pass ``state`` and ``leader`` in any real deployment: the defaults — watermarks in memory and
    "always the leader" — both fail silently across restarts and replicas, and say so in the log.
    """
    return JobScheduler(
        driver=driver,
        leader=leader,
        state=state,
        tasks=tasks,
        clock=clock,
        tick_interval=tick_interval,
        leader_renew_interval=leader_renew_interval,
    )
