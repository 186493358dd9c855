"""Faults against the real server: racing claimants, stale settles, connections killed mid-run,
and a server restarted or crashed mid-run (one of the test's own)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from ultimat3.jobs.core import (
    SYSTEM_CLOCK,
    AckOptions,
    EnqueueRequest,
    FrozenClock,
    JobHandle,
    QueueStats,
    Retry,
    job,
    job_worker,
    new_id,
)
from ultimat3.jobs.pg import PostgresJobDriver, install, postgres_job_driver
from ultimat3.jobs.testing.services import Found

pytestmark = pytest.mark.pg

PATIENCE_S = 60.0


def requests(clock: FrozenClock | None, count: int, queue: str = "q") -> list[EnqueueRequest]:
    now = (clock or SYSTEM_CLOCK).now()
    return [
        EnqueueRequest(new_id(), new_id(), "n", queue, {"n": n}, new_id(), None, 3, now)
        for n in range(count)
    ]


async def terminate_other_backends(url: str) -> int:
    """Kill every other session on the test database, as an operator (or a failover) would, and
    wait until they are gone."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        cursor = await admin.execute(
            "select count(pg_terminate_backend(pid, 10000)) from pg_stat_activity "
            "where datname = current_database() and pid <> pg_backend_pid()"
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
async def second(pg_url: str, clock: FrozenClock) -> AsyncIterator[PostgresJobDriver]:
    """Another process's driver: its own pool on the same database and clock."""
    other = postgres_job_driver(pg_url, clock=clock)
    yield other
    await other.close()


async def test_two_claimants_on_one_queue_never_take_the_same_row(
    driver: PostgresJobDriver, second: PostgresJobDriver, clock: FrozenClock
) -> None:
    await driver.enqueue_many(requests(clock, 400))
    taken: Counter[str] = Counter()

    async def claim_all(claimant: PostgresJobDriver, worker: str) -> None:
        while True:
            batch = await claimant.claim(worker_id=worker, slots={"q": 7}, visibility_timeout=30)
            if not batch.jobs:
                return
            taken.update(job.id for job in batch.jobs)

    await asyncio.gather(*(claim_all(d, f"w{n}") for n, d in enumerate([driver, second] * 3)))
    assert len(taken) == 400
    assert set(taken.values()) == {1}


async def test_a_stale_workers_late_ack_answers_false_and_changes_nothing(
    driver: PostgresJobDriver, second: PostgresJobDriver, clock: FrozenClock
) -> None:
    await driver.enqueue_many(requests(clock, 1))
    [stale] = (await driver.claim(worker_id="w1", slots={"q": 1}, visibility_timeout=5)).jobs
    clock.advance(6)
    [fresh] = (await second.claim(worker_id="w2", slots={"q": 1}, visibility_timeout=5)).jobs
    before = await second.introspect.get(fresh.id)
    assert not await driver.ack(stale.id, AckOptions("w1", stale.claim.claim))
    assert await second.introspect.get(fresh.id) == before
    assert await second.ack(fresh.id, AckOptions("w2", fresh.claim.claim))


async def test_settles_land_after_every_connection_was_terminated(
    driver: PostgresJobDriver, clock: FrozenClock, pg_url: str
) -> None:
    await driver.enqueue_many(requests(clock, 50))
    jobs = (await driver.claim(worker_id="w1", slots={"q": 50}, visibility_timeout=30)).jobs
    assert await terminate_other_backends(pg_url) >= 1
    acks = [driver.ack(job.id, AckOptions("w1", job.claim.claim)) for job in jobs]
    assert await asyncio.gather(*acks) == [True] * 50
    [stats] = await driver.stats()
    assert (stats.done, stats.running) == (50, 0)


async def test_an_enqueue_after_the_connections_were_terminated_lands(
    driver: PostgresJobDriver, clock: FrozenClock, pg_url: str
) -> None:
    await driver.enqueue_many(requests(clock, 1))
    await terminate_other_backends(pg_url)
    await driver.enqueue_many(requests(clock, 1))
    [stats] = await driver.stats()
    assert stats.ready == 2


@dataclass
class Tick:
    n: int


def counting_tick(name: str, runs: Counter[int], pause: float) -> JobHandle[Tick, None]:
    """A job on a queue of its own that counts its runs in ``runs`` and takes ``pause`` s."""

    @job(
        name=name,
        input=Tick,
        idempotency_key=lambda i: f"{name}:{i.n}",
        tenant="none",
        queue=name,
        retry=Retry(attempts=20, delay=0.01, jitter=False),
    )
    async def tick(*, input: Tick) -> None:
        runs[input.n] += 1
        await asyncio.sleep(pause)

    return tick


async def terminate_the_workers_backends(admin: psycopg.AsyncConnection[Any]) -> tuple[int, int]:
    """Kill every other session on the test database — the worker's pool — and wait until they
    are gone: how many were killed, and how many rows were running as the kill began (read in
    the same statement, so on its snapshot)."""
    cursor = await admin.execute(
        "with running as (select count(*) as n from x_jobs where state = 'running') "
        "select count(pg_terminate_backend(a.pid, 10000)), (select n from running) "
        "from pg_stat_activity a "
        "where a.datname = current_database() and a.pid <> pg_backend_pid()"
    )
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


RUNS: Counter[int] = Counter()
pg_fault_tick = counting_tick("pg-faults", RUNS, 0.05)  # the kills land mid-run


