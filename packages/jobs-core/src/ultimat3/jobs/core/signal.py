"""Abort signals: how a deadline, a drain or a lost lease reaches a running body.

``ctx.signal`` and every step's signal are ``AbortSignal``s. A body can poll ``aborted``, call
``throw_if_aborted()``, register a callback, or ``await signal`` to park until it fires. Whatever
aborts it — a deadline, a drain, a lost lease or fleet slot — the runner also cancels the body's
task, so an ``await`` that never looks at the signal is interrupted too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any

from .errors import JobAbortedError

__all__ = ["AbortController", "AbortSignal", "any_signal"]


class AbortSignal:
    __slots__ = ("_listeners", "_reason", "_waiters")

    def __init__(self) -> None:
        self._reason: BaseException | None = None
        self._listeners: list[Callable[[BaseException], None]] = []
        self._waiters: list[asyncio.Future[BaseException]] | None = None
        """Made by the first ``wait()``: most signals (one per run) are never awaited."""

    @property
    def aborted(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> BaseException | None:
        return self._reason

    def throw_if_aborted(self) -> None:
        if self._reason is not None:
            raise self._reason

    def add_listener(self, listener: Callable[[BaseException], None]) -> Callable[[], None]:
        """Call ``listener(reason)`` once the signal fires (at once if it already has)."""
        if self._reason is not None:
            listener(self._reason)
            return lambda: None
        self._listeners.append(listener)
        return lambda: self.remove_listener(listener)

    def remove_listener(self, listener: Callable[[BaseException], None]) -> None:
        """Forget ``listener`` (nothing happens if it was never added, or already called)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def wait(self) -> BaseException:
        """Park until the signal fires; answers the reason."""
        if self._reason is not None:
            return self._reason
        future: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(future)
        try:
            return await future
        finally:
            if future in self._waiters:
                self._waiters.remove(future)

    def __await__(self) -> Generator[Any, None, BaseException]:
        return self.wait().__await__()

    def _fire(self, reason: BaseException) -> None:
        if self._reason is not None:
            return
        self._reason = reason
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(reason)
        for waiter in self._waiters or ():
            if not waiter.done():
                waiter.set_result(reason)

    def __repr__(self) -> str:
        return f"AbortSignal(aborted={self.aborted}, reason={self._reason!r})"


class AbortController:
    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: BaseException | None = None) -> None:
        self.signal._fire(reason if reason is not None else JobAbortedError("aborted"))


def any_signal(*signals: AbortSignal) -> AbortSignal:
    """A signal that fires with the reason of whichever of ``signals`` fires first."""
    controller = AbortController()
    for signal in signals:
        signal.add_listener(controller.abort)
    return controller.signal
