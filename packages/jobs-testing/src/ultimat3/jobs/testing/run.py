"""``run_jobs``: drive queued work to quiescence in a test, under a frozen clock.

It is the worker's claim round without the worker: claim, run each attempt with
``execute_job``, and when nothing is due move the ``FrozenClock`` straight to the next row that
will be (a backoff, a ``step.sleep``, a delayed enqueue, a ``wait_for_event`` poll) instead of
waiting for it. Attempts run one at a time, in due order, so a test reads them as a script.

Inside an attempt the frozen clock is moved only when the attempt looks stuck on it: a job
``timeout`` over a hung body would otherwise hang the test. Whether a body is hung or only slow
cannot be told from outside, so "stuck" is a real-time judgement (``stuck_after``): no thread work
in flight and the attempt still unfinished that long after it began or the clock last moved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs.core import (
    MAX_JOB_PAGE,
    AnyJobHandle,
    ClaimBatch,
    ClaimedJob,
    EventBus,
    FrozenClock,
    InvariantError,
    JobDriver,
    JobExecution,
    JobFilter,
    JobState,
    NackOptions,
    execute_job,
    job_cursor,
    registered_jobs,
)
from ultimat3.jobs.core.constants import DEFAULT_VISIBILITY_TIMEOUT_S
from ultimat3.jobs.core.execute import announce_exhausted
from ultimat3.jobs.core.registry import job_named
from ultimat3.jobs.core.threads import in_thread

__all__ = ["DEFAULT_ATTEMPTS_GUARD", "DEFAULT_STUCK_AFTER_S", "RunawayJobsError", "run_jobs"]

DEFAULT_ATTEMPTS_GUARD = 1_000
"""Attempts ``run_jobs`` makes before it calls the work runaway."""

DEFAULT_STUCK_AFTER_S = 1.0
"""Real seconds an attempt may stay unfinished, with no thread work in flight, before
``run_jobs`` takes it to be waiting on the frozen clock. Far above a local server's round trip
(a slow one would fire a job ``timeout`` falsely); the price is that long in a test whose body
really hangs under a ``timeout``."""

_POLL_S = 0.01
"""How often a running attempt is looked at: often enough to see a short thread step."""

_THREAD_CALLS = frozenset({asyncio.to_thread.__code__, in_thread.__code__})
"""The coroutines a task waits in while a thread works: a body's own ``asyncio.to_thread``, and
the runner's for a sync body or a sync ``step.run``."""

_WAITING = (JobState.READY, JobState.DELAYED, JobState.SUSPENDED)
_PROBE_HORIZON = timedelta(days=400)


class RunawayJobsError(AssertionError):
    """Work that never went quiet: ``executions`` holds every attempt ``run_jobs`` made."""

    def __init__(self, message: str, executions: list[JobExecution]) -> None:
        super().__init__(message)
        self.executions = executions


