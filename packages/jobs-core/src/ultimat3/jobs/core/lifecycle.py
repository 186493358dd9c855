"""Process shutdown in two phases, and the timing pieces every role's loop shares.

A SIGTERM drains every role of the process the same way, in two phases:

- **accept** — every role stops taking work, at once (a worker also aborts the ``ctx.signal`` of
  each job it holds with ``X_DRAINING``). All accept hooks run before any close hook, so no role's
  "stop taking work" waits behind another role's in-flight wait.
- **close** — every role waits out the work it holds, bounded by a deadline (the lifecycle's,
  ``DRAIN_DEADLINE_S`` unless ``configure_lifecycle(deadline=…)`` says otherwise; a worker's own
  ``drain_deadline``). Past it the role logs that it abandoned the rest and stops anyway.

The worker, the scheduler and the outbox relay register one pair of hooks each at ``start()``.
``install_shutdown_signals()`` turns SIGTERM/SIGINT into ``shutdown()``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .clock import Clock
from .constants import DRAIN_DEADLINE_S, IDLE_POLL_CEILING_S, WOKEN_IDLE_POLL_CEILING_S
from .durations import Duration, parse_duration
from .errors import InvariantError
from .logs import log_event
from .protocol import QueueWake

__all__ = [
    "LateDeadline",
    "ShutdownHooks",
    "Wakeup",
    "configure_lifecycle",
    "idle_ceiling",
    "install_shutdown_signals",
    "lifecycle_deadline",
    "on_shutdown",
    "positive_seconds",
    "serve_until",
    "shutdown",
]

AcceptHook = Callable[[str], None]
"""Stop taking work; called with the reason (the signal's name). Must not block."""
CloseHook = Callable[[float | None], Awaitable[None]]
"""Wait out the work in hand; called with a budget in seconds, or None for the role's own."""


@dataclass(frozen=True, slots=True, eq=False)
class ShutdownHooks:
    accept: AcceptHook
    close: CloseHook


_hooks: list[ShutdownHooks] = []
_deadline = DRAIN_DEADLINE_S


def configure_lifecycle(*, deadline: float) -> None:
    """Set the close-phase budget of every role that was not given its own. Raise it past your
    slowest job rather than relying on the wait, with a termination grace period at least as
    long."""
    if not deadline > 0:
        raise InvariantError(f"the lifecycle deadline must be positive seconds, got {deadline!r}")
    global _deadline
    _deadline = float(deadline)


def lifecycle_deadline() -> float:
    return _deadline


def on_shutdown(accept: AcceptHook, close: CloseHook) -> Callable[[], None]:
    """Register a role's two hooks; answers the function that unregisters them."""
    hooks = ShutdownHooks(accept, close)
    _hooks.append(hooks)

    def remove() -> None:
        if hooks in _hooks:
            _hooks.remove(hooks)

    return remove


async def shutdown(reason: str = "shutdown", *, deadline: float | None = None) -> None:
    """Drain every registered role: every accept hook, then every close hook together."""
    hooks = list(_hooks)
    log_event(logging.INFO, "jobs.lifecycle.shutdown", reason=reason, roles=len(hooks))
    for hooks_of_role in hooks:
        try:  # one role failing to stop must not keep the others taking work
            hooks_of_role.accept(reason)
        except Exception as exc:
            log_event(logging.ERROR, "jobs.lifecycle.hook-failed", phase="accept", error=repr(exc))
    closed = await asyncio.gather(*(h.close(deadline) for h in hooks), return_exceptions=True)
    for outcome in closed:
        if isinstance(outcome, BaseException):
            log_event(
                logging.ERROR, "jobs.lifecycle.hook-failed", phase="close", error=repr(outcome)
            )


@dataclass
class _Signals:
    """The SIGTERM/SIGINT handlers of one loop, shared by everyone who installed them."""

    loop: asyncio.AbstractEventLoop
    holders: int = 0
    installed: list[signal.Signals] = field(default_factory=list)
    shutdown: asyncio.Task[None] | None = None

    def begin(self, name: str) -> None:
        if self.shutdown is None:
            self.shutdown = self.loop.create_task(shutdown(name))
            self.shutdown.add_done_callback(lambda _: self.restore_if_unheld())

    def restore_if_unheld(self) -> None:
        """Hand the signals back to their defaults once nobody holds them and no shutdown they
        began still runs (a second SIGTERM then would kill the process mid-drain)."""
        global _signals
        if self.holders or (self.shutdown is not None and not self.shutdown.done()):
            return
        for sig in self.installed:
            self.loop.remove_signal_handler(sig)
        self.installed.clear()
        if _signals is self:
            _signals = None


_signals: _Signals | None = None


def install_shutdown_signals() -> Callable[[], None]:
    """Make SIGTERM and SIGINT call ``shutdown()`` on the running loop; answers the remover.

    A second signal while a shutdown runs is ignored: the drain already under way is the answer.
    Every role's ``run()`` installs them: the handlers are one set per loop, kept until the last
    holder removes them and the shutdown they began has ended, so a role that returns first
    does not give SIGTERM back its default action while another still drains.
    """
    global _signals
    loop = asyncio.get_running_loop()
    state = _signals
    if state is None or state.loop is not loop:
        state = _signals = _Signals(loop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, state.begin, sig.name)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - non-main thread
                continue
            state.installed.append(sig)
    state.holders += 1
    removed = False

    def remove() -> None:
        nonlocal removed
        if not removed:
            removed = True
            state.holders -= 1
            state.restore_if_unheld()

    return remove


async def serve_until(stopped: asyncio.Event) -> None:
    """A role's ``run()`` once it has started: hold the shutdown signals until ``stopped`` is
    set, then, when a signal began the shutdown, until it has closed every role of the process
    (not this role's own stop alone)."""
    remove = install_shutdown_signals()
    try:
        await stopped.wait()
        state = _signals
        if state is not None and state.shutdown is not None:
            await asyncio.shield(state.shutdown)
    finally:
        remove()


def idle_ceiling(declared: float | None, wake: QueueWake | None) -> float:
    """Where a role's idle back-off stops doubling: what the role declared, else 5 s while a
    cross-process wake is proven live (notifications carry the latency), else 2 s."""
    if declared is not None:
        return declared
    if wake is not None and wake.live:
        return WOKEN_IDLE_POLL_CEILING_S
    return IDLE_POLL_CEILING_S


def positive_seconds(value: Duration, field: str) -> float:
    """A role's interval or budget in seconds; zero, negative or malformed is ``X_INVARIANT``
    where it was written."""
    seconds = parse_duration(value, field=field)
    if seconds <= 0:
        raise InvariantError(f"{field} must be positive, got {value!r}", meta={"field": field})
    return seconds


class Wakeup:
    """A loop's doorbell: ``ring()`` asks for a pass now; ``wait()`` parks until rung or until
    ``seconds`` of the clock pass. Rings while the loop is busy fold into ONE early return, so a
    burst of rings asks for one more pass, never a second loop."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def ring(self) -> None:
        self._event.set()

    async def wait(self, clock: Clock, seconds: float | None) -> bool:
        """True when rung, False when the time ran out."""
        event = self._event
        if not event.is_set() and (seconds is None or seconds > 0):
            waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(event.wait())}
            if seconds is not None:
                waits.add(asyncio.ensure_future(clock.sleep(seconds)))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pending in waits:
                    pending.cancel()
        was_rung = event.is_set()
        event.clear()
        return was_rung


class LateDeadline:
    """A deadline that can be bound after the wait it bounds has begun; the earliest wins.

    A manual ``stop()`` waits without one; a shutdown landing on it binds the drain's deadline to
    the wait already in flight.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._at: datetime | None = None
        self._moved = Wakeup()

    def bind(self, at: datetime) -> None:
        if self._at is None or at < self._at:
            self._at = at
            self._moved.ring()

    def bind_in(self, seconds: float) -> None:
        self.bind(self._clock.now() + timedelta(seconds=seconds))

    async def wait_for(self, work: Awaitable[object]) -> bool:
        """Wait for ``work`` until the deadline; True when it finished in time. ``work`` is left
        running when the deadline passes (nothing can kill a body that ignores its signal)."""
        done = asyncio.ensure_future(work)
        while not done.done():
            remaining = None
            if self._at is not None:
                remaining = (self._at - self._clock.now()).total_seconds()
                if remaining <= 0:
                    return False
            moved = asyncio.ensure_future(self._moved.wait(self._clock, remaining))
            try:
                await asyncio.wait({done, moved}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                moved.cancel()
        return True
