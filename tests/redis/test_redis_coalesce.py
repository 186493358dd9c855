"""The coalescer: concurrent callers share one flush, each still gets its own answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from ultimat3.jobs.redis import Coalescer


class Recorder:
    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.fail_on = fail_on

    async def flush(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await asyncio.sleep(0)
        if self.fail_on in items:
            raise ValueError(f"batch with {self.fail_on}")
        return [item * 10 for item in items]


async def test_callers_in_one_loop_turn_share_one_flush() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.flush)
    answers = await asyncio.gather(*(coalescer.submit(i) for i in range(5)))
    assert answers == [0, 10, 20, 30, 40]
    assert recorder.batches == [[0, 1, 2, 3, 4]]


async def test_callers_arriving_during_a_flush_form_the_next_batch() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.flush)
    first = asyncio.ensure_future(coalescer.submit(1))
    await asyncio.sleep(0)  # the flush of [1] is on the wire
    rest = [asyncio.ensure_future(coalescer.submit(i)) for i in (2, 3)]
    assert await asyncio.gather(first, *rest) == [10, 20, 30]
    assert recorder.batches == [[1], [2, 3]]


async def test_a_lone_call_is_flushed_alone_without_waiting() -> None:
    recorder = Recorder()
    assert await Coalescer(recorder.flush).submit(7) == 70
    assert recorder.batches == [[7]]


async def test_a_batch_never_exceeds_max_batch() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.flush, max_batch=2)
    await asyncio.gather(*(coalescer.submit(i) for i in range(5)))
    assert recorder.batches == [[0, 1], [2, 3], [4]]


async def test_a_failed_flush_fails_its_own_batch_only() -> None:
    recorder = Recorder(fail_on=1)
    coalescer = Coalescer(recorder.flush, max_batch=2)
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(4)), return_exceptions=True)
    assert [type(r) for r in results[:2]] == [ValueError, ValueError]
    assert results[2:] == [20, 30]


async def test_a_cancelled_caller_does_not_disturb_the_others() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.flush)
    calls = [asyncio.ensure_future(coalescer.submit(i)) for i in range(3)]
    await asyncio.sleep(0)
    calls[1].cancel()
    assert await calls[0] == 0
    assert await calls[2] == 20
    with pytest.raises(asyncio.CancelledError):
        await calls[1]


async def test_drain_waits_for_everything_handed_over() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.flush)
    calls = [asyncio.ensure_future(coalescer.submit(i)) for i in range(3)]
    await asyncio.sleep(0)
    await coalescer.drain()
    assert all(call.done() for call in calls)