async def run_jobs(
    driver: JobDriver,
    *,
    jobs: Iterable[AnyJobHandle] | None = None,
    services: Any = None,
    clock: FrozenClock | None = None,
    queues: Iterable[str] | None = None,
    events: EventBus | None = None,
    max_attempts_guard: int = DEFAULT_ATTEMPTS_GUARD,
    worker_id: str = "run-jobs",
    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT_S,
    stuck_after: float = DEFAULT_STUCK_AFTER_S,
) -> list[JobExecution]:
    """Run every due attempt until nothing is queued or will come due; answer them in order.

    - ``jobs``: the handles to route rows to (default: every registered job). Unless ``queues``
      is given, only their queues are served; with neither, every queue that holds rows.
    - ``services``: what a body sees as ``ctx.services``.
    - ``clock``: the ``FrozenClock`` the driver runs on (default ``driver.clock``). When nothing
      is due it is set to the next ``run_at`` of a waiting row; while an attempt is stuck (see
      ``stuck_after``) it is set to the deadline of the earliest sleep on it (a job ``timeout``).
    - ``events``: the bus ``step.wait_for_event`` reads (default: the one ``publish_event``
      goes to — the bus ``set_event_bus`` installed, else ``driver.events``).
    - ``max_attempts_guard``: after this many attempts with work still due, raise
      ``RunawayJobsError`` — a wait nobody answers polls forever.
    - ``stuck_after``: real seconds an attempt may stay unfinished, while no thread of it
      (``step.run`` of a sync function, ``asyncio.to_thread``) is running, before it is taken to
      be waiting on the clock and the clock jumps to its earliest sleeper. Raise it when a body
      under a ``timeout`` does real I/O slower than that (else the timeout fires falsely); lower
      it so a test of a hung body under a ``timeout`` ends sooner.

    Rows in paused queues, and rows another worker holds, are left alone. A lease that lapsed
    on a final attempt is buried by the claim and announced, exactly as the worker does.
    """
    clock = _frozen_clock(driver, clock)
    if not stuck_after > 0:
        raise ValueError(
            f"stuck_after={stuck_after!r}: give the real seconds an attempt may run before it is "
            f"taken to be stuck on the clock, more than 0 (default {DEFAULT_STUCK_AFTER_S})"
        )
    handles = list(jobs) if jobs is not None else None
    by_name = {handle.name: handle for handle in handles or ()}
    served = set(queues) if queues is not None else None
    if served is None and handles is not None:
        served = {handle.queue for handle in handles}
    everyone = handles if handles is not None else registered_jobs()
    drop_exhausted = frozenset(h.name for h in everyone if not h.retry.dead_letter)

    def handle_for(name: str) -> AnyJobHandle | None:
        return by_name.get(name) or job_named(name)

    executions: list[JobExecution] = []
    waiting = _NextDue(driver, served)
    while True:
        queue_names = served if served is not None else await _queues_with_rows(driver)
        batch = ClaimBatch()
        if queue_names:
            batch = await driver.claim(
                worker_id=worker_id,
                slots=dict.fromkeys(sorted(queue_names), 1),
                visibility_timeout=visibility_timeout,
                drop_exhausted=drop_exhausted,
            )
        for buried in batch.exhausted:
            await announce_exhausted(buried, handle=handle_for(buried.name))
        if batch.jobs:
            ordered = sorted(batch.jobs, key=lambda job: (job.run_at, job.id))
            for position, claimed in enumerate(ordered):
                if len(executions) >= max_attempts_guard:
                    await _hand_back(driver, ordered[position:], clock.now())
                    raise _runaway(executions)
                execution = await _attempt(
                    claimed, driver, handle_for(claimed.name), services, events, clock, stuck_after
                )
                executions.append(execution)
                waiting.note(execution)
            continue
        due = await waiting.next(clock.now())
        if due is None:
            return executions
        clock.set(due)


async def _hand_back(driver: JobDriver, unrun: Iterable[ClaimedJob], now: datetime) -> None:
    """Rows claimed but not run: ready again, uncounted, for the next ``run_jobs``."""
    for claimed in unrun:
        ref = claimed.claim
        await driver.nack(
            claimed.id, NackOptions(ref.worker_id, ref.claim, run_at=now, count_attempt=False)
        )


def _frozen_clock(driver: JobDriver, clock: FrozenClock | None) -> FrozenClock:
    chosen = clock if clock is not None else driver.clock
    if not isinstance(chosen, FrozenClock):
        raise InvariantError(
            "run_jobs moves time by advancing a FrozenClock, and the driver runs on "
            f"{chosen!r}; build the driver with clock=FrozenClock()"
        )
    if driver.clock.now() != chosen.now():
        raise InvariantError(
            "run_jobs was handed a clock the driver does not run on; pass the driver's own "
            "clock (or none: run_jobs reads driver.clock)"
        )
    return chosen


async def _queues_with_rows(driver: JobDriver) -> set[str]:
    return {entry.queue for entry in await driver.stats()}


