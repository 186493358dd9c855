"""One attempt of one claimed job, from parsing its input to telling ``on_settled``.

How an attempt ends decides where the row goes and what is counted:

============================  =============  ================  ==========
the attempt ended by          outcome        attempt counted   jobs_total
============================  =============  ================  ==========
the body returning            completed      —                 ok
step.sleep / wait_for_event   suspended      no                —
a throw, attempts left        retried        yes               failed
a throw, none left/terminal   dead-lettered  yes               dead
the same, dead_letter=False   dropped        yes               failed
the worker's drain            interrupted    no                —
a busy key, when_busy='fail'  refused        no                failed
============================  =============  ================  ==========

The verdict on an aborted attempt is read off the signal, not off whatever the body raised while
unwinding. ``on_settled`` runs only after the settle landed, under the job's tenant.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, cast

from .clock import Clock
from .constants import (
    ACK_RETRY_FIRST_S,
    ACK_RETRY_MAX_S,
    ON_SETTLED_ATTEMPTS,
    PROGRESS_INTERVAL_S,
    TIMEOUT_GRACE_S,
)
from .context import JobContext, JobOutcome, Settled, SettledOutcome, StopReason
from .errors import (
    DriverUnavailableError,
    InvariantError,
    JobAbortedError,
    JobDrainedError,
    JobInputInvalidError,
    JobKeyBusyError,
    JobOnSettledFailedError,
    JobsError,
    JobTenantMismatchError,
    JobTimeoutError,
    LeaseLostError,
)
from .events import resolve_event_bus
from .job import AnyJobHandle
from .jsonvalue import storable_form
from .logs import LOGGER, log_event
from .model import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    AckOptions,
    ClaimedJob,
    ExhaustedJob,
    JobState,
    NackOptions,
    Progress,
    StepRecord,
)
from .protocol import EventBus, JobDriver
from .registry import job_named
from .retry import (
    MAX_RETRY_DELAY_S,
    Retry,
    backoff_delay,
    equal_jitter,
    error_code,
    is_final_attempt,
    jitter_stated_delay,
    retry_after_seconds_of,
    retry_classification,
    retry_delay_cap,
)
from .signal import AbortController, AbortSignal, any_signal
from .steps import Step, StepSuspension
from .tenancy import Actor, use_actor

__all__ = [
    "FailureVerdict",
    "JobExecution",
    "announce_exhausted",
    "execute_job",
    "fail_job",
    "failure_verdict",
    "refuse_job",
]


@dataclass(slots=True)
class JobExecution:
    """What one attempt did. ``settled`` is False when the settle matched nothing (the claim had
    lapsed or the row was cancelled) — then nothing was written and nobody was told."""

    job_id: str
    run_id: str
    name: str
    attempt: int
    outcome: JobOutcome
    settled: bool
    result: Any = None
    error: BaseException | None = None
    stop_reason: StopReason | None = None
    resume_at: datetime | None = None
    """When the row is due again (retried, suspended, interrupted)."""
    progress: Progress | None = None
    on_settled_error: JobOnSettledFailedError | None = None
    trace: list[tuple[str, str]] = field(default_factory=list)
    duration_ms: int = 0

    @classmethod
    def begun(cls, claimed: ClaimedJob, outcome: JobOutcome = "lease-lost") -> JobExecution:
        """An attempt of ``claimed`` before it settled: nothing has landed yet."""
        return cls(
            job_id=claimed.id,
            run_id=claimed.run_id,
            name=claimed.name,
            attempt=claimed.attempt,
            outcome=outcome,
            settled=False,
        )


@dataclass(frozen=True, slots=True)
class FailureVerdict:
    """What a failed attempt becomes: retried after ``delay_s``, or finished for good."""

    kind: Literal["retried", "dead-lettered", "dropped"]
    delay_s: float = 0.0
    stop_reason: StopReason | None = None
    terminal_because: str | None = None
    """Why a terminal stop left attempts unspent."""


def failure_verdict(retry: Retry, attempt: int, error: BaseException) -> FailureVerdict:
    """The one decision every failed attempt goes through: an error no retry could end
    differently first (``JobsError.final_because``), then the error's classification, then the
    attempt count. An unclassified error keeps the attempt-count path."""
    classification = retry_classification(error)
    final = error.final_because if isinstance(error, JobsError) else None
    if final is None and classification == "terminal":
        final = "the error's code is classified terminal"
    stop: StopReason | None = None
    if final is not None:
        stop = "terminal"
    elif is_final_attempt(retry, attempt):
        stop = "attempts-exhausted"
    if stop is not None:
        kind: Literal["dead-lettered", "dropped"] = (
            "dead-lettered" if retry.dead_letter else "dropped"
        )
        return FailureVerdict(kind, stop_reason=stop, terminal_because=final)
    stated = retry_after_seconds_of(error) if classification == "retry-after" else None
    if stated is not None:
        delay = min(stated, retry_delay_cap(retry))
        if retry.jitter:  # spread forward, but never past the ceiling every retry keeps
            delay = min(jitter_stated_delay(delay), MAX_RETRY_DELAY_S)
    else:
        delay = backoff_delay(retry, attempt)
        delay = equal_jitter(delay) if retry.jitter else delay
    return FailureVerdict("retried", delay_s=delay)


@dataclass(slots=True)
class _Ending:
    """How the body stopped, before anything is settled. Not frozen: built once per attempt and
    read by this module alone, and a frozen dataclass pays an ``object.__setattr__`` per field."""

    kind: Literal["completed", "suspended", "interrupted", "lease-lost", "failed"]
    result: Any = None
    resume_at: datetime | None = None
    error: BaseException | None = None


@functools.lru_cache(maxsize=4_096)
def _job_actor(name: str, org_id: str | None) -> Actor:
    """Who a run of job ``name`` for ``org_id`` acts as. An actor is frozen, so one per pair
    serves every run: a busy worker does not build (and format the id of) one per attempt."""
    return Actor(id=f"job:{name}", org_id=org_id)


async def execute_job(
    claimed: ClaimedJob,
    *,
    driver: JobDriver,
    handle: AnyJobHandle | None = None,
    services: Any = None,
    signal: AbortSignal | None = None,
    events: EventBus | None = None,
    clock: Clock | None = None,
    on_body_done: Callable[[], Awaitable[None] | None] | None = None,
    holds_lease: Callable[[], bool] | None = None,
) -> JobExecution:
    """Run one claimed attempt to its settle.

    ``signal`` is the worker's: it fires ``X_DRAINING`` on a drain and ``X_JOB_LEASE_LOST`` when
    renewals stop landing or the row was cancelled. Cancelling this coroutine from outside
    settles nothing — exactly as if the worker had died. ``on_body_done`` is called once the body
    has ended, or once it is clear that it never starts (no such job, an input that does not
    parse), before the settle is sent (and awaited when it answers an awaitable): a worker
    gives back the run's fleet slot and then its worker slot there, so the next claim overlaps
    the settles still on their way and finds the key free.

    ``holds_lease`` answers whether the run still holds its lease (by default: until the
    claim's ``lease_until``). While it does, an ack that could not reach the driver is sent
    again: a completed job whose ack gave up would lapse instead, and on its final attempt be
    buried dead.
    """
    clock = clock or driver.clock
    handle = handle or job_named(claimed.name)
    started = time.monotonic()
    execution = JobExecution.begun(claimed)
    if handle is None:
        error = JobsError(
            f"no job named {claimed.name!r} is registered in this worker; deploy the code that "
            "declares it, or define_api() the module that does"
        )
        await _body_over(on_body_done)
        return await fail_job(claimed, driver=driver, handle=None, error=error, clock=clock)

    deadline = AbortController() if handle.timeout_s is not None else None
    if deadline is None:
        run_signal = signal or AbortSignal()
    else:
        run_signal = deadline.signal if signal is None else any_signal(signal, deadline.signal)
    value: Any = None
    try:
        value = handle.codec.parse(claimed.input)
        declared = handle.tenant_of(value)
        if handle.tenant != "none" and claimed.tenant_id != declared:
            raise JobTenantMismatchError(
                f"{handle.name}: the row was queued for org {claimed.tenant_id!r} but its input "
                f"names {declared!r}; re-enqueue it under the right org",
                meta={"job": handle.name},
            )
        actor = _job_actor(handle.name, declared)
    except Exception as exc:
        await _body_over(on_body_done)
        await _settle_failure(
            driver,
            handle,
            claimed,
            handle.retry,
            exc,
            None,
            execution,
            clock,
            parsed=value if not isinstance(exc, JobInputInvalidError) else None,
        )
        return execution

    attempt = _Attempt(claimed, driver, handle, value, actor, services, run_signal, events, clock)
    ending = await _run_body(attempt, deadline, run_signal)
    if attempt.step_if_built is not None:
        execution.trace = attempt.step_if_built.trace
    reporter = attempt.reporter_if_built
    if reporter is not None:
        await reporter.flush()
        execution.progress = reporter.latest
    execution.duration_ms = int((time.monotonic() - started) * 1000)
    await _body_over(on_body_done)

    if ending.kind == "completed":
        execution.result = ending.result
        options = AckOptions(claimed.claim.worker_id, claimed.claim.claim, execution.duration_ms)
        try:
            landed = await driver.ack(claimed.id, options)
        except DriverUnavailableError as exc:
            if holds_lease is None:
                holds_lease = functools.partial(_before, clock, claimed.lease_until)
            landed = await _ack_again(driver, claimed, options, holds_lease, exc)
        if not landed:
            return _unowned(execution, "ack")
        execution.outcome, execution.settled = "completed", True
        if handle.on_settled is not None:
            execution.on_settled_error = await _tell(
                handle, "completed", claimed, value, attempt.hook_context, result=ending.result
            )
    elif ending.kind == "suspended":
        assert ending.resume_at is not None
        await _hand_back(driver, claimed, execution, ending.resume_at, "suspended", park=True)
    elif ending.kind == "interrupted":
        execution.error = ending.error
        await _hand_back(driver, claimed, execution, clock.now(), "interrupted", park=False)
    elif ending.kind == "lease-lost":
        execution.error = ending.error
    else:
        assert ending.error is not None
        await _settle_failure(
            driver,
            handle,
            claimed,
            handle.retry,
            ending.error,
            attempt.hook_context,
            execution,
            clock,
            parsed=value,
        )
    return execution


def _before(clock: Clock, deadline: datetime) -> bool:
    return clock.now() < deadline


async def _ack_again(
    driver: JobDriver,
    claimed: ClaimedJob,
    options: AckOptions,
    holds_lease: Callable[[], bool],
    failure: DriverUnavailableError,
) -> bool:
    """The ack the driver could not deliver (``failure``), sent again after a pause while the
    driver stays unreachable and the run holds its lease. Repeating it is safe: it is fenced on
    the claim, and one that had landed before its answer was lost answers True again. Once the
    lease is gone, the last failure is raised."""
    pause = ACK_RETRY_FIRST_S
    while holds_lease():
        log_event(
            logging.WARNING,
            "jobs.ack.retrying",
            job=claimed.name,
            job_id=claimed.id,
            error=repr(failure),
            retry_in_s=pause,
        )
        await asyncio.sleep(pause)
        pause = min(pause * 2, ACK_RETRY_MAX_S)
        try:
            return await driver.ack(claimed.id, options)
        except DriverUnavailableError as exc:
            failure = exc
    raise failure


async def fail_job(
    claimed: ClaimedJob,
    *,
    driver: JobDriver,
    handle: AnyJobHandle | None,
    error: BaseException,
    clock: Clock | None = None,
) -> JobExecution:
    """Fail an attempt that cannot start — its concurrency key raised, the worker's context
    factory raised, no job of its name is registered — on the job's ordinary retry path, with the
    body never called. ``on_settled`` is told when the failure is final."""
    clock = clock or driver.clock
    execution = JobExecution.begun(claimed)
    retry = handle.retry if handle is not None else Retry(attempts=max(1, claimed.max_attempts))
    parsed: Any = None
    if handle is not None:
        try:
            parsed = handle.codec.parse(claimed.input)
        except JobInputInvalidError:
            parsed = None
    await _settle_failure(
        driver, handle, claimed, retry, error, None, execution, clock, parsed=parsed
    )
    return execution


class _Attempt:
    """What one attempt can hand its body, built only when the body (or its hook) asks:
    a no-op job that takes no ``step`` pays for no step runner."""

    def __init__(
        self,
        claimed: ClaimedJob,
        driver: JobDriver,
        handle: AnyJobHandle,
        value: Any,
        actor: Actor,
        services: Any,
        signal: AbortSignal,
        events: EventBus | None,
        clock: Clock,
    ) -> None:
        self.claimed, self.driver, self.handle, self.value = claimed, driver, handle, value
        self.actor, self.services, self.signal = actor, services, signal
        self.events, self.clock = events, clock
        self.context_if_built: JobContext[Any] | None = None
        self.step_if_built: Step | None = None
        self.reporter_if_built: _ProgressReporter | None = None

    @property
    def context(self) -> JobContext[Any]:
        if self.context_if_built is None:
            claimed = self.claimed
            self.context_if_built = JobContext(
                signal=self.signal,
                actor=self.actor,
                services=self.services,
                job_id=claimed.id,
                run_id=claimed.run_id,
                name=self.handle.name,
                attempt=claimed.attempt,
                log=logging.LoggerAdapter(LOGGER, {"job": self.handle.name, "job_id": claimed.id}),
            )
        return self.context_if_built

    @property
    def hook_context(self) -> JobContext[Any] | None:
        """The context ``on_settled`` is handed (``settled.ctx``), built only for a hook."""
        return self.context if self.handle.on_settled is not None else None

    @property
    def step(self) -> Step:
        if self.step_if_built is None:
            claimed, driver = self.claimed, self.driver

            async def store(record: StepRecord) -> bool:
                return await driver.save_step(claimed.id, claimed.claim, claimed.run_id, record)

            self.step_if_built = Step(
                store=store,
                steps=claimed.steps,
                signal=self.signal,
                clock=self.clock,
                events=resolve_event_bus(self.events, driver=self.driver),
                step_timeout=self.handle.step_timeout_s,
                event_poll=self.handle.event_poll_s,
            )
        return self.step_if_built

    @property
    def reporter(self) -> _ProgressReporter:
        if self.reporter_if_built is None:
            self.reporter_if_built = _ProgressReporter(
                self.driver, self.claimed, self.signal, self.clock
            )
        return self.reporter_if_built

    def argument(self, name: str) -> Any:
        if name == "input":
            return self.value
        if name == "step":
            return self.step
        if name == "ctx":
            return self.context
        if name == "progress":
            return self.reporter
        if name == "attempt":
            return self.claimed.attempt
        if name == "final_attempt":
            return is_final_attempt(self.handle.retry, self.claimed.attempt)
        if name == "job_id":
            return self.claimed.id
        if name == "run_id":
            return self.claimed.run_id
        raise KeyError(f"a job body cannot ask for {name!r}")


async def _run_body(
    attempt: _Attempt, deadline: AbortController | None, run_signal: AbortSignal
) -> _Ending:
    """Run the body; an abort cancels it and is read back off the signal.

    Without a timeout the body runs inline, in this task (no task per body keeps a no-op job
    cheap); a cancellation that came from outside (the worker itself dying) is told apart by
    ``cancelling()`` and re-raised. With one it runs as a task of its own, so the attempt can
    end at its deadline whatever the body does (``_within_deadline``)."""
    handle = attempt.handle
    available = {name: attempt.argument(name) for name in handle.parameters}
    current = asyncio.current_task()
    assert current is not None

    def cancel_body(_reason: BaseException) -> None:
        current.cancel()

    early = run_signal.reason
    if early is not None:  # aborted before the body could start: it never does
        return _aborted_ending(run_signal)
    expiry: asyncio.Task[None] | None = None
    if deadline is not None and handle.timeout_s is not None:
        timeout, clock, controller = handle.timeout_s, attempt.clock, deadline
        deadline_at = clock.now() + timedelta(seconds=timeout)

        async def expire() -> None:
            # Anchored at the attempt's start, not at whenever this task first runs.
            await clock.sleep((deadline_at - clock.now()).total_seconds())
            controller.abort(
                JobTimeoutError(
                    f"{handle.name}: the attempt exceeded its timeout of {timeout}s",
                    meta={"job": handle.name, "timeout_s": timeout},
                )
            )

        expiry = asyncio.create_task(expire())
    # Inline, an abort cancels this task. A body of its own is cancelled by _within_deadline, so
    # here a cancellation of this task always came from outside.
    inline = deadline is None
    if inline:
        run_signal.add_listener(cancel_body)
    try:
        with use_actor(attempt.actor):
            if deadline is None:
                result = await handle.call_body(available)
            else:
                result = await _within_deadline(
                    handle.call_body(available),
                    run_signal,
                    deadline.signal,
                    handle.name,
                    attempt.claimed.id,
                )
    except StepSuspension as suspension:
        return _Ending("suspended", resume_at=suspension.resume_at)
    except asyncio.CancelledError:
        if not inline or not run_signal.aborted or current.uncancel() > 0:
            raise
        return _aborted_ending(run_signal)
    except Exception as exc:
        if run_signal.aborted:
            if inline:
                _swallow_our_cancel(current)
            return _aborted_ending(run_signal)
        return _Ending("failed", error=exc)
    finally:
        if inline:
            run_signal.remove_listener(cancel_body)
        if expiry is not None:
            expiry.cancel()
    if run_signal.aborted:
        if inline:
            _swallow_our_cancel(current)
        if isinstance(run_signal.reason, JobTimeoutError):
            log_event(
                logging.ERROR, "jobs.timeout.abandoned", job=handle.name, job_id=attempt.claimed.id
            )
            return _Ending("failed", error=run_signal.reason)
    return _Ending("completed", result=result)


async def _body_over(on_body_done: Callable[[], Awaitable[None] | None] | None) -> None:
    if on_body_done is not None:
        done = on_body_done()
        if done is not None:
            await done


async def _within_deadline(
    body: Coroutine[Any, Any, Any],
    run_signal: AbortSignal,
    deadline: AbortSignal,
    job: str,
    job_id: str,
) -> Any:
    """``body`` as a task of its own, cancelled when ``run_signal`` aborts; a body that ended
    cancelled raises the abort's reason, so a CancelledError out of here is the caller's own.

    The attempt ends at its deadline whatever aborted it first: a body that ignores the cancel
    is waited for until then (a drain, a lost lease or a cancel), is given ``TIMEOUT_GRACE_S``
    from the deadline, and is then left behind, its step writes refused with ``X_ABORTED``, and
    logged as ``jobs.timeout.abandoned`` when it does finish. (Waiting for it, a body that never
    returns held its row, its lease and its slot for ever.) The attempt ends as its first abort
    says: a timeout fails it, a drain hands it back. A sync body ignores every cancel
    (``threads.in_thread``), so past its deadline it is always the one left behind.
    """
    task = asyncio.ensure_future(body)
    aborted = asyncio.get_running_loop().create_future()

    def on_abort(_reason: BaseException) -> None:
        task.cancel()
        if not aborted.done():
            aborted.set_result(None)

    unlisten = run_signal.add_listener(on_abort)
    try:
        await asyncio.wait((task, aborted), return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            expired = asyncio.ensure_future(deadline.wait())
            try:
                await asyncio.wait((task, expired), return_when=asyncio.FIRST_COMPLETED)
            finally:
                expired.cancel()
        if not task.done():
            await asyncio.wait((task,), timeout=TIMEOUT_GRACE_S)
    except asyncio.CancelledError:  # the worker itself is going: the body goes with it
        task.cancel()
        raise
    finally:
        unlisten()
        aborted.cancel()
    reason = run_signal.reason
    if task.done() and (reason is None or not task.cancelled()):
        return task.result()
    assert reason is not None  # only an abort leaves the body behind
    if not task.done():
        task.add_done_callback(lambda _: _log_abandoned(task, job, job_id))
    raise reason


def _log_abandoned(task: asyncio.Task[Any], job: str, job_id: str) -> None:
    if not task.cancelled():
        task.exception()  # read: what a body left behind raises is nobody's to handle
    log_event(logging.ERROR, "jobs.timeout.abandoned", job=job, job_id=job_id)


def _swallow_our_cancel(current: asyncio.Task[Any]) -> None:
    """The body caught the cancel the abort sent and ended anyway: take that cancel back so it
    does not land on the settle that follows."""
    if current.cancelling():
        current.uncancel()


def _aborted_ending(run_signal: AbortSignal) -> _Ending:
    reason = run_signal.reason
    assert reason is not None
    if isinstance(reason, JobDrainedError):
        return _Ending("interrupted", error=reason)
    if isinstance(reason, LeaseLostError):
        return _Ending("lease-lost", error=reason)
    return _Ending("failed", error=reason)


async def _hand_back(
    driver: JobDriver,
    claimed: ClaimedJob,
    execution: JobExecution,
    run_at: datetime,
    outcome: Literal["suspended", "interrupted"],
    *,
    park: bool,
) -> None:
    error = None if execution.error is None else _error_text(execution.error)
    landed = await driver.nack(
        claimed.id,
        NackOptions(
            claimed.claim.worker_id,
            claimed.claim.claim,
            error=error,
            run_at=run_at,
            park=park,
            count_attempt=False,
        ),
    )
    if not landed:
        _unowned(execution, "nack")
        return
    execution.outcome, execution.settled, execution.resume_at = outcome, True, run_at


async def _settle_failure(
    driver: JobDriver,
    handle: AnyJobHandle | None,
    claimed: ClaimedJob,
    retry: Retry,
    error: BaseException,
    ctx: JobContext[Any] | None,
    execution: JobExecution,
    clock: Clock,
    *,
    parsed: Any = None,
) -> None:
    verdict = failure_verdict(retry, claimed.attempt, error)
    execution.error = error
    execution.stop_reason = verdict.stop_reason
    text = _error_text(error)
    if verdict.stop_reason == "terminal":
        text += (
            f"\n[terminal: {verdict.kind} on attempt {claimed.attempt} of {claimed.max_attempts}; "
            f"{verdict.terminal_because}, so no attempt was left to spend]"
        )
    run_at = clock.now() + timedelta(seconds=verdict.delay_s)
    options = NackOptions(
        claimed.claim.worker_id,
        claimed.claim.claim,
        error=text,
        run_at=run_at if verdict.kind == "retried" else None,
        dead_letter=verdict.kind == "dead-lettered",
        fail=verdict.kind == "dropped",
        duration_ms=execution.duration_ms,
    )
    log_event(
        logging.WARNING if verdict.kind == "retried" else logging.ERROR,
        "jobs.attempt.failed",
        job=claimed.name,
        job_id=claimed.id,
        attempt=claimed.attempt,
        code=error_code(error),
        stop=verdict.stop_reason,
        error=str(error),
    )
    if not await driver.nack(claimed.id, options):
        _unowned(execution, "nack")
        return
    execution.outcome, execution.settled = verdict.kind, True
    if verdict.kind == "retried":
        execution.resume_at = run_at
    elif handle is not None:
        execution.on_settled_error = await _tell(
            handle, verdict.kind, claimed, parsed, ctx, error=error
        )


def _unowned(execution: JobExecution, what: str) -> JobExecution:
    log_event(
        logging.WARNING,
        "jobs.settle.unowned",
        job=execution.name,
        job_id=execution.job_id,
        settle=what,
    )
    execution.outcome, execution.settled = "lease-lost", False
    return execution


def _error_text(error: BaseException) -> str:
    """``last_error`` as an operator reads it: code and message, then the stack, in a form every
    driver stores (a message holding a NUL character or a lone surrogate would otherwise fail
    the settle on Postgres or Redis, and leave the row to lapse)."""
    head = str(error) if isinstance(error, JobsError) else f"{type(error).__name__}: {error}"
    stack = "".join(traceback.format_exception(error)).strip()
    text = f"{head}\n{stack}" if stack and error.__traceback__ is not None else head
    return storable_form(text[:8000])


def _hook_org(handle: AnyJobHandle, claimed: ClaimedJob | ExhaustedJob, value: Any) -> str | None:
    """The org ``on_settled`` runs under: the input's declared tenant, as the body ran under —
    or the row's own when there is no input to read it from, or the tenant function raises on
    this input (the failure that may have ended the run: the hook is still told)."""
    if value is None:
        return claimed.tenant_id
    try:
        return handle.tenant_of(value)
    except Exception:
        return claimed.tenant_id


async def _tell(
    handle: AnyJobHandle,
    outcome: SettledOutcome,
    claimed: ClaimedJob | ExhaustedJob,
    value: Any,
    ctx: JobContext[Any] | None,
    *,
    result: Any = None,
    error: BaseException | None = None,
) -> JobOnSettledFailedError | None:
    """Call ``on_settled`` up to ``ON_SETTLED_ATTEMPTS`` times; log and answer the failure,
    never raise it."""
    hook = handle.on_settled
    if hook is None:
        return None
    settled: Settled[Any] = Settled(
        outcome=outcome,
        name=handle.name,
        job_id=claimed.id,
        run_id=claimed.run_id,
        attempt=claimed.attempt,
        input=value,
        result=result,
        error=error,
        code=error_code(error) if error is not None else None,
        ctx=ctx,
    )
    org = _hook_org(handle, claimed, value)
    last: BaseException | None = None
    with use_actor(_job_actor(handle.name, org)):
        for _ in range(ON_SETTLED_ATTEMPTS):
            try:
                answer = hook(settled)
                if inspect.isawaitable(answer):
                    await answer
                return None
            except Exception as exc:
                last = exc
    failure = JobOnSettledFailedError(
        f"{handle.name}: on_settled threw on all {ON_SETTLED_ATTEMPTS} tries: {last!r}",
        meta={"job": handle.name, "job_id": claimed.id, "outcome": outcome},
    )
    failure.__cause__ = last
    log_event(
        logging.ERROR,
        "jobs.on-settled.failed",
        job=handle.name,
        job_id=claimed.id,
        outcome=outcome,
        code=failure.code,
        error=repr(last),
    )
    return failure


async def refuse_job(
    claimed: ClaimedJob,
    *,
    driver: JobDriver,
    handle: AnyJobHandle,
    value: Any,
    error: JobKeyBusyError,
) -> JobExecution:
    """Settle a run its busy key refused (``when_busy='fail'``): failed, attempt uncounted, the
    body never started, ``on_settled`` told ``refused``."""
    execution = JobExecution.begun(claimed, outcome="refused")
    execution.error = error
    landed = await driver.nack(
        claimed.id,
        NackOptions(
            claimed.claim.worker_id,
            claimed.claim.claim,
            error=_error_text(error),
            fail=True,
            count_attempt=False,
        ),
    )
    if not landed:
        return _unowned(execution, "nack")
    execution.settled = True
    execution.on_settled_error = await _tell(handle, "refused", claimed, value, None, error=error)
    return execution


async def announce_exhausted(
    exhausted: ExhaustedJob, *, handle: AnyJobHandle | None
) -> JobOnSettledFailedError | None:
    """Tell the world a claim buried ``exhausted``: ``jobs.claim.exhausted`` at error, and the
    job's ``on_settled`` (dead-lettered, or dropped when the row went to failed)."""
    log_event(
        logging.ERROR,
        "jobs.claim.exhausted",
        job=exhausted.name,
        job_id=exhausted.id,
        attempt=exhausted.attempt,
        state=exhausted.state.value,
    )
    if handle is None:
        return None
    try:
        value = handle.codec.parse(exhausted.input)
    except JobInputInvalidError:
        value = None
    outcome: SettledOutcome = "dropped" if exhausted.state is JobState.FAILED else "dead-lettered"
    return await _tell(
        handle, outcome, exhausted, value, None, error=RuntimeError(LEASE_LAPSED_FINAL_ATTEMPT)
    )


def _check_progress(done: object, total: object, note: object) -> None:
    """What a body reports, refused (``X_INVARIANT``) where no driver stores it: a count that is
    not a finite number (NaN is JSON to none of them), a note that is not text."""
    for field_name, value in (("done", done), ("total", total)):
        if value is None and field_name == "total":
            continue
        finite = isinstance(value, int | float) and not isinstance(value, bool)
        if not finite or not math.isfinite(cast(float, value)):
            raise InvariantError(
                f"progress {field_name} must be a finite number, got {value!r:.80}",
                meta={"field": field_name},
            )
    if note is not None and not isinstance(note, str):
        raise InvariantError(
            f"progress note must be a string, got {note!r:.80}", meta={"field": "note"}
        )


class _ProgressReporter:
    """``progress(done, total, note)`` for a body: at most one write per second per run, plus
    the last one before the settle. Writes after the abort are refused (``X_ABORTED``)."""

    def __init__(
        self, driver: JobDriver, claimed: ClaimedJob, signal: AbortSignal, clock: Clock
    ) -> None:
        self._introspect = driver.introspect
        self._claimed = claimed
        self._signal = signal
        self._clock = clock
        self.latest: Progress | None = None
        self._written: Progress | None = None
        self._last_write: datetime | None = None
        self._sending: asyncio.Future[None] | None = None
        """The last write sent; each waits for the one before it."""
        self._loop = asyncio.get_running_loop()

    def __call__(self, done: float, total: float | None = None, note: str | None = None) -> None:
        if self._signal.aborted:
            raise JobAbortedError("progress reported after the attempt was aborted")
        _check_progress(done, total, note)
        progress = Progress(done=done, total=total, note=note)
        try:
            on_the_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:  # a sync body reports from its thread
            on_the_loop = False
        if on_the_loop:
            self._report(progress)
        else:
            self._loop.call_soon_threadsafe(self._report, progress)

    def _report(self, progress: Progress) -> None:
        self.latest = progress
        now = self._clock.now()
        due = self._last_write is None or (now - self._last_write).total_seconds() >= (
            PROGRESS_INTERVAL_S
        )
        if due and self._introspect is not None:
            self._last_write = now
            self._write(self.latest)

    def _write(self, progress: Progress) -> None:
        self._written = progress
        self._sending = asyncio.ensure_future(self._send(self._sending, progress))

    async def _send(self, before: asyncio.Future[None] | None, progress: Progress) -> None:
        """One write, sent once the one before it has landed: each overwrites the row's
        progress, and two in flight at once (two pooled connections) could land out of order,
        leaving an older report on the row for good."""
        assert self._introspect is not None
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        await self._introspect.record_progress(self._claimed.id, self._claimed.claim, progress)

    async def flush(self) -> None:
        if (
            self._introspect is not None
            and self.latest is not None
            and self.latest != self._written
        ):
            self._write(self.latest)
        if self._sending is not None:
            await asyncio.gather(self._sending, return_exceptions=True)
