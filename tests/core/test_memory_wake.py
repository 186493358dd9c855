"""The memory driver's wake: the operator's moves that make rows due announce their queues.

On Postgres and Redis the requeue, promote and resume statements announce the queue on the
backend; in one process ``signal_enqueued`` is the whole wake, so an idle worker starts the row
at once instead of at its next poll.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.jobs import Item, item_job

from ultimat3.jobs.core import memory_job_driver
from ultimat3.jobs.core.memory import MemoryJobDriver
from ultimat3.jobs.core.model import AckOptions, BulkFilter, JobState
from ultimat3.jobs.core.wake import on_enqueued


async def body(input: Item) -> None:
    pass


work = item_job(body, queue="wake-q")


@pytest.fixture
def heard() -> Iterator[list[str]]:
    queues: list[str] = []
    stop = on_enqueued(queues.append)
    yield queues
    stop()


async def _done(driver: MemoryJobDriver, n: int) -> str:
    queued = await driver.enqueue(work.request(Item(n), clock=driver.clock))
    (claimed,) = (
        await driver.claim(worker_id="w", slots={"wake-q": 1}, visibility_timeout=30)
    ).jobs
    assert await driver.ack(claimed.id, AckOptions("w", claimed.claim.claim))
    return queued.id


async def test_requeue_and_requeue_many_announce_the_queue(heard: list[str]) -> None:
    driver = memory_job_driver()
    first, _ = await _done(driver, 1), await _done(driver, 2)
    assert heard == []
    await driver.introspect.requeue(first)
    assert heard == ["wake-q"]
    await driver.introspect.requeue_many(BulkFilter(state=JobState.DONE))
    assert heard == ["wake-q", "wake-q"]  # once per queue, not once per row


async def test_promote_and_promote_many_announce_the_queue(heard: list[str]) -> None:
    driver = memory_job_driver()
    later = [await driver.enqueue(work.request(Item(n), delay=60)) for n in range(3)]
    await driver.introspect.promote(later[0].id)
    assert heard == ["wake-q"]
    await driver.introspect.promote_many(BulkFilter(state=JobState.DELAYED))
    assert heard == ["wake-q", "wake-q"]


async def test_resume_queue_announces_it(heard: list[str]) -> None:
    driver = memory_job_driver()
    await driver.introspect.pause_queue("wake-q")
    assert heard == []
    await driver.introspect.resume_queue("wake-q")
    assert heard == ["wake-q"]
