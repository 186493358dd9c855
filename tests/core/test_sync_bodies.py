"""Sync bodies and sync steps run in a thread no cancel can stop: a drain waits for one, a
timeout leaves one behind (logged), and the row is never handed back while one still runs."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.eventually import until
from support.jobs import Item, item_job

from ultimat3.jobs.core import (
    JobState,
    Retry,
    job_worker,
    memory_job_driver,
    reset_job_driver,
    set_job_driver,
)
from ultimat3.jobs.core.execute import JobExecution
from ultimat3.jobs.core.memory import MemoryJobDriver

WAIT_S = 10.0
"""A generous ceiling on every wait for a thread: the tests never get near it."""


@pytest.fixture
def driver() -> Iterator[MemoryJobDriver]:
    """A memory driver on the real clock: the drain's deadline and the timeouts are real time."""
    installed = memory_job_driver()
    set_job_driver(installed)
    yield installed
    reset_job_driver()


class Blocking:
    """A sync callable that blocks its thread until the test lets it go."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.ended: list[int] = []

    def __call__(self, n: int) -> int:
        self.entered.set()
        self.gate.wait(WAIT_S)
        self.ended.append(n)
        return n

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, WAIT_S)

    def release_soon(self) -> None:
        asyncio.get_running_loop().call_later(0.2, self.gate.set)


async def state_of(driver: MemoryJobDriver, job_id: str) -> JobState:
    detail = await driver.introspect.get(job_id)
    assert detail is not None
    return detail.row.state


async def test_a_drain_waits_for_a_sync_body_which_then_completes(
    driver: MemoryJobDriver,
) -> None:
    blocking = Blocking()

    def body(*, input: Item) -> int:
        return blocking(input.n)

    handle = item_job(body, retry=Retry(attempts=1))
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], drain_deadline=WAIT_S)
    await worker.start()
    queued = await handle.enqueue(Item(1))
    await blocking.wait_entered()
    blocking.release_soon()
    await worker.drain("SIGTERM")
    assert blocking.ended == [1]
    assert await state_of(driver, queued.id) is JobState.DONE


@pytest.mark.parametrize("step_timeout", [None, "1h"], ids=["no-step-timeout", "step-timeout"])
async def test_a_drain_hands_the_row_back_only_once_its_sync_step_has_ended(
    driver: MemoryJobDriver, step_timeout: str | None
) -> None:
    blocking = Blocking()

    async def body(*, input: Item, step: Any) -> None:
        await step.run("blocking", lambda: blocking(input.n))

    handle = item_job(body, retry=Retry(attempts=1), step_timeout=step_timeout)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], drain_deadline=WAIT_S)
    await worker.start()
    queued = await handle.enqueue(Item(1))
    await blocking.wait_entered()
    blocking.release_soon()
    await worker.drain("SIGTERM")
    # The step finished after the abort, so its result was refused and the row handed back
    # uncounted — but only once nothing of the attempt ran any more.
    assert blocking.ended == [1]
    assert await state_of(driver, queued.id) is JobState.READY
    assert worker.stats.interrupted == 1


async def test_a_sync_body_past_its_timeout_is_left_behind_and_logged_when_it_ends(
    driver: MemoryJobDriver, caplog: pytest.LogCaptureFixture
) -> None:
    blocking = Blocking()
    ended: list[JobExecution] = []

    def body(*, input: Item) -> int:
        return blocking(input.n)

    handle = item_job(body, retry=Retry(attempts=1), timeout="50ms")
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], on_execution=ended.append
    )
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        async with worker:
            queued = await handle.enqueue(Item(1))
            await blocking.wait_entered()
            await until(lambda: bool(ended), turns=10**7)
            assert ended[0].error is not None
            assert getattr(ended[0].error, "code", None) == "X_JOB_TIMEOUT"
            assert blocking.ended == []  # the attempt settled, the thread goes on
            assert await state_of(driver, queued.id) is JobState.DEAD
            blocking.gate.set()
            await until(lambda: "jobs.timeout.abandoned" in caplog.text, turns=10**7)
    assert blocking.ended == [1]


async def test_a_sync_step_past_its_step_timeout_is_left_behind_and_logged_when_it_ends(
    driver: MemoryJobDriver, caplog: pytest.LogCaptureFixture
) -> None:
    blocking = Blocking()
    ended: list[JobExecution] = []

    async def body(*, input: Item, step: Any) -> None:
        await step.run("blocking", lambda: blocking(input.n))

    handle = item_job(body, retry=Retry(attempts=1), step_timeout="50ms")
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], on_execution=ended.append
    )
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        async with worker:
            await handle.enqueue(Item(1))
            await blocking.wait_entered()
            await until(lambda: bool(ended), turns=10**7)
            assert getattr(ended[0].error, "code", None) == "X_JOB_TIMEOUT"
            assert blocking.ended == []
            blocking.gate.set()
            await until(lambda: "jobs.timeout.abandoned" in caplog.text, turns=10**7)
    assert "step='blocking'" in caplog.text
