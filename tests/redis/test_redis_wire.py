"""The driver's pipelined connection: many calls in flight, each answered with its own reply; a
deadline on each; and what a call whose connection broke is told.

The faults go through ``Relay``, a TCP relay in this process between the connection and the test
server, which can swallow every command (a server that stopped answering, the socket open) or
drop the connection as the next reply comes back (the command ran; its caller never hears).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError, ResponseError
from support.jobs import Item, item_job

from ultimat3.jobs.core import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    AckOptions,
    DriverUnavailableError,
    EnqueueRequest,
    FrozenClock,
    JobState,
    NackOptions,
    Retry,
    job_worker,
)
from ultimat3.jobs.redis import RedisJobDriver, redis_job_driver
from ultimat3.jobs.redis.wire import Wire, pack

RequestBuilder = Callable[..., EnqueueRequest]


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


async def test_a_call_made_while_the_connection_opens_waits_for_its_setup(wire: Wire) -> None:
    """redis-py's connection counts as connected from the socket's opening, before its setup
    exchange with the server is over: a call written then would take that exchange's replies."""
    connection = wire._connection
    setup = connection.on_connect_check_health
    in_setup, go_on = asyncio.Event(), asyncio.Event()

    async def held_setup(*args: Any, **kwargs: Any) -> None:
        in_setup.set()
        await go_on.wait()
        await setup(*args, **kwargs)

    connection.on_connect_check_health = held_setup  # type: ignore[method-assign]
    first = asyncio.ensure_future(wire.call(["ECHO", "first"]))
    await in_setup.wait()
    assert connection.is_connected  # the socket is open, its setup not done
    second = asyncio.ensure_future(wire.call(["ECHO", "second"]))
    await asyncio.sleep(0.1)
    assert not second.done()
    go_on.set()
    assert await asyncio.gather(first, second) == ["first", "second"]


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


async def test_a_lone_call_cancelled_while_its_reply_is_owed_fails_no_call_behind_it(
    wire: Wire, client: aioredis.Redis, redis_prefix: str
) -> None:
    """A job body cancelled (its timeout, a drain) while it awaits a driver call: the caller
    leaves, the stream goes on, and the calls queued behind it get their own replies."""
    await wire.call(["PING"])
    waiting = asyncio.create_task(wire.call(["BLPOP", f"{redis_prefix}:nothing", "1"]))
    await asyncio.sleep(0.05)
    behind = asyncio.create_task(wire.call(["SET", f"{redis_prefix}:behind", "written"]))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await behind == "OK"
    assert await client.get(f"{redis_prefix}:behind") == "written"
    assert await wire.call(["ECHO", "still open"]) == "still open"
    await client.delete(f"{redis_prefix}:behind")


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


# -- faults, through a relay -------------------------------------------------------------------


class Relay:
    def __init__(self, target: str) -> None:
        self._target = urlsplit(target)
        self._server: asyncio.Server | None = None
        self._pairs: set[asyncio.Task[None]] = set()
        self.silent = False
        """Commands are swallowed: the server never sees them and nothing comes back."""
        self.reading = asyncio.Event()
        """Cleared: the relay stops reading what the client sends, until it is set again (the
        client's socket buffers fill, and its writes wait on the transport)."""
        self.reading.set()
        self._drop_at_reply = False

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._pair, "127.0.0.1", 0)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        user = self._target.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
        return urlunsplit(self._target._replace(netloc=netloc))

    def drop_at_next_reply(self) -> None:
        """The next reply the server sends closes the connection instead of arriving."""
        self._drop_at_reply = True

    async def _pair(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pairs.add(task)
        up_reader, up_writer = await asyncio.open_connection(
            self._target.hostname, self._target.port or 6379
        )
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, upstream=True),
                self._pump(up_reader, writer, upstream=False),
            )
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            writer.close()
            up_writer.close()
            self._pairs.discard(task)

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        while True:
            if upstream:
                await self.reading.wait()
            data = await source.read(65536)
            if not data:
                break
            if upstream and self.silent:
                continue
            if not upstream and self._drop_at_reply:
                self._drop_at_reply = False
                raise ConnectionResetError("the relay dropped the connection")
            sink.write(data)
            await sink.drain()
        sink.close()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pairs):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.fixture
