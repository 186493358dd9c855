"""Durable steps: the replay that makes a retry resume instead of redo.

``step.run(name, fn)`` runs ``fn`` once ever per run: its result is stored before the next step
starts, and a later attempt reads it back instead of calling ``fn``. The stored form is the JSON
round trip, and the first run returns that same form, so an attempt never sees a value a replay
would not. ``step.sleep`` and ``step.wait_for_event`` suspend the run (control flow, never a
failure, no attempt burned) and the queue redelivers it when it is due.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeAlias

from .clock import Clock
from .constants import MAX_NAME_BYTES, TIMEOUT_GRACE_S
from .durations import Duration, parse_duration
from .errors import (
    EventWaitTimeoutError,
    InvariantError,
    JobAbortedError,
    JobTimeoutError,
    LeaseLostError,
    StepDuplicateError,
    StepOutputInvalidError,
)
from .jsonvalue import json_roundtrip, storable_name
from .logs import log_event
from .model import JsonValue, StepKind, StepRecord
from .protocol import EventBus
from .signal import AbortController, AbortSignal
from .threads import in_thread, outlast

__all__ = ["Step", "StepStore", "StepSuspension"]


class StepSuspension(BaseException):
    """Raised through the body to park the run until ``resume_at``.

    A ``BaseException`` so a body's ``except Exception`` cannot swallow it: suspension is
    control flow, never an error.
    """

    def __init__(self, resume_at: datetime, reason: str) -> None:
        super().__init__(f"suspended until {resume_at.isoformat()} ({reason})")
        self.resume_at = resume_at
        self.reason = reason


_CALL_OF: dict[StepKind, str] = {
    "run": "step.run",
    "sleep": "step.sleep",
    "wait": "step.wait_for_event",
}
"""The call that takes each kind of step, for messages that name both kinds."""

StepStore: TypeAlias = Callable[[StepRecord], Awaitable[bool]]
"""Persists one step, fenced on the attempt's claim; answers False when the claim no longer
holds the row."""


class Step:
    """The ``step`` a body receives: one per attempt, over the run's stored steps."""

    def __init__(
        self,
        *,
        store: StepStore,
        steps: Mapping[str, StepRecord],
        signal: AbortSignal,
        clock: Clock,
        events: EventBus,
        step_timeout: float | None = None,
        event_poll: float = 30.0,
    ) -> None:
        self._store = store
        self._steps = dict(steps)
        self._signal = signal
        self._clock = clock
        self._events = events
        self._step_timeout = step_timeout
        self._event_poll = event_poll
        self._seen: set[str] = set()
        self._next_seq = max((s.seq for s in steps.values()), default=-1) + 1
        self._started: dict[str, int] = {}
        """name -> the seq a new step took when it STARTED: ``from_step`` cuts by the order steps
        started in, and steps run side by side finish in another."""
        self.trace: list[tuple[str, str]] = []
        """(step name, 'ran' | 'replayed' | 'suspended' | 'failed') in the order they happened."""

    @property
    def records(self) -> Mapping[str, StepRecord]:
        return self._steps

    def _enter(self, name: str, kind: StepKind) -> StepRecord | None:
        if not isinstance(name, str) or not name or not storable_name(name):
            # Checked before the step runs: a name no store can hold (Postgres text holds no NUL,
            # no driver a lone surrogate, no index a name past MAX_NAME_BYTES) would otherwise
            # fail the save after the step's side effect, on every attempt.
            raise InvariantError(
                f"step names must be non-empty strings of at most {MAX_NAME_BYTES} bytes with no "
                f"NUL character and no lone surrogate, got {name!r:.80}",
                meta={"step": repr(name)[:80]},
            )
        if name in self._seen:
            raise StepDuplicateError(
                f"step {name!r} ran twice in one run; step names are the replay key and must be "
                "unique — add the loop variable or the row id to the name",
                meta={"step": name},
            )
        self._seen.add(name)
        reason = self._signal.reason
        if reason is not None:  # every step past the abort is refused, whatever aborted it
            raise JobAbortedError(
                f"step {name!r} began after the attempt was aborted; it does not run",
                meta={"step": name, "reason": repr(reason)},
            ) from reason
        held = self._steps.get(name)
        if held is None:
            self._started[name] = self._allocate_seq()
        elif held.kind is not None and held.kind != kind:
            # The run's code changed between attempts and reused the name for another kind of
            # step: replaying that record would hand this step a value it never produced.
            raise StepDuplicateError(
                f"step {name!r} is a {kind!r} step ({_CALL_OF[kind]}) but this run stored a "
                f"{held.kind!r} step ({_CALL_OF[held.kind]}) under that name; step names are the "
                "replay key and one name holds one kind of step — give the new step a new name",
                meta={"step": name, "kind": kind, "stored_kind": held.kind},
            )
        return held

    async def _save(
        self, name: str, kind: StepKind, output: JsonValue, *, completed: bool = True
    ) -> None:
        if self._signal.aborted:
            raise JobAbortedError(
                f"step {name!r} finished after the attempt was aborted; its result is discarded",
                meta={"step": name, "reason": repr(self._signal.reason)},
            )
        held = self._steps.get(name)
        record = StepRecord(
            name=name,
            seq=held.seq if held is not None else self._started[name],
            output=output,
            completed=completed,
            kind=kind,
        )
        if not await self._store(record):
            if self._signal.aborted:
                raise JobAbortedError(f"step {name!r} was refused: the attempt was aborted")
            raise LeaseLostError(
                f"step {name!r} was refused: this worker no longer holds the job's claim",
                meta={"step": name},
            )
        self._steps[name] = record

    def _allocate_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    async def run(self, name: str, fn: Callable[..., Any]) -> Any:
        """Run ``fn`` once ever for this run and answer its stored result.

        ``fn`` receives the step's abort signal when it has a required positional parameter;
        a sync ``fn`` runs in a thread. With the job's ``step_timeout``, the step's signal
        aborts at the ceiling and the step fails with ``X_JOB_TIMEOUT``.
        """
        held = self._enter(name, "run")
        if held is not None and held.completed:
            self.trace.append((name, "replayed"))
            return held.output
        controller = AbortController()
        # The step's signal fires with the run's, or at the step's own ceiling; the link to the
        # run's signal is undone after the step so a long run does not collect one per step.
        unlink = self._signal.add_listener(controller.abort)
        try:
            value = await self._call(name, fn, controller)
        except BaseException:
            self.trace.append((name, "failed"))
            raise
        finally:
            unlink()
        try:
            output = json_roundtrip(value)
        except (TypeError, ValueError) as exc:
            self.trace.append((name, "failed"))
            raise StepOutputInvalidError(
                f"step {name!r} returned a value that cannot be stored as JSON: {exc}",
                meta={"step": name},
            ) from exc
        await self._save(name, "run", output)
        self.trace.append((name, "ran"))
        return output

    async def _call(self, name: str, fn: Callable[..., Any], controller: AbortController) -> Any:
        args = (controller.signal,) if _takes_argument(fn) else ()
        if inspect.iscoroutinefunction(fn):
            work: Awaitable[Any] = fn(*args)
        else:
            work = _call_sync(fn, args)
        if self._step_timeout is None:
            return await work
        # The ceiling runs on the job's clock beside the step. The body being cancelled (a
        # deadline, a drain) cancels the step's work and waits for it to end before unwinding:
        # nothing of it may go on after the attempt handed its row back (a sync step is a thread
        # nothing can stop, waited for as a body that ignores its signal).
        task = asyncio.ensure_future(work)
        ceiling = asyncio.ensure_future(self._clock.sleep(self._step_timeout))
        try:
            await asyncio.wait((task, ceiling), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            ceiling.cancel()
            task.cancel()
            await outlast(task)
            raise
        ceiling.cancel()
        if task.done() and not task.cancelled():
            return task.result()
        reason = JobTimeoutError(
            f"step {name!r} exceeded its step_timeout of {self._step_timeout}s",
            meta={"step": name},
        )
        controller.abort(reason)
        # Past its ceiling the step's work is cancelled and given TIMEOUT_GRACE_S to end, as a
        # body past its timeout is; one that outlives it (a sync step) is left behind, and
        # logged when it does end.
        task.cancel()
        await asyncio.wait((task,), timeout=TIMEOUT_GRACE_S)
        if not task.done():
            task.add_done_callback(partial(_log_abandoned_step, name))
        raise reason

    async def sleep(
        self, name_or_duration: str | Duration, duration: Duration | None = None
    ) -> None:
        """Suspend the run until the duration has passed, on the worker's clock.

        ``step.sleep('3d')`` names the step after the duration; ``step.sleep('nudge-wait', '3d')``
        names it explicitly (two sleeps of one length in a run need names).
        """
        if duration is None:
            name, seconds = f"sleep:{name_or_duration}", parse_duration(name_or_duration)
        else:
            name, seconds = str(name_or_duration), parse_duration(duration)
        held = self._enter(name, "sleep")
        now = self._clock.now()
        if held is None:
            until = now + timedelta(seconds=max(0.0, seconds))
            await self._save(name, "sleep", {"until": until.isoformat()})
        else:
            until = datetime.fromisoformat(held.output["until"])
        if now >= until:
            self.trace.append((name, "replayed" if held is not None else "ran"))
            return
        self.trace.append((name, "suspended"))
        raise StepSuspension(until, f"sleep {name}")

    async def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        match: Mapping[str, JsonValue] | None = None,
        timeout: Duration | None = None,
        required: bool = False,
    ) -> JsonValue:
        """Suspend until an ``event`` whose payload contains ``match`` is published after this
        wait began; answers its payload. On ``timeout`` it answers None, or raises
        ``X_JOB_TIMEOUT`` when ``required`` (``EventWaitTimeoutError``: the run ends on that
        attempt, since a retry would replay the stored timeout). An event published after the
        deadline never counts, even for a run that resumes later than that.

        The wait is stamped on the bus's clock and a timeout is declared on that clock too,
        after one last look — a worker whose clock runs ahead never gives up early.
        """
        held = self._enter(name, "wait")
        if held is not None and held.completed:
            self.trace.append((name, "replayed"))
            return _event_outcome(name, held.output, required)
        if held is None:
            since = await self._events.now()
            deadline = (
                None
                if timeout is None
                else since + timedelta(seconds=parse_duration(timeout, field="timeout"))
            )
            waiting = {
                "event": event,
                "since": since.isoformat(),
                "deadline": deadline.isoformat() if deadline is not None else None,
            }
            await self._save(name, "wait", waiting, completed=False)
        else:
            since = datetime.fromisoformat(held.output["since"])
            raw_deadline = held.output.get("deadline")
            deadline = datetime.fromisoformat(raw_deadline) if raw_deadline else None
        # Only an event published by the deadline counts, however late the run resumes: a
        # worker that was down past it must reach the same answer as one that never was.
        found = await self._events.lookup(event, since=since, until=deadline, match=match)
        if found is None and deadline is not None and await self._events.now() >= deadline:
            found = await self._events.lookup(event, since=since, until=deadline, match=match)
            if found is None:
                await self._save(name, "wait", {"timed_out": True})
                self.trace.append((name, "ran"))
                return _event_outcome(name, {"timed_out": True}, required)
        if found is not None:
            output = {"event_id": found.id, "payload": found.payload}
            await self._save(name, "wait", output)
            self.trace.append((name, "ran"))
            return found.payload
        now = self._clock.now()
        resume_at = now + timedelta(seconds=self._event_poll)
        if deadline is not None:
            remaining = (deadline - await self._events.now()).total_seconds()
            resume_at = min(resume_at, now + timedelta(seconds=max(0.0, remaining)))
        self.trace.append((name, "suspended"))
        raise StepSuspension(resume_at, f"wait for {event}")


def _event_outcome(name: str, output: Mapping[str, Any], required: bool) -> JsonValue:
    if output.get("timed_out"):
        if required:
            raise EventWaitTimeoutError(
                f"wait_for_event {name!r} timed out before a matching event was published",
                meta={"step": name},
            )
        return None
    return output.get("payload")


def _takes_argument(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` has a required positional parameter: that one receives the step's
    signal. Defaulted parameters (``lambda host=host: …``, the loop-variable idiom) do not."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        and p.default is inspect.Parameter.empty
        for p in parameters
    )


async def _call_sync(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """A sync callable runs in a thread (awaited to its end, ``threads.in_thread``); one that
    hands back an awaitable (``lambda: coro()``) has that awaited on the loop."""
    result = await in_thread(fn, *args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _log_abandoned_step(name: str, task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # read: what a step left behind raises is nobody's to handle
    log_event(logging.ERROR, "jobs.timeout.abandoned", step=name)
