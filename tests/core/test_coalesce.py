"""Coalescer: concurrent calls become one flush, and every caller hears its own answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from ultimat3.jobs.core.coalesce import Coalescer


class Recorder:
    def __init__(self, fail_on: str | None = None) -> None:
        self.flushes: list[list[str]] = []
        self.fail_on = fail_on

    async def flush(self, items: Sequence[str]) -> list[str]:
        self.flushes.append(list(items))
        await asyncio.sleep(0)
        if self.fail_on is not None and self.fail_on in items:
            raise RuntimeError(f"refused {self.fail_on}")
        return [item.upper() for item in items]


async def test_concurrent_calls_share_one_flush() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str, str] = Coalescer(recorder.flush)
    answers = await asyncio.gather(*(coalescer.submit(f"item{n}") for n in range(50)))
    assert answers == [f"ITEM{n}" for n in range(50)]
    assert len(recorder.flushes) == 1


async def test_a_lone_call_is_flushed_without_waiting_for_company() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str, str] = Coalescer(recorder.flush)
    assert await coalescer.submit("alone") == "ALONE"
    assert recorder.flushes == [["alone"]]


async def test_calls_arriving_during_a_flush_join_the_next_one() -> None:
    gate = asyncio.Event()
    flushes: list[list[int]] = []

    async def slow(items: Sequence[int]) -> list[int]:
        flushes.append(list(items))
        await gate.wait()
        return list(items)

    coalescer: Coalescer[int, int] = Coalescer(slow)
    first = asyncio.create_task(coalescer.submit(0))
    await asyncio.sleep(0.01)
    later = [asyncio.create_task(coalescer.submit(n)) for n in range(1, 6)]
    await asyncio.sleep(0.01)
    gate.set()
    assert await asyncio.gather(first, *later) == [0, 1, 2, 3, 4, 5]
    assert flushes == [[0], [1, 2, 3, 4, 5]]


async def test_at_most_in_flight_flushes_run_at_once() -> None:
    gate = asyncio.Event()
    running, most = 0, 0

    async def blocked(items: Sequence[int]) -> list[int]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await gate.wait()
        running -= 1
        return list(items)

    coalescer: Coalescer[int, int] = Coalescer(blocked, in_flight=2)
    calls = []
    for n in range(4):
        calls.append(asyncio.create_task(coalescer.submit(n)))
        await asyncio.sleep(0.01)
    gate.set()
    assert await asyncio.gather(*calls) == [0, 1, 2, 3]
    assert most == 2


async def test_a_call_arriving_as_the_last_flush_ends_is_still_carried() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str, str] = Coalescer(recorder.flush, in_flight=1)
    assert await coalescer.submit("first") == "FIRST"
    assert await coalescer.submit("second") == "SECOND"


async def test_a_flush_carries_at_most_max_batch_items() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str, str] = Coalescer(recorder.flush, max_batch=4)
    await asyncio.gather(*(coalescer.submit(str(n)) for n in range(10)))
    assert [len(batch) for batch in recorder.flushes] == [4, 4, 2]


async def test_two_items_with_one_key_never_share_a_flush() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str, str] = Coalescer(recorder.flush, key=lambda item: item[0])
    answers = await asyncio.gather(*(coalescer.submit(item) for item in ("a1", "b1", "a2")))
    assert answers == ["A1", "B1", "A2"]
    assert recorder.flushes == [["a1", "b1"], ["a2"]]


async def test_a_failed_flush_fails_its_own_batch_only() -> None:
    recorder = Recorder(fail_on="bad")
    coalescer: Coalescer[str, str] = Coalescer(recorder.flush, max_batch=2)
    results = await asyncio.gather(
        *(coalescer.submit(item) for item in ("ok", "bad", "fine")), return_exceptions=True
    )
    assert isinstance(results[0], RuntimeError)
    assert isinstance(results[1], RuntimeError)
    assert results[2] == "FINE"


def test_a_batch_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Coalescer(Recorder().flush, max_batch=0)


def test_no_flush_in_flight_is_refused() -> None:
    with pytest.raises(ValueError, match="in_flight"):
        Coalescer(Recorder().flush, in_flight=0)


async def test_a_cancelled_caller_does_not_disturb_the_others() -> None:
    async def flush(items: Sequence[int]) -> list[int]:
        await asyncio.sleep(0)
        return [item * 10 for item in items]

    coalescer: Coalescer[int, int] = Coalescer(flush)
    calls = [asyncio.ensure_future(coalescer.submit(i)) for i in range(3)]
    await asyncio.sleep(0)
    calls[1].cancel()
    assert await calls[0] == 0
    assert await calls[2] == 20
    with pytest.raises(asyncio.CancelledError):
        await calls[1]


async def test_drain_waits_for_everything_handed_over() -> None:
    async def flush(items: Sequence[int]) -> list[int]:
        await asyncio.sleep(0)
        return list(items)

    coalescer: Coalescer[int, int] = Coalescer(flush)
    calls = [asyncio.ensure_future(coalescer.submit(i)) for i in range(3)]
    await asyncio.sleep(0)
    await coalescer.drain()
    assert all(call.done() for call in calls)


@pytest.mark.timeout(10)
async def test_drain_right_after_the_last_answer_returns() -> None:
    """The runner that answered has finished, but its done-callback has not run yet: drain must
    not wait on it without yielding (it spun forever, and a driver's close() with it)."""

    async def flush(items: Sequence[int]) -> list[bool]:
        return [True for _ in items]

    coalescer: Coalescer[int, bool] = Coalescer(flush)
    assert await coalescer.submit(1)
    await coalescer.drain()  # at once: wrapped in a task, the callback would get its turn first
