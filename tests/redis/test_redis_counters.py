"""The counter rollup reads only the buckets it folds, found in a bucket index kept beside each
job's hash: the index heals itself from a hash an older driver wrote, and lives and goes with
the hash."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import cast

import pytest
from redis.typing import EncodableT

from ultimat3.jobs.core import AckOptions, EnqueueRequest, FrozenClock
from ultimat3.jobs.core.constants import COUNTER_TIERS
from ultimat3.jobs.core.counters import bucket_start, rollup
from ultimat3.jobs.core.model import CounterBucket
from ultimat3.jobs.redis import RedisJobDriver, redis_job_driver

RequestBuilder = Callable[..., EnqueueRequest]

_WHOLE_HASH_READS = ("cmdstat_hgetall", "cmdstat_hkeys", "cmdstat_hvals", "cmdstat_hscan")


def _history(now: datetime) -> dict[tuple[int, datetime], CounterBucket]:
    """A full history of job "n": every bucket each tier keeps (4,176), most of them all kinds."""
    history: dict[tuple[int, datetime], CounterBucket] = {}
    for width, retention in COUNTER_TIERS:
        newest = bucket_start(now, width)
        for i in range(retention // width):
            start = newest - timedelta(seconds=i * width)
            history[(width, start)] = CounterBucket(
                name="n",
                start=start,
                width_s=width,
                done=i % 7 + 1,
                retried=i % 2,
                failed=i % 3,
                dead=i % 5,
                duration_ms=i,
            )
    return history


def _fields(buckets: list[CounterBucket]) -> dict[EncodableT, EncodableT]:
    """Buckets as the driver stores them: ``<width>:<start>:<kind or ms>`` -> count."""
    return {
        f"{b.width_s}:{int(b.start.timestamp())}:{kind}": str(count)
        for b in buckets
        for kind, count in (
            ("done", b.done),
            ("retried", b.retried),
            ("failed", b.failed),
            ("dead", b.dead),
            ("ms", b.duration_ms),
        )
        if count
    }


async def _write_as_an_older_driver(driver: RedisJobDriver, buckets: list[CounterBucket]) -> None:
    """Counter fields written the way a driver without the bucket index wrote them."""
    await driver.client.hset(driver.namespace.key("ctr:n"), mapping=_fields(buckets))
    await driver.client.sadd(driver.namespace.key("ctrnames"), "n")


async def _assert_index_is_true(driver: RedisJobDriver, name: str) -> None:
    """The index lists exactly the hash's buckets, and its count is the hash's length."""
    ns = driver.namespace
    held = cast(list[str], await driver.client.hkeys(ns.key(f"ctr:{name}")))
    indexed = await driver.client.zrange(ns.key(f"ctridx:{name}"), 0, -1)
    assert sorted(indexed) == sorted({field.rpartition(":")[0] for field in held})
    assert await driver.client.get(ns.key(f"ctrlen:{name}")) == str(len(held))


async def _whole_hash_reads(driver: RedisJobDriver) -> int:
    stats = await driver.client.info("commandstats")
    return sum(stats.get(name, {}).get("calls", 0) for name in _WHOLE_HASH_READS)


@pytest.fixture
async def private_driver(
    private_redis_url: str, clock: FrozenClock
) -> AsyncIterator[RedisJobDriver]:
    """A driver on a server only this test uses, so the server's command counts are its own."""
    built = redis_job_driver(url=private_redis_url, clock=clock)
    yield built
    await built.close()


