"""Let background roles (worker, scheduler, relay) run under a frozen clock, without sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from ultimat3.jobs.core import FrozenClock


async def settle(turns: int = 100) -> None:
    """Give every ready task ``turns`` turns of the event loop."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def until(predicate: Callable[[], bool], *, turns: int = 5000) -> None:
    """Turn the loop until ``predicate()`` holds; fail after ``turns`` turns."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def run_clock(clock: FrozenClock, seconds: float) -> None:
    """Move the clock forward by ``seconds``, stopping at every sleeper's deadline on the way and
    letting the loop run there — as real time would, in order."""
    target = clock.now() + timedelta(seconds=seconds)
    await settle()
    while (wake := clock.next_wake()) is not None and wake <= target:
        clock.set(wake)
        await settle()
    clock.set(target)
    await settle()
