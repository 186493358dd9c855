"""A row whose hash vanished while its index entries stayed: evicted under a ``maxmemory-policy``
other than ``noeviction``, or deleted by hand. The data is gone, but the driver goes on: a claim
passes over the entries (and drops them) instead of failing every call for the whole worker, and
the live key the row held is free for the next enqueue."""

from __future__ import annotations

from collections.abc import Callable

from ultimat3.jobs.core import (
    AckOptions,
    BulkFilter,
    EnqueueRequest,
    FrozenClock,
    JobFilter,
    JobState,
)
from ultimat3.jobs.redis import RedisJobDriver

RequestBuilder = Callable[..., EnqueueRequest]


async def _vanish(driver: RedisJobDriver, job_id: str) -> None:
    assert await driver.client.delete(f"{driver.namespace.base}job:{job_id}") == 1


async def _indexed(driver: RedisJobDriver, job_id: str) -> list[str]:
    """The keys of the namespace whose sorted set still holds ``job_id``."""
    base = driver.namespace.base
    found = []
    async for key in driver.client.scan_iter(match=base + "*", count=1000):
        kind = await driver.client.type(key)
        if kind == "zset" and await driver.client.zscore(key, job_id) is not None:
            found.append(key.removeprefix(base))
    return sorted(found)


async def test_a_claim_passes_over_a_ready_row_whose_hash_vanished(
    driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    gone = await driver.enqueue(new_request())
    kept = await driver.enqueue(new_request())
    await _vanish(driver, gone.id)
    assert await _indexed(driver, gone.id) == ["created", "q:q:due", "q:q:s:ready"]
    claimed = (await driver.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)).jobs
    assert [job.id for job in claimed] == [kept.id]
    assert await _indexed(driver, gone.id) == []


async def test_a_claim_passes_over_a_lapsed_row_whose_hash_vanished(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    gone = await driver.enqueue(new_request())
    await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    kept = await driver.enqueue(new_request())
    await _vanish(driver, gone.id)
    clock.advance(31)
    claimed = (await driver.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)).jobs
    assert [job.id for job in claimed] == [kept.id]
    assert await _indexed(driver, gone.id) == []


async def test_the_live_key_of_a_vanished_row_is_free_again(
    driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    gone = await driver.enqueue(new_request(key="k"))
    await _vanish(driver, gone.id)
    again = await driver.enqueue(new_request(key="k"))
    assert not again.deduped
    assert again.id != gone.id
    (job,) = (await driver.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)).jobs
    assert job.id == again.id


async def test_list_and_get_pass_over_a_row_whose_hash_vanished(
    driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    gone = await driver.enqueue(new_request())
    kept = await driver.enqueue(new_request())
    await _vanish(driver, gone.id)
    page = await driver.introspect.list(JobFilter())
    assert [row.id for row in page.rows] == [kept.id]
    assert await driver.introspect.get(gone.id) is None


async def _finished_behind_a_vanished_holder(
    driver: RedisJobDriver, new_request: RequestBuilder
) -> str:
    """A done row with key "k", and a live row holding "k" whose hash then vanished."""
    done = await driver.enqueue(new_request(key="k"))
    (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert await driver.ack(job.id, AckOptions("w", job.claim.claim))
    holder = await driver.enqueue(new_request(key="k"))
    await _vanish(driver, holder.id)
    return done.id


async def test_requeue_takes_a_key_whose_holder_vanished(
    driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    done = await _finished_behind_a_vanished_holder(driver, new_request)
    assert (await driver.introspect.requeue(done)).state is JobState.READY


async def test_requeue_many_moves_and_counts_rows_whose_key_holder_vanished(
    driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    await _finished_behind_a_vanished_holder(driver, new_request)
    result = await driver.introspect.requeue_many(BulkFilter(state=JobState.DONE))
    assert (result.affected, result.remaining) == (1, 0)


async def test_stats_step_over_a_waiting_row_whose_hash_vanished_to_the_oldest_one_left(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    gone = await driver.enqueue(new_request())
    clock.advance(1)
    await driver.enqueue(new_request())
    await _vanish(driver, gone.id)
    (stats,) = await driver.stats()
    assert stats.oldest_ready_at == clock.now()
