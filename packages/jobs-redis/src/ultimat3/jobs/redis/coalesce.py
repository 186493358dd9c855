"""Many concurrent callers, one round trip: a batch of whatever arrived while the last one flew.

A worker settles each job from its own task, so at a hundred in flight a hundred ``ack()`` calls
arrive within a millisecond. Sent one by one they cost a hundred round trips; coalesced they are
one script call whose answer holds one result per caller. Nothing waits on a timer: the first
caller starts a flush on the next loop turn (so everyone calling in the same turn joins it), and
callers arriving while a flush is on the wire form the next batch. Under light load a batch is one
item and the latency is a plain call's; under heavy load batches grow to match.

Nothing here knows about Redis: ``flush`` is any coroutine turning a batch of items into one
result per item, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class Coalescer(Generic[ItemT, ResultT]):
    """Batches concurrent ``submit()`` calls into calls of ``flush``, at most one in flight.

    Each caller gets the result at its item's position, or the exception the flush raised. A
    caller cancelled while waiting leaves its item in the batch: once handed over, a write may
    land, exactly as a cancelled plain call may have.
    """

    def __init__(
        self,
        flush: Callable[[Sequence[ItemT]], Awaitable[Sequence[ResultT]]],
        *,
        max_batch: int = 500,
    ) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._pending: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._runner: asyncio.Task[None] | None = None

    async def submit(self, item: ItemT) -> ResultT:
        future: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._runner is None:
            self._runner = asyncio.ensure_future(self._run())
        return await future

    async def _run(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                try:
                    results = await self._flush([item for item, _ in batch])
                except asyncio.CancelledError:
                    for _, future in batch:
                        future.cancel()
                    raise
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._runner = None
            for _, future in self._pending:
                if not future.done():
                    future.set_exception(RuntimeError("the batch runner stopped before this item"))
            self._pending.clear()

    async def drain(self) -> None:
        """Wait for every item handed over so far to be flushed."""
        while self._runner is not None:
            await asyncio.shield(self._runner)
