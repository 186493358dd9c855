"""What the driver keeps and for how long: done rows expire, everything else stays, and memory
stays bounded (no per-job key outlives its row, no index keeps an entry for a row that is gone)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from ultimat3.jobs.core import (
    AckOptions,
    EnqueueRequest,
    FrozenClock,
    JobState,
    NackOptions,
    StepRecord,
)
from ultimat3.jobs.redis import RedisJobDriver, redis_job_driver
from ultimat3.jobs.redis.codec import to_us

RequestBuilder = Callable[..., EnqueueRequest]

DAY = timedelta(days=1)
PER_NAME = {"ctr:job", "ctridx:job", "ctrlen:job", "ctrnames"}
"""What a job NAME keeps: its counter buckets, their index and field count, the name set."""


async def _done(driver: RedisJobDriver, request: RequestBuilder, *, with_step: bool = True) -> str:
    """Queue one row, run it (one step) and ack it; its id."""
    queued = await driver.enqueue(request())
    (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    if with_step:
        await driver.save_step(job.id, job.claim, job.run_id, StepRecord("s", 0, {"ok": True}))
    assert await driver.ack(job.id, AckOptions(job.claim.worker_id, job.claim.claim))
    return queued.id


async def _ack_next(driver: RedisJobDriver) -> str:
    """Claim the one due row and ack it; its id."""
    (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert await driver.ack(job.id, AckOptions(job.claim.worker_id, job.claim.claim))
    return job.id


async def _keys(driver: RedisJobDriver) -> set[str]:
    prefix = driver.namespace.base
    return {key async for key in driver.client.scan_iter(match=prefix + "*", count=1000)}


async def test_a_done_row_and_its_steps_expire_after_done_ttl_on_the_drivers_clock(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    job_id = await _done(driver, new_request)
    detail = await driver.introspect.get(job_id)
    assert detail is not None
    clock.advance(7 * DAY - timedelta(seconds=1))
    await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert await driver.introspect.get(job_id) is not None
    clock.advance(timedelta(seconds=1))
    await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert await driver.introspect.get(job_id) is None
    assert not await driver.client.exists(driver.namespace.key(f"steps:{detail.row.run_id}"))
    assert await driver.stats() == []


async def test_no_row_key_carries_a_server_ttl(
    driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    job_id = await _done(driver, new_request)
    detail = await driver.introspect.get(job_id)
    assert detail is not None
    assert await driver.client.pttl(driver.namespace.key(f"job:{job_id}")) == -1
    assert await driver.client.pttl(driver.namespace.key(f"steps:{detail.row.run_id}")) == -1


async def test_a_requeued_done_row_is_never_swept(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    job_id = await _done(driver, new_request)
    await driver.introspect.requeue(job_id)
    clock.advance(8 * DAY)
    (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert job.id == job_id


async def test_an_id_enqueued_again_after_its_row_expired_is_a_new_row(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    again = new_request()
    await driver.enqueue(again)
    await _ack_next(driver)
    clock.advance(8 * DAY)
    await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert not (await driver.enqueue(again)).deduped
    assert await _ack_next(driver) == again.id


async def test_the_sweep_leaves_whole_a_row_enqueued_under_the_id_of_a_vanished_one(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    again = new_request()
    await driver.enqueue(again)
    await _ack_next(driver)
    # The row's hash goes behind the driver's back (an eviction, a stray DEL); the id comes back.
    await driver.client.delete(driver.namespace.key(f"job:{again.id}"))
    assert not (await driver.enqueue(again)).deduped
    clock.advance(8 * DAY)
    (rerun,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert rerun.id == again.id
    (stats,) = await driver.stats()
    assert (stats.running, stats.done) == (1, 0)
    assert await driver.ack(rerun.id, AckOptions(rerun.claim.worker_id, rerun.claim.claim))
    assert (await driver.introspect.get(again.id)) is not None


async def test_done_ttl_zero_keeps_done_rows(
    redis_url: str, redis_prefix: str, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    driver = redis_job_driver(url=redis_url, prefix=redis_prefix, clock=clock, done_ttl=0)
    try:
        job_id = await _done(driver, new_request)
        assert await driver.client.pttl(driver.namespace.key(f"job:{job_id}")) == -1
        clock.advance(400 * DAY)
        await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
        assert await driver.introspect.get(job_id) is not None
    finally:
        await driver.clear()
        await driver.close()


async def test_a_row_finished_under_done_ttl_zero_expires_once_a_driver_with_a_ttl_sweeps(
    redis_url: str, redis_prefix: str, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    """The TTL is the sweeping driver's, counted from the row's finish: a namespace moved from
    ``done_ttl=0`` to a TTL loses the rows finished before the move too, not only later ones."""
    keeping = redis_job_driver(url=redis_url, prefix=redis_prefix, clock=clock, done_ttl=0)
    expiring = redis_job_driver(url=redis_url, prefix=redis_prefix, clock=clock, done_ttl=DAY)
    try:
        before = await _keys(keeping)
        job_id = await _done(keeping, new_request)
        clock.advance(DAY - timedelta(seconds=1))
        await expiring.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
        assert await expiring.introspect.get(job_id) is not None
        clock.advance(timedelta(seconds=1))
        await keeping.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
        assert await keeping.introspect.get(job_id) is not None  # done_ttl=0 sweeps nothing
        await expiring.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
        assert await expiring.introspect.get(job_id) is None
        left = await _keys(expiring) - before
        assert {key.removeprefix(expiring.namespace.base) for key in left} <= PER_NAME
    finally:
        await keeping.clear()
        await keeping.close()
        await expiring.close()


async def test_dead_and_failed_rows_are_kept(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    ids = []
    for options in ({"dead_letter": True}, {"fail": True}):
        ids.append((await driver.enqueue(new_request())).id)
        (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
        nack = NackOptions(job.claim.worker_id, job.claim.claim, error="boom", **options)
        assert await driver.nack(job.id, nack)
    clock.advance(400 * DAY)
    await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    states = []
    for job_id in ids:
        detail = await driver.introspect.get(job_id)
        assert detail is not None
        states.append(detail.row.state)
        assert await driver.client.pttl(driver.namespace.key(f"job:{job_id}")) == -1
    assert states == [JobState.DEAD, JobState.FAILED]


async def test_expired_rows_leave_no_key_and_no_index_entry_behind(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    before = await _keys(driver)
    for _ in range(30):
        await _done(driver, new_request)
    clock.advance(8 * DAY)
    await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    left = await _keys(driver) - before
    # What stays is per job NAME, never per row.
    assert {key.removeprefix(driver.namespace.base) for key in left} <= PER_NAME


async def test_a_row_whose_hash_vanished_is_still_swept_cleanly(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    job_id = await _done(driver, new_request)
    detail = await driver.introspect.get(job_id)
    assert detail is not None
    await driver.client.delete(driver.namespace.key(f"job:{job_id}"))
    clock.advance(8 * DAY)
    await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    left = {k.removeprefix(driver.namespace.base) for k in await _keys(driver)}
    assert left <= PER_NAME
    assert not await driver.client.hexists(driver.namespace.key("runs"), detail.row.run_id)


async def test_a_queue_nobody_claims_from_still_loses_its_expired_done_rows(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    job_id = await _done(driver, new_request)
    clock.advance(8 * DAY)
    # Claims on another queue (holding no row, so "q" is the only queue to pick) sweep it too.
    await driver.claim(worker_id="w", slots={"elsewhere": 1}, visibility_timeout=30)
    assert await driver.introspect.get(job_id) is None
    assert await driver.stats() == []


async def test_a_settle_sweeps_at_least_two_expired_rows_for_each_row_it_settles(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    await driver.enqueue_many([new_request() for _ in range(500)])
    batch = await driver.claim(worker_id="w", slots={"q": 500}, visibility_timeout=30)
    await asyncio.gather(*(driver.ack(j.id, AckOptions("w", j.claim.claim)) for j in batch.jobs))
    await driver.enqueue_many([new_request() for _ in range(250)])
    batch = await driver.claim(worker_id="w", slots={"q": 250}, visibility_timeout=30)
    clock.advance(8 * DAY)
    await asyncio.gather(*(driver.ack(j.id, AckOptions("w", j.claim.claim)) for j in batch.jobs))
    (stats,) = await driver.stats()
    assert stats.done == 250


async def test_counter_buckets_fold_and_age_out_so_a_name_holds_a_bounded_hash(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    for _ in range(3):
        await _done(driver, new_request, with_step=False)
        clock.advance(timedelta(minutes=1))
    clock.advance(31 * DAY)
    await driver.introspect.rollup_counters()
    assert await driver.client.hlen(driver.namespace.key("ctr:job")) == 0
    assert await driver.client.smembers(driver.namespace.key("ctrnames")) == set()
    assert await driver.client.exists(*(driver.namespace.key(k) for k in PER_NAME)) == 0


async def test_expired_events_leave_nothing_once_purged(driver: RedisJobDriver) -> None:
    before = await _keys(driver)
    await driver.events.publish("e", {"n": 1}, ttl=0)
    assert await driver.events.purge_expired() == 1
    assert await _keys(driver) == before


async def test_a_publish_purges_events_that_expired_over_a_minute_ago(
    driver: RedisJobDriver,
) -> None:
    ns = driver.namespace
    stale = to_us(await driver.events.now() - timedelta(minutes=2))
    for n in range(3):
        event_id = f"stale-{n}"
        await driver.client.zadd(ns.key("evby:e"), {event_id: stale})
        await driver.client.zadd(ns.key("evexpiry"), {f"{len(event_id)}:{event_id}e": stale})
    await driver.events.publish("e", {"n": 1}, ttl=0)  # expired, but only just: kept a minute
    await driver.events.publish("e", {"n": 2}, ttl=60)
    assert await driver.client.zcard(ns.key("evby:e")) == 2
    assert await driver.client.zcard(ns.key("evexpiry")) == 2


async def test_an_abandoned_lease_key_carries_a_server_ttl(driver: RedisJobDriver) -> None:
    await driver.leases.acquire("job:x", "h1", limit=1, ttl=30)
    ttl = await driver.client.pttl(driver.namespace.key("lease:job:x"))
    assert 30_000 < ttl <= 3_630_000


async def test_a_claims_list_of_buried_rows_expires_with_the_lease_it_was_claimed_under(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    """The list lets a claim whose reply was lost find the rows it buried; it is kept as long as
    the claim's lease, never forever."""
    await driver.enqueue(new_request(max_attempts=1))
    await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    clock.advance(31)
    batch = await driver.claim(worker_id="w2", slots={"q": 1}, visibility_timeout=30)
    assert len(batch.exhausted) == 1
    ns = driver.namespace
    (buried,) = [key async for key in driver.client.scan_iter(match=ns.key("buried:*"))]
    assert 1_000 <= await driver.client.pttl(buried) <= 30_000


async def test_an_event_is_stamped_on_the_servers_clock_not_the_drivers(
    driver: RedisJobDriver, clock: FrozenClock
) -> None:
    """Every process reading the bus must agree on when an event came; the driver's clock here
    is frozen at another time altogether."""
    clock.set(datetime(2001, 1, 1, tzinfo=UTC))
    seconds, micros = await driver.client.time()
    server_now = datetime.fromtimestamp(seconds + micros / 1e6, tz=UTC)
    record = await driver.events.publish("e", {"n": 1})
    assert abs(record.published_at - server_now) < timedelta(minutes=1)
    assert abs(await driver.events.now() - server_now) < timedelta(minutes=1)


async def test_the_driver_refuses_a_client_that_does_not_decode(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        with pytest.raises(Exception, match="decode responses"):
            redis_job_driver(client)
    finally:
        await client.aclose()