async def test_a_rollup_beside_a_full_history_never_reads_the_whole_hash(
    private_driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    driver = private_driver
    history = _history(clock.now())
    await _write_as_an_older_driver(driver, list(history.values()))
    await driver.introspect.rollup_counters()  # indexes the older driver's hash, once
    await driver.enqueue(new_request(name="n"))
    (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert await driver.ack(job.id, AckOptions("w", job.claim.claim, duration_ms=3))
    settled = clock.now()
    before = await _whole_hash_reads(driver)
    for _ in range(6):  # a minute bucket is due each time, a five-minute one once
        clock.advance(60)
        await driver.introspect.rollup_counters()
    assert await _whole_hash_reads(driver) == before
    mine = CounterBucket("n", bucket_start(settled, 60), 60, done=1, duration_ms=3)
    key = (60, mine.start)
    history[key] = history[key].merged(mine)
    since = clock.now() - timedelta(days=365)
    assert await driver.introspect.counters("n", since=since) == rollup(
        history.values(), clock.now()
    )
    await _assert_index_is_true(driver, "n")


async def test_a_hash_an_older_driver_wrote_is_indexed_and_rolls_up_as_the_core_rule_says(
    driver: RedisJobDriver, clock: FrozenClock
) -> None:
    now = clock.now()
    history = list(_history(now).values())
    await _write_as_an_older_driver(driver, history)
    await driver.introspect.rollup_counters()
    since = now - timedelta(days=365)
    folded = rollup(history, now)
    assert await driver.introspect.counters("n", since=since) == folded
    await _assert_index_is_true(driver, "n")
    # An older driver still in the fleet settles in a new minute (a bucket the index does not
    # know of); the next rollup notices the count is off, indexes the hash again, and folds it.
    clock.advance(60)
    late = CounterBucket("n", bucket_start(clock.now(), 60), 60, dead=2)
    await _write_as_an_older_driver(driver, [late])
    clock.advance(timedelta(days=1, minutes=1))
    await driver.introspect.rollup_counters()
    expected = rollup([*folded, late], clock.now())
    assert await driver.introspect.counters("n", since=since) == expected
    await _assert_index_is_true(driver, "n")


async def test_two_rollups_at_once_fold_each_bucket_once(
    driver: RedisJobDriver, clock: FrozenClock, redis_url: str
) -> None:
    now = clock.now()
    history = list(_history(now).values())
    await _write_as_an_older_driver(driver, history)
    await driver.introspect.rollup_counters()
    clock.advance(timedelta(days=2))
    others = [redis_job_driver(url=redis_url, prefix=driver.prefix, clock=clock) for _ in range(3)]
    try:
        await asyncio.gather(*(d.introspect.rollup_counters() for d in [driver, *others]))
    finally:
        await asyncio.gather(*(d.close() for d in others))
    since = now - timedelta(days=365)
    assert await driver.introspect.counters("n", since=since) == rollup(history, clock.now())
    await _assert_index_is_true(driver, "n")


async def test_the_bucket_index_lives_and_goes_with_its_hash(
    driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    ns = driver.namespace
    await driver.enqueue(new_request())
    (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert await driver.ack(job.id, AckOptions("w", job.claim.claim))
    counters, beside = ns.key("ctr:job"), [ns.key("ctridx:job"), ns.key("ctrlen:job")]
    await _assert_index_is_true(driver, "job")
    # A TTL an operator gave the hash is copied; taken off, it is taken off the index too.
    await driver.client.pexpire(counters, 60_000)
    await driver.introspect.rollup_counters()
    assert all(0 < ttl <= 60_000 for ttl in [await driver.client.pttl(key) for key in beside])
    await driver.client.persist(counters)
    await driver.introspect.rollup_counters()
    assert [await driver.client.pttl(key) for key in beside] == [-1, -1]
    # The hash gone (its TTL ran out): the next rollup removes the index and the name.
    await driver.client.delete(counters)
    await driver.introspect.rollup_counters()
    assert await driver.client.exists(*beside) == 0
    assert await driver.client.smembers(ns.key("ctrnames")) == set()
    # clear() removes a live index with everything else.
    await driver.enqueue(new_request())
    (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert await driver.ack(job.id, AckOptions("w", job.claim.claim))
    assert await driver.client.exists(*beside) == 2
    await driver.clear()
    assert await driver.client.exists(counters, *beside) == 0
