"""The blocking wake: a subscriber proven live hears the queue of every row worth waking for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import pytest

from ultimat3.jobs.core import AckOptions, EnqueueRequest, FrozenClock, QueueWake
from ultimat3.jobs.core.wake import on_wake_lost
from ultimat3.jobs.redis import RedisJobDriver, RedisQueueWake, redis_job_driver, start_queue_wake

RequestBuilder = Callable[..., EnqueueRequest]


class Heard:
    """The queue names a wake announced, in order."""

    def __init__(self, wake: RedisQueueWake) -> None:
        self.names: asyncio.Queue[str] = asyncio.Queue()
        wake.subscribe(self.names.put_nowait)

    async def next(self, timeout: float = 5.0) -> str:
        return await asyncio.wait_for(self.names.get(), timeout)

    async def nothing(self, within: float = 0.3) -> bool:
        await asyncio.sleep(within)
        return self.names.empty()


async def kill_the_subscriber(driver: RedisJobDriver) -> None:
    (held,) = [c for c in await driver.client.client_list() if c["name"] == driver.wake_channel]
    await driver.client.client_kill_filter(_id=held["id"])


async def until_lost(wake: RedisQueueWake) -> None:
    async def poll() -> None:
        while wake.live:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), 10)


@pytest.fixture
async def wake(driver: RedisJobDriver) -> AsyncIterator[RedisQueueWake]:
    started = start_queue_wake(driver)
    assert await started.wait_live(10), "the probe never came back"
    yield started
    await started.close()


@pytest.fixture
async def other(
    redis_url: str, redis_prefix: str, clock: FrozenClock
) -> AsyncIterator[RedisJobDriver]:
    """A second process's driver on the same namespace (its own connections)."""
    built = redis_job_driver(url=redis_url, prefix=redis_prefix, clock=clock)
    yield built
    await built.close()


async def test_the_wake_is_a_queue_wake_proven_live(wake: RedisQueueWake) -> None:
    assert isinstance(wake, QueueWake)
    assert wake.live


async def test_an_enqueue_elsewhere_announces_its_queue(
    wake: RedisQueueWake, other: RedisJobDriver, new_request: RequestBuilder
) -> None:
    heard = Heard(wake)
    await other.enqueue(new_request(queue="emails"))
    assert await heard.next() == "emails"


async def test_a_row_due_later_than_a_second_is_not_announced(
    wake: RedisQueueWake, other: RedisJobDriver, new_request: RequestBuilder
) -> None:
    heard = Heard(wake)
    await other.enqueue(new_request(delay=5))
    assert await heard.nothing()


async def test_a_deduped_enqueue_is_not_announced(
    wake: RedisQueueWake, other: RedisJobDriver, driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    heard = Heard(wake)
    await other.enqueue(new_request(key="k"))
    assert await heard.next() == "q"
    # The claim reads the queue, so the next row worth waking for is announced again...
    await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert (await other.enqueue(new_request(key="k"))).deduped
    assert await heard.nothing(), "a deduped enqueue was announced"
    # ...as a fresh row now is: the silence above was the dedupe, not a held announcement.
    await other.enqueue(new_request())
    assert await heard.next() == "q"


async def test_one_announcement_waits_for_a_claim_before_the_next(
    wake: RedisQueueWake, other: RedisJobDriver, driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    heard = Heard(wake)
    await other.enqueue(new_request())
    assert await heard.next() == "q"
    await other.enqueue(new_request())
    assert await heard.nothing(), "a second wake while the first is unclaimed"
    batch = await driver.claim(worker_id="w", slots={"q": 5}, visibility_timeout=30)
    assert len(batch.jobs) == 2
    await other.enqueue(new_request())
    assert await heard.next() == "q"


async def test_resume_and_requeue_announce_the_queue(
    wake: RedisQueueWake, driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    heard = Heard(wake)
    await driver.introspect.resume_queue("paused-q")
    assert await heard.next() == "paused-q"
    queued = await driver.enqueue(new_request(queue="r"))
    assert await heard.next() == "r"
    (job,) = (await driver.claim(worker_id="w", slots={"r": 1}, visibility_timeout=30)).jobs
    await driver.ack(job.id, AckOptions(job.claim.worker_id, job.claim.claim))
    await driver.introspect.requeue(queued.id)
    assert await heard.next() == "r"


async def test_the_wake_hears_again_after_its_connection_is_killed(
    wake: RedisQueueWake, other: RedisJobDriver, driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    heard = Heard(wake)
    await kill_the_subscriber(driver)
    await asyncio.sleep(0.5)
    assert await wake.wait_live(10)
    await other.enqueue(new_request(queue="after"))
    assert await heard.next(10) == "after"


async def test_a_lost_subscription_is_signalled_to_the_idle_loops(
    wake: RedisQueueWake, driver: RedisJobDriver
) -> None:
    signalled: list[QueueWake] = []
    remove = on_wake_lost(signalled.append)
    try:
        await kill_the_subscriber(driver)
        await until_lost(wake)
        assert signalled == [wake]
    finally:
        remove()


async def test_a_redial_proven_by_its_probe_starts_the_backoff_over(
    wake: RedisQueueWake, driver: RedisJobDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ultimat3.jobs")
    for _ in range(4):
        await kill_the_subscriber(driver)
        await until_lost(wake)
        assert await wake.wait_live(10)
    lost = [r for r in caplog.records if getattr(r, "event", None) == "jobs.wake.lost"]
    assert [r.jobs["retry_in_s"] for r in lost] == [0.1] * 4
