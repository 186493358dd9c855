"""The driver's pipelined connection: many calls in flight, each answered with its own reply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError, ResponseError

from ultimat3.jobs.redis.wire import Wire, pack


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    built = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield built
    await built.aclose()


@pytest.fixture
async def wire(client: aioredis.Redis) -> AsyncIterator[Wire]:
    built = Wire(client)
    yield built
    await built.close()


def test_pack_writes_the_redis_protocol() -> None:
    assert pack(["SET", "k", "é"]) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\xc3\xa9\r\n"


async def test_concurrent_calls_each_get_their_own_reply(wire: Wire, redis_prefix: str) -> None:
    replies = await asyncio.gather(
        *(wire.call(["ECHO", f"{redis_prefix}-{i}"]) for i in range(200))
    )
    assert replies == [f"{redis_prefix}-{i}" for i in range(200)]


async def test_an_error_reply_fails_only_its_own_call(wire: Wire) -> None:
    results = await asyncio.gather(
        wire.call(["ECHO", "a"]),
        wire.call(["NOT-A-COMMAND"]),
        wire.call(["ECHO", "b"]),
        return_exceptions=True,
    )
    assert results[0] == "a"
    assert isinstance(results[1], ResponseError)
    assert results[2] == "b"


async def test_a_broken_connection_fails_the_calls_in_flight_and_the_next_call_redials(
    wire: Wire, client: aioredis.Redis, redis_prefix: str
) -> None:
    name = f"{redis_prefix}-wire"
    assert await wire.call(["CLIENT", "SETNAME", name]) == "OK"
    blocked = asyncio.ensure_future(wire.call(["BLPOP", f"{redis_prefix}:never", "5"]))
    await asyncio.sleep(0.1)
    (held,) = [c for c in await client.client_list() if c["name"] == name]
    await client.client_kill_filter(_id=held["id"])
    with pytest.raises(ConnectionError):
        await blocked
    assert await wire.call(["ECHO", "again"]) == "again"