async def test_a_worker_loses_nothing_while_its_connections_are_terminated(pg_url: str) -> None:
    """The worker's connections are killed three times while its jobs run — each kill lands
    with rows running and others not yet started — and every job is done in the end."""
    count = 800

    async def terminate_mid_run() -> None:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            for started in (50, 200, 350):
                while len(RUNS) < started:
                    await asyncio.sleep(0.01)
                killed, running = await terminate_the_workers_backends(admin)
                assert killed >= 1  # the worker's connections, not an empty room
                assert running >= 1  # rows were running when their connections died
                assert len(RUNS) < count  # the kill landed mid-run

    await loses_nothing(pg_url, pg_fault_tick, RUNS, count, terminate_mid_run)


SLOW_RUNS: Counter[int] = Counter()
pg_restart_tick = counting_tick("pg-restart", SLOW_RUNS, 0.05)  # the fault lands mid-run


@pytest.mark.parametrize("fault", ["restart", "crash"])
async def test_a_worker_loses_nothing_across_a_server_restart_or_crash(
    private_postgres: Found, fault: str
) -> None:
    """The server goes down while jobs run, on a cluster of the test's own, and comes back with
    the same data on the same port: a restart (a fast shutdown), or a crash (an immediate one:
    the WAL not yet written is gone, and it starts through crash recovery). The worker rides it
    out on its pool. Every commit the driver waited for survives even the crash; a claim or a
    renewal it sent with a relaxed commit may be gone, and costs only a delivery. Every job is
    done in the end."""
    url = private_postgres.url
    strike = private_postgres.restart if fault == "restart" else private_postgres.crash
    assert url is not None
    assert strike is not None
    if fault == "crash":  # the test cluster relaxes every commit: a crash is told with real ones
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await admin.execute("alter database postgres set synchronous_commit = on")
    await install(url)

    async def strike_mid_run() -> None:
        while len(SLOW_RUNS) < 60:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(strike)
        assert len(SLOW_RUNS) < 400  # it landed mid-run

    await loses_nothing(url, pg_restart_tick, SLOW_RUNS, 400, strike_mid_run)


async def loses_nothing(
    url: str,
    handle: JobHandle[Tick, None],
    runs: Counter[int],
    count: int,
    fault: Callable[[], Awaitable[None]],
) -> None:
    """``count`` jobs of ``handle`` through one worker while ``fault`` strikes: every one runs,
    and every row ends done. An ack or a claim cut off mid-statement is recovered (sent again,
    read back); any other write that was may or may not have landed, so it is not sent again:
    its row is delivered again once its (short) lease lapses."""
    runs.clear()
    driver = postgres_job_driver(url)
    try:
        await driver.enqueue_many(
            [handle.request(Tick(n), clock=driver.clock) for n in range(count)]
        )
        worker = job_worker(
            driver=driver, context=lambda: None, jobs=[handle], concurrency=20, visibility_timeout=2
        )
        async with worker:
            await asyncio.wait_for(fault(), PATIENCE_S)

            async def all_done() -> None:
                while (await queue_stats(driver, handle.queue)).done < count:
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(all_done(), PATIENCE_S)
        assert set(runs) == set(range(count))
        stats = await queue_stats(driver, handle.queue)
        assert (stats.done, stats.dead, stats.failed) == (count, 0, 0)
    finally:
        await driver.close()


async def queue_stats(driver: PostgresJobDriver, queue: str) -> QueueStats:
    return {s.queue: s for s in await driver.stats()}.get(queue) or QueueStats(queue)


async def test_a_burial_survives_a_server_crash_right_after_its_claim_answered(
    private_postgres: Found,
) -> None:
    """A claim commits without waiting for the disk; one that buried a lapsed final attempt
    makes that durable before it answers, so a crash cannot take the burial back and have the
    next claim bury and announce it a second time."""
    url = private_postgres.url
    assert url is not None
    assert private_postgres.crash is not None
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute("alter database postgres set synchronous_commit = on")
        # The WAL writer flushes relaxed commits within 200 ms: hold it off, so whatever the
        # crash finds unflushed is what the driver itself did not make durable.
        await admin.execute("alter system set wal_writer_delay = '10s'")
        await admin.execute("select pg_reload_conf()")
    await install(url)
    clock = FrozenClock()
    driver = postgres_job_driver(url, clock=clock)
    final = EnqueueRequest(new_id(), new_id(), "n", "q", {}, new_id(), None, 1, clock.now())
    try:
        await driver.enqueue(final)
        await driver.claim(worker_id="died", slots={"q": 1}, visibility_timeout=10)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            # A durable commit of a write flushes the WAL so far: that claim is on disk.
            await admin.execute("create table flushed as select 1 as n")
        clock.advance(11)
        burying = await driver.claim(worker_id="b", slots={"q": 1}, visibility_timeout=10)
        assert [row.id for row in burying.exhausted] == [final.id]
    finally:
        await driver.close()
    await asyncio.to_thread(private_postgres.crash)
    driver = postgres_job_driver(url, clock=clock)
    try:
        after = await driver.claim(worker_id="c", slots={"q": 1}, visibility_timeout=10)
        assert (list(after.jobs), list(after.exhausted)) == ([], [])
        detail = await driver.introspect.get(final.id)
        assert detail is not None
        assert detail.row.state.value == "dead"
    finally:
        await driver.close()