async def _attempt(
    claimed: ClaimedJob,
    driver: JobDriver,
    handle: AnyJobHandle | None,
    services: Any,
    events: EventBus | None,
    clock: FrozenClock,
    stuck_after: float,
) -> JobExecution:
    """One attempt; once it is stuck (``stuck_after``), move the clock to its earliest sleeper."""
    attempt = asyncio.ensure_future(
        execute_job(
            claimed, driver=driver, handle=handle, services=services, events=events, clock=clock
        )
    )
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    while True:
        done, _ = await asyncio.wait({attempt}, timeout=min(_POLL_S, stuck_after))
        if done:
            return attempt.result()
        now = loop.time()
        if _thread_work_in_flight():
            quiet_since = now
        elif now - quiet_since >= stuck_after:
            wake = clock.next_wake()
            if wake is not None:
                clock.set(wake)
            quiet_since = now


def _thread_work_in_flight() -> bool:
    """Whether a task of this loop waits on a thread (``_THREAD_CALLS``; a sync ``step.run``
    does): a thread is working, so nothing is stuck yet."""
    return any(_awaits_a_thread(task) for task in asyncio.all_tasks())


def _awaits_a_thread(task: asyncio.Task[Any]) -> bool:
    awaited: Any = task.get_coro()
    while awaited is not None:
        if getattr(awaited, "cr_code", None) in _THREAD_CALLS:
            return True
        awaited = getattr(awaited, "cr_await", None)
    return False


def _runaway(executions: list[JobExecution]) -> RunawayJobsError:
    latest = sorted({execution.name for execution in executions[-10:]})
    return RunawayJobsError(
        f"run_jobs made {len(executions)} attempts and work is still due (latest: "
        f"{', '.join(latest)}). A job that keeps suspending (a wait_for_event nobody answers, "
        "a sleep in a loop) or that re-enqueues itself never goes quiet; raise "
        "max_attempts_guard= if the work really is that long",
        executions,
    )


class _NextDue:
    """When the next waiting row falls due: read off the operator surface when the driver has
    one, else from the attempts this run handed back, probing further ahead when rows wait
    that neither can date."""

    def __init__(self, driver: JobDriver, served: set[str] | None) -> None:
        self._driver = driver
        self._served = served
        self._resume: dict[str, datetime] = {}
        self._probe = timedelta(seconds=1)

    def note(self, execution: JobExecution) -> None:
        if execution.resume_at is not None:
            self._resume[execution.job_id] = execution.resume_at
        else:
            self._resume.pop(execution.job_id, None)
        self._probe = timedelta(seconds=1)

    async def next(self, now: datetime) -> datetime | None:
        if self._driver.introspect is not None:
            return await self._listed(now)
        known = [at for at in self._resume.values() if at > now]
        if known:
            return min(known)
        if not await self._rows_waiting():
            return None
        if self._probe > _PROBE_HORIZON:
            return None
        due, self._probe = now + self._probe, self._probe * 2
        return due

    async def _listed(self, now: datetime) -> datetime | None:
        introspect = self._driver.introspect
        assert introspect is not None
        paused = set(await introspect.paused_queues())
        earliest: datetime | None = None
        for state in _WAITING:
            after: str | None = None
            while True:
                page = await introspect.list(
                    JobFilter(state=state, limit=MAX_JOB_PAGE, after=after)
                )
                for row in page.rows:
                    if row.queue in paused or not self._serves(row.queue) or row.run_at <= now:
                        continue
                    if earliest is None or row.run_at < earliest:
                        earliest = row.run_at
                if page.last:
                    break
                after = job_cursor(page.rows[-1])
        return earliest

    async def _rows_waiting(self) -> bool:
        return any(
            entry.depth > 0 and self._serves(entry.queue)
            for entry in await self._driver.stats(include_done=False)
        )

    def _serves(self, queue: str) -> bool:
        return self._served is None or queue in self._served
