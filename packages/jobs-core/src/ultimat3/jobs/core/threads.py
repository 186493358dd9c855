"""Sync callables (a job body, a step) run in a worker thread that a cancel cannot stop.

``asyncio.to_thread`` answers a cancel at once while its thread goes on, so an attempt cancelled
by a drain or a deadline looked finished while its body still ran: the row went back to the queue
and a second worker started the same body beside the first. Here a cancel does not end the wait.
The call is awaited to its end and its own outcome answered, as from a coroutine that ignored the
cancel; whoever cancelled then treats it as such a body (a drain waits for it up to its deadline,
a timeout gives it its grace and leaves it behind, logged). The cancel stays counted on the task
(``Task.cancelling()``) for the caller that asked for it to settle.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["in_thread", "outlast"]

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the loop's default executor, under a copy of the caller's
    context (as ``asyncio.to_thread``), awaited to its end whatever cancels the caller."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    future = asyncio.get_running_loop().run_in_executor(None, call)
    await outlast(future)
    return future.result()


async def outlast(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` is done, through any cancel of the waiter: a cancel does not reach
    the future, and ends no wait. Its outcome is the caller's to read."""
    while not future.done():
        # A cancel of the waiter: wait on. The future's own error: it is done, the loop ends.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(future)
