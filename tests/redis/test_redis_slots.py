"""Every key a script touches lands in ONE cluster slot, so the driver works on Redis Cluster.

The proof needs no cluster: the server's MONITOR stream shows every command a script runs
(client "lua"), ``COMMAND GETKEYS`` names the keys of each, and the slot of a key is the CRC16 of
its hash tag — computed here and checked against the values Redis documents. The workload runs on
a database index of its own, so only its commands are read.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ultimat3.jobs.core import (
    AckOptions,
    BulkFilter,
    EnqueueRequest,
    FrozenClock,
    JobFilter,
    JobState,
    NackOptions,
    Progress,
    StepRecord,
    new_id,
)
from ultimat3.jobs.core.model import WorkerInfo
from ultimat3.jobs.redis import (
    RedisJobDriver,
    hash_slot,
    redis_job_driver,
    redis_lease_leader,
    redis_scheduler_state,
)
from ultimat3.jobs.redis import introspect as redis_introspect
from ultimat3.jobs.redis.keys import namespace_base
from ultimat3.jobs.redis.scripts import SCRIPT_NAMES, script

_DB = 11
_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"')


def test_hash_slot_agrees_with_the_values_redis_documents() -> None:
    assert hash_slot("somekey") == 11058
    assert hash_slot("foo{hash_tag}") == hash_slot("hash_tag") == 2515
    assert hash_slot("123456789") == 0x31C3  # the CRC16/XMODEM check value


def test_hash_slot_reads_only_the_first_non_empty_tag() -> None:
    assert hash_slot("{user1000}.following") == hash_slot("{user1000}.followers")
    assert hash_slot("foo{}{bar}") == hash_slot("foo{}{bar}x".removesuffix("x"))
    assert hash_slot("foo{}{bar}") != hash_slot("bar")
    assert hash_slot("foo{{bar}}zap") == hash_slot("{bar")


def test_a_prefix_with_braces_is_refused() -> None:
    with pytest.raises(Exception, match="braces"):
        namespace_base("a{b}")


async def _monitor(url: str, seen: list[tuple[int, str, list[str]]]) -> None:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    connection = await client.connection_pool.get_connection()
    try:
        await connection.send_command("MONITOR")
        await connection.read_response()
        while True:
            line = await connection.read_response(timeout=60)
            if line is None:
                continue
            found = re.match(r"[\d.]+ \[(\d+) (\S+)\] (.*)", line)
            if found is None:
                continue
            tokens = [t.replace('\\"', '"').replace("\\\\", "\\") for t in _TOKEN.findall(found[3])]
            seen.append((int(found[1]), found[2], tokens))
    finally:
        await connection.disconnect()
        await client.aclose()


async def _every_script(driver: RedisJobDriver, clock: FrozenClock) -> None:
    """One pass through the driver's whole surface: every script runs at least once."""

    def row(delay: float = 0.0) -> EnqueueRequest:
        return EnqueueRequest(
            id=new_id(),
            run_id=new_id(),
            name="slots",
            queue="q",
            input={"n": 1},
            idempotency_key=new_id(),
            tenant_id=None,
            max_attempts=2,
            run_at=clock.now() + timedelta(seconds=delay),
        )

    introspect = driver.introspect
    await driver.enqueue_many([row(), row(), row(), row(delay=3600)])
    batch = await driver.claim(worker_id="w", slots={"q": 3}, visibility_timeout=30)
    first, second, third = batch.jobs
    await driver.save_step(first.id, first.claim, first.run_id, StepRecord("s", 0, {"a": 1}))
    await introspect.record_progress(first.id, first.claim, Progress(1, 2))
    await driver.heartbeat(first.id, first.claim, 30)
    await driver.ack(first.id, AckOptions(first.claim.worker_id, first.claim.claim, 5))
    await driver.nack(second.id, NackOptions(second.claim.worker_id, second.claim.claim, "x"))
    await driver.stats()
    await introspect.list(JobFilter(limit=10))
    await introspect.get(first.id)
    await introspect.requeue(first.id)
    await introspect.cancel(first.id, "stop")
    await introspect.requeue_many(BulkFilter(state=JobState.CANCELLED))
    await introspect.remove(first.id)
    waiting = (await introspect.list(JobFilter(state=JobState.DELAYED))).rows[0]
    await introspect.promote(waiting.id)
    await introspect.pause_queue("q")
    await introspect.resume_queue("q")
    now = clock.now()
    await introspect.record_worker(WorkerInfo("w", "h", now, ["q"], {"q": 1}, [], now), ttl=30)
    await introspect.workers()
    await introspect.remove_worker("w")
    await introspect.record_task_fire("nightly", 1)
    clock.advance(timedelta(days=2))
    await introspect.rollup_counters()
    clock.advance(31)
    await driver.claim(worker_id="w2", slots={"q": 5}, visibility_timeout=30)  # buries `third`
    del third
    # What a claim whose reply was lost runs to take its rows back (test_redis_wire.py).
    await driver._ns.call("claimed", "w2", new_id(), "0", "1", "q")
    await driver.leases.acquire("k", "h", limit=1, ttl=10)
    await driver.leases.holders("k")
    await driver.backfills.begin(name="b", run_id="r", checksum="c")
    await driver.backfills.checkpoint("r", rows=1, cursor=None)
    await driver.events.publish("e", {"a": 1})
    await driver.events.purge_expired()
    state = redis_scheduler_state(driver)
    await state.arm("t", 1)
    await state.fire("t", 2, [row()], previous=1)
    await redis_lease_leader(driver).acquire()


