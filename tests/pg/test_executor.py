"""Where statements run: a pool the driver owns, or one it was handed and leaves open."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from ultimat3.jobs.core import DriverUnavailableError
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
    with pytest.raises(DriverUnavailableError, match="could not connect"):
        await postgres_job_driver(executor).stats()
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