async def relay(redis_url: str) -> AsyncIterator[Relay]:
    started = Relay(redis_url)
    await started.start()
    yield started
    await started.close()


@pytest.fixture
async def relayed(
    relay: Relay, redis_prefix: str, clock: FrozenClock
) -> AsyncIterator[RedisJobDriver]:
    """A driver reaching the server through the relay, its scripts already loaded."""
    built = redis_job_driver(url=relay.url, prefix=redis_prefix, clock=clock, command_timeout=0.5)
    await built.stats()
    yield built
    relay.silent = False
    await built.close()


async def test_a_server_that_stops_answering_fails_every_call_in_flight_at_the_deadline(
    relay: Relay,
) -> None:
    client = aioredis.Redis.from_url(relay.url, decode_responses=True)
    wire = Wire(client, timeout=0.3)
    try:
        assert await wire.call(["ECHO", "before"]) == "before"
        relay.silent = True
        calls = [wire.call(["ECHO", str(i)]) for i in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        assert all(isinstance(r, ConnectionError) for r in results), results
        assert "command_timeout=0.3" in str(results[0])
        relay.silent = False
        assert await wire.call(["ECHO", "after"]) == "after"
    finally:
        await wire.close()
        await client.aclose()


async def test_a_call_cancelled_while_its_command_waits_on_the_transport_breaks_nothing(
    relay: Relay, redis_prefix: str
) -> None:
    """A write that waits for a full socket (a large step output, a slow network) cancelled
    with its caller: the command is buffered whole and still goes out; no call fails for it."""
    client = aioredis.Redis.from_url(relay.url, decode_responses=True)
    wire = Wire(client, timeout=30)
    try:
        assert await wire.call(["PING"]) == "PONG"
        relay.reading.clear()
        big = "x" * 16_000_000  # past what the socket buffers between client and relay hold
        first = asyncio.create_task(wire.call(["SET", f"{redis_prefix}:a", big]))
        second = asyncio.create_task(wire.call(["SET", f"{redis_prefix}:b", big]))
        while (
            not (writer := wire._connection._writer) or not writer.transport.get_write_buffer_size()
        ):
            await asyncio.sleep(0.01)
        second.cancel()
        await asyncio.sleep(0.05)
        relay.reading.set()
        assert await first == "OK"
        with pytest.raises(asyncio.CancelledError):
            await second
        assert await wire.call(["ECHO", "still open"]) == "still open"
        assert await client.strlen(f"{redis_prefix}:b") == len(big)
        await client.delete(f"{redis_prefix}:a", f"{redis_prefix}:b")
    finally:
        relay.reading.set()
        await wire.close()
        await client.aclose()


async def test_the_driver_gives_its_command_timeout_to_its_connection(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder
) -> None:
    relay.silent = True
    with pytest.raises(ConnectionError, match=r"command_timeout=0\.5"):
        await asyncio.wait_for(relayed.enqueue(new_request()), 10)
    relay.silent = False
    assert not (await relayed.enqueue(new_request())).deduped


async def test_a_call_after_the_server_closed_an_idle_connection_dials_afresh_first(
    wire: Wire, client: aioredis.Redis, redis_prefix: str
) -> None:
    name = f"{redis_prefix}-idle"
    assert await wire.call(["CLIENT", "SETNAME", name]) == "OK"
    (held,) = [c for c in await client.client_list() if c["name"] == name]
    await client.client_kill_filter(_id=held["id"])
    await asyncio.sleep(0.2)  # the server's end of stream reaches this process
    assert await wire.call(["ECHO", "again"]) == "again"


async def test_an_enqueue_whose_reply_was_lost_raises_instead_of_answering_deduped(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder
) -> None:
    request = new_request()
    relay.drop_at_next_reply()
    with pytest.raises(ConnectionError):
        await relayed.enqueue(request)
    assert (await relayed.enqueue(request)).deduped  # it did land, once


async def test_an_ack_whose_reply_was_lost_is_sent_again_and_counted_once(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder, clock: FrozenClock
) -> None:
    queued = await relayed.enqueue(new_request())
    (job,) = (await relayed.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    relay.drop_at_next_reply()
    assert await relayed.ack(job.id, AckOptions(job.claim.worker_id, job.claim.claim))
    detail = await relayed.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.DONE
    since = clock.now() - timedelta(hours=1)
    [totals] = await relayed.introspect.counter_totals(since=since)
    assert totals.done == 1


async def test_a_nack_whose_reply_was_lost_is_sent_again_and_answers_true_counted_once(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder, clock: FrozenClock
) -> None:
    queued = await relayed.enqueue(new_request())
    (job,) = (await relayed.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    relay.drop_at_next_reply()
    assert await relayed.nack(job.id, NackOptions("w", job.claim.claim, error="x"))
    detail = await relayed.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.state, detail.row.last_error) == (JobState.READY, "x")
    [totals] = await relayed.introspect.counter_totals(since=clock.now() - timedelta(hours=1))
    assert totals.retried == 1


async def test_a_nack_sent_again_after_an_operator_cancelled_the_row_answers_false(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder
) -> None:
    queued = await relayed.enqueue(new_request())
    (job,) = (await relayed.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    await relayed.introspect.cancel(queued.id)
    relay.drop_at_next_reply()
    assert not await relayed.nack(job.id, NackOptions("w", job.claim.claim, error="x"))
    detail = await relayed.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.CANCELLED


async def test_a_nack_sent_again_after_a_cancel_and_a_requeue_answers_false(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder
) -> None:
    """The requeued row is ready, as the nack would have sent it: it must not read as the nack
    having landed because it still carried the cancelled run's worker and claim."""
    queued = await relayed.enqueue(new_request())
    (job,) = (await relayed.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    await relayed.introspect.cancel(queued.id)
    await relayed.introspect.requeue(queued.id)
    relay.drop_at_next_reply()
    assert not await relayed.nack(job.id, NackOptions("w", job.claim.claim, error="x"))
    detail = await relayed.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.state, detail.row.last_error) == (JobState.READY, None)


async def test_a_claim_whose_reply_was_lost_answers_the_rows_it_took_and_no_more(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder
) -> None:
    """Its rows would otherwise run under a claim nobody holds until the lease lapsed: on a
    final attempt a row would then be buried dead without having run."""
    queued = await relayed.enqueue_many([new_request() for _ in range(3)])
    relay.drop_at_next_reply()
    batch = await relayed.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    assert [job.id for job in batch.jobs] == [queued[0].id, queued[1].id]
    (stats,) = await relayed.stats()
    assert (stats.running, stats.ready) == (2, 1)
    for job in batch.jobs:
        assert await relayed.ack(job.id, AckOptions("w", job.claim.claim))
    (stats,) = await relayed.stats()
    assert (stats.running, stats.done) == (0, 2)


async def test_a_claim_whose_reply_was_lost_answers_the_rows_it_buried(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder, clock: FrozenClock
) -> None:
    """A lapsed final attempt the claim buried is in its answer, so on_exhausted is told of it;
    before, the read-back found only the rows it took, and the burial went untold."""
    final, other = await relayed.enqueue_many([new_request(max_attempts=1), new_request()])
    await relayed.claim(worker_id="gone", slots={"q": 2}, visibility_timeout=30)
    clock.advance(31)
    relay.drop_at_next_reply()
    batch = await relayed.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    assert [(job.id, job.state) for job in batch.exhausted] == [(final.id, JobState.DEAD)]
    assert [job.id for job in batch.jobs] == [other.id]
    (stats,) = await relayed.stats()
    assert (stats.dead, stats.running) == (1, 1)


def fail_once(driver: RedisJobDriver, script: str, *, run_later: list[tuple[Any, ...]]) -> None:
    """The driver's next call of ``script`` fails as a lost connection does. Its arguments go
    to ``run_later`` unsent, unless ``script`` is the read-back ("claimed")."""
    namespace = driver.namespace
    call = namespace.call

    async def failing(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == script:
            namespace.call = call  # type: ignore[method-assign]
            run_later.append((name, *args))
            raise ConnectionError("the connection went away")
        return await call(name, *args, **kwargs)

    namespace.call = failing  # type: ignore[method-assign]


async def test_a_claim_whose_reply_was_lost_and_whose_read_back_failed_is_answered_later(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder, clock: FrozenClock
) -> None:
    """The claim ran and its reply was lost, then its read-back failed too (the server
    stalled): the claim fails, and the next one answers its row, its lease renewed to the new
    claim's, instead of leaving a final attempt to lapse unrun and be buried."""
    queued = await relayed.enqueue(new_request(max_attempts=1))
    relay.drop_at_next_reply()
    fail_once(relayed, "claimed", run_later=[])
    with pytest.raises(DriverUnavailableError):
        await relayed.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    clock.advance(5)
    (job,) = (await relayed.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert job.id == queued.id
    assert job.lease_until == clock.now() + timedelta(seconds=30)
    detail = await relayed.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.lease_until == job.lease_until
    assert not (await relayed.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs


async def test_a_claim_that_ran_after_its_read_back_is_answered_by_a_later_claim(
    relayed: RedisJobDriver, new_request: RequestBuilder, clock: FrozenClock
) -> None:
    """The claim was still on its way (a stalled server) when its read-back found nothing; it
    ran afterwards, taking one row and burying another. The next claim answers both."""
    final, other = await relayed.enqueue_many([new_request(max_attempts=1), new_request()])
    await relayed.claim(worker_id="gone", slots={"q": 2}, visibility_timeout=30)
    clock.advance(31)
    late: list[tuple[Any, ...]] = []
    fail_once(relayed, "claim", run_later=late)
    assert not (await relayed.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)).jobs
    (name, *args) = late[0]
    await relayed.namespace.call(name, *args)  # the claim arrives
    batch = await relayed.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    assert [job.id for job in batch.jobs] == [other.id]
    assert [(row.id, row.state) for row in batch.exhausted] == [(final.id, JobState.DEAD)]
    clock.advance(1)
    batch = await relayed.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    assert not batch.jobs
    assert not batch.exhausted  # told once


async def test_a_final_nack_that_had_not_landed_when_another_claim_buried_the_row_answers_false(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder, clock: FrozenClock
) -> None:
    """The row is dead either way, but under the burial's LEASE_LAPSED_FINAL_ATTEMPT, not the
    nack's error: the nack did not land, and says so."""
    queued = await relayed.enqueue(new_request(max_attempts=1))
    (job,) = (await relayed.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    clock.advance(31)
    assert (await relayed.claim(worker_id="other", slots={"q": 1}, visibility_timeout=30)).exhausted
    relay.drop_at_next_reply()
    options = NackOptions("w", job.claim.claim, error="x", dead_letter=True)
    assert not await relayed.nack(job.id, options)
    detail = await relayed.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.last_error == LEASE_LAPSED_FINAL_ATTEMPT


async def test_a_read_whose_reply_was_lost_is_asked_again(
    relay: Relay, relayed: RedisJobDriver, new_request: RequestBuilder
) -> None:
    await relayed.enqueue(new_request())
    relay.drop_at_next_reply()
    (stats,) = await relayed.stats()
    assert stats.ready == 1


async def test_a_worker_sends_an_ack_again_until_a_server_that_stopped_answering_takes_it(
    relay: Relay, redis_prefix: str
) -> None:
    """The server stops answering as a job completes, for longer than the driver's own resend
    of the settle (two command timeouts): the worker keeps sending the ack while the run holds
    its lease, and the job's one attempt ends done instead of lapsing into a dead letter."""
    driver = redis_job_driver(url=relay.url, prefix=redis_prefix, command_timeout=0.3)
    started, release = asyncio.Event(), asyncio.Event()

    async def waits_for_the_outage(*, input: Item) -> None:
        started.set()
        await release.wait()

    handle = item_job(waits_for_the_outage, retry=Retry(attempts=1))
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], poll_interval=0.05)
    try:
        async with worker:
            queued = await driver.enqueue(handle.request(Item(1)))
            await asyncio.wait_for(started.wait(), 10)
            relay.silent = True
            release.set()
            await asyncio.sleep(1.5)  # the ack, its resend and a few of the worker's time out
            assert worker.stats.completed == 0
            relay.silent = False
            for _ in range(200):
                if worker.stats.completed:
                    break
                await asyncio.sleep(0.05)
        assert worker.stats.completed == 1
        detail = await driver.introspect.get(queued.id)
        assert detail is not None
        assert detail.row.state is JobState.DONE
    finally:
        relay.silent = False
        await driver.clear()
        await driver.close()
