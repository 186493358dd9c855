"""The one injectable clock.

Every timing rule (visibility timeouts, backoffs, sleeps, lease renewals, cron) reads ``now()`` and
waits through ``sleep()`` of one ``Clock``, so a test freezes time and advances it instead of
sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "FrozenClock", "SystemClock", "utc"]


def utc(value: datetime) -> datetime:
    """The same instant as an aware UTC datetime; a naive one is refused rather than guessed."""
    if value.tzinfo is None:
        raise ValueError("naive datetimes are ambiguous; pass an aware datetime (UTC)")
    return value.astimezone(UTC)


@runtime_checkable
class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, aware and in UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` of this clock's time have passed."""
        ...


class SystemClock:
    """Wall time and ``asyncio.sleep``."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()


class FrozenClock:
    """A clock that moves only when told to.

    ``sleep()`` parks until ``advance()`` or ``set()`` moves the time past its deadline, so code
    that waits on this clock runs exactly as far as a test lets it.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = utc(start) if start is not None else datetime(2026, 1, 1, tzinfo=UTC)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> datetime:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._sleepers, (self._now + timedelta(seconds=seconds), next(self._seq), future)
        )
        await future

    def advance(self, seconds: float | timedelta) -> datetime:
        delta = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        return self.set(self._now + delta)

    def set(self, instant: datetime) -> datetime:
        self._now = max(self._now, utc(instant))
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        return self._now

    def next_wake(self) -> datetime | None:
        """The earliest deadline a sleeper waits for, so a driver loop can jump straight to it."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    def __repr__(self) -> str:
        return f"FrozenClock({self._now.isoformat()})"
