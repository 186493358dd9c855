"""Where statements run: a pool the driver owns, or a pool or connection it was handed and leaves
open — one transaction at a time on a single connection, never a setting leaked into the
caller's transaction, prepared statements only where the caller's setup allows them."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from ultimat3.jobs.core import DriverUnavailableError, EnqueueRequest, FrozenClock, new_id
from ultimat3.jobs.core.model import Progress, WorkerInfo
from ultimat3.jobs.pg import PgExecutor, postgres_job_driver

pytestmark = pytest.mark.pg


def test_a_driver_is_built_without_an_event_loop(pg_url: str) -> None:
    driver = postgres_job_driver(pg_url)
    assert asyncio.run(_stats_then_close(driver)) == []


async def _stats_then_close(driver: object) -> list[object]:
    stats = await driver.stats()  # type: ignore[attr-defined]
    await driver.close()  # type: ignore[attr-defined]
    return list(stats)


async def test_a_pool_handed_in_stays_open_after_close(pg_url: str) -> None:
    async with AsyncConnectionPool(pg_url, kwargs={"autocommit": True}, open=False) as pool:
        driver = postgres_job_driver(pool)
        assert await driver.stats() == []
        await driver.close()
        assert not pool.closed


async def test_a_closed_owned_executor_refuses_new_statements(pg_url: str) -> None:
    executor = PgExecutor(pg_url)
    await executor.fetch("select 1")
    await executor.close()
    with pytest.raises(DriverUnavailableError):
        await executor.fetch("select 1")


def test_an_empty_url_is_refused_where_the_driver_is_built() -> None:
    with pytest.raises(DriverUnavailableError, match="DATABASE_URL"):
        postgres_job_driver("")


async def test_an_unreachable_server_is_a_driver_unavailable_error() -> None:
    unreachable = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    executor = PgExecutor(unreachable, open_timeout=0.5)
    with pytest.raises(DriverUnavailableError, match="could not connect") as caught:
        await postgres_job_driver(executor).stats()
    # the cause, not only the pool's "initialization incomplete"
    assert "port 1 failed" in str(caught.value)
    await executor.close()


async def test_an_executor_handed_in_stays_open_after_close(pg_url: str) -> None:
    executor = PgExecutor(pg_url)
    driver = postgres_job_driver(executor)
    await driver.stats()
    await driver.close()
    assert await executor.fetch("select 1") == [(1,)]
    await executor.close()


async def test_a_pool_not_in_autocommit_still_commits_what_the_driver_writes(pg_url: str) -> None:
    async with AsyncConnectionPool(pg_url, open=False) as pool:
        driver = postgres_job_driver(pool)
        await driver.introspect.pause_queue("q")
        await driver.close()
    other = postgres_job_driver(pg_url)
    assert await other.introspect.paused_queues() == ["q"]
    await other.close()


async def test_a_connection_handed_in_joins_the_callers_transaction(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        driver = postgres_job_driver(conn)
        async with conn.transaction(force_rollback=True):
            await driver.introspect.pause_queue("q")
            assert await driver.introspect.paused_queues() == ["q"]
        assert await driver.introspect.paused_queues() == []


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "transactions"])
async def test_operations_overlapping_on_one_connection_take_turns(
    pg_url: str, autocommit: bool
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=autocommit) as conn:
        driver = postgres_job_driver(conn, clock=FrozenClock())
        acquires = [driver.leases.acquire(f"k{n}", f"h{n}", limit=1, ttl=30) for n in range(5)]
        reads = [driver.stats() for _ in range(5)]
        answers = await asyncio.gather(*acquires, *reads)
        assert answers == [True] * 5 + [[]] * 5


FIRST_RUN_IS_A_DEADLOCK_VICTIM = """
do $$ begin
  if nextval('victims') = 1 then
    raise exception 'chosen as the deadlock victim' using errcode = '40P01';
  end if;
end $$
"""


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "transactions"])
async def test_a_deadlock_victim_in_the_callers_transaction_runs_again_and_the_transaction_lives(
    pg_url: str, autocommit: bool
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as setup:
        await setup.execute("create sequence victims; create table invoices (n int)")
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=autocommit) as conn:
        executor = PgExecutor(conn)
        async with conn.transaction():
            await conn.execute("insert into invoices values (1)")
            await executor.fetch(FIRST_RUN_IS_A_DEADLOCK_VICTIM)
            cursor = await conn.execute("select count(*) from invoices")
            assert await cursor.fetchone() == (1,)
        cursor = await conn.execute("select last_value from victims")
        assert await cursor.fetchone() == (2,)


async def test_a_relaxed_commit_never_reaches_the_callers_transaction(pg_url: str) -> None:
    clock = FrozenClock()
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        driver = postgres_job_driver(conn, clock=clock)
        await driver.enqueue(
            EnqueueRequest(new_id(), new_id(), "n", "q", None, new_id(), None, 3, clock.now())
        )
        async with conn.transaction():
            [job] = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
            assert await driver.heartbeat(job.id, job.claim, 30)
            assert await driver.introspect.record_progress(job.id, job.claim, Progress(done=1))
            assert await driver.leases.acquire("key", "h", limit=1, ttl=30)
            assert await driver.leases.renew("key", "h", ttl=30)
            await driver.introspect.record_worker(worker(clock), ttl=30)
            cursor = await conn.execute("show synchronous_commit")
            assert await cursor.fetchone() == ("on",)


def worker(clock: FrozenClock) -> WorkerInfo:
    return WorkerInfo(
        id="w",
        host="h",
        started_at=clock.now(),
        queues=("q",),
        slots={"q": 1},
        in_flight=(),
        last_heartbeat=clock.now(),
    )


async def prepared_statements(conn: psycopg.AsyncConnection[Any]) -> int:
    cursor = await conn.execute("select count(*) from pg_prepared_statements", prepare=False)
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("prepare", [True, False])
async def test_an_owned_pool_prepares_its_statements_unless_told_not_to(
    pg_url: str, prepare: bool
) -> None:
    driver = postgres_job_driver(pg_url, pool_max=1, prepare=prepare)
    try:
        await driver.stats()
        await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
        async with driver.executor.connection() as conn:
            assert (await prepared_statements(conn) > 0) is prepare
    finally:
        await driver.close()


async def test_a_pool_handed_in_prepares_as_its_own_threshold_says(pg_url: str) -> None:
    kwargs = {"autocommit": True, "prepare_threshold": None}
    async with AsyncConnectionPool(
        pg_url, kwargs=kwargs, min_size=1, max_size=1, open=False
    ) as pool:
        driver = postgres_job_driver(pool)
        for _ in range(10):
            await driver.stats()
        async with pool.connection() as conn:
            assert await prepared_statements(conn) == 0


async def test_no_connection_from_the_pool_in_time_is_a_driver_unavailable_error(
    pg_url: str,
) -> None:
    """As every driver reports an outage: psycopg-pool's own PoolTimeout names the backend."""
    async with AsyncConnectionPool(pg_url, min_size=1, max_size=1, timeout=0.2, open=False) as pool:
        executor = PgExecutor(pool)
        async with pool.connection():  # the only connection, held
            with pytest.raises(DriverUnavailableError, match="no connection to Postgres came"):
                await executor.fetch("select 1", idempotent=True)