_Isolated = tuple[str, RedisJobDriver, FrozenClock]


def _on_db(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{_DB}"))


@pytest.fixture
async def isolated(redis_url: str, redis_prefix: str) -> AsyncIterator[_Isolated]:
    """A driver on database index ``_DB``, which no other test reads."""
    client = aioredis.Redis.from_url(_on_db(redis_url), decode_responses=True)
    assert client.connection_pool.connection_kwargs["db"] == _DB
    clock = FrozenClock()
    driver = redis_job_driver(client, prefix=redis_prefix, clock=clock)
    yield redis_prefix, driver, clock
    await driver.clear()
    await driver.close()
    await client.aclose()


async def test_every_key_every_script_touches_shares_the_namespace_slot(
    redis_url: str, isolated: _Isolated, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, driver, clock = isolated
    # One row spends a bulk action's budget, so what it left is counted too (bulk_count.lua).
    monkeypatch.setattr(redis_introspect, "MAX_BULK_ROWS", 1)
    url = _on_db(redis_url)
    seen: list[tuple[int, str, list[str]]] = []
    monitor = asyncio.ensure_future(_monitor(url, seen))
    await asyncio.sleep(0.2)
    await _every_script(driver, clock)
    marker = f"slots-done-{new_id()}"
    await driver.client.echo(marker)
    for _ in range(200):
        if any(marker in tokens for _, _, tokens in seen):
            break
        await asyncio.sleep(0.02)
    monitor.cancel()
    ours = [tokens for db, client, tokens in seen if db == _DB]
    called = {tokens[1] for tokens in ours if tokens and tokens[0].lower() == "evalsha"}
    assert {script(name).sha for name in SCRIPT_NAMES} <= called, "a script never ran"

    slot = hash_slot(namespace_base(prefix))
    keys_seen = 0
    for tokens in (t for db, client, t in seen if db == _DB and client == "lua"):
        try:
            keys = await driver.client.command_getkeys(*tokens)
        except ResponseError:
            continue  # PUBLISH, TIME: no keys
        for key in keys:
            keys_seen += 1
            assert hash_slot(key) == slot, f"{key!r} ({tokens[0]}) is outside the slot"
    assert keys_seen > 100


async def test_every_key_the_namespace_holds_shares_its_slot(isolated: _Isolated) -> None:
    prefix, driver, clock = isolated
    await _every_script(driver, clock)
    keys = [key async for key in driver.client.scan_iter(match=f"*{prefix}*", count=1000)]
    assert keys
    slot = hash_slot(namespace_base(prefix))
    assert {hash_slot(key) for key in keys} == {slot}
