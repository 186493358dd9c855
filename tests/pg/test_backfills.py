"""The backfill ledger under concurrency: two attempts of one run beginning at once both adopt
its one row."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.pg import PostgresJobDriver

pytestmark = pytest.mark.pg

PATIENCE_S = 20.0


async def until_a_session_waits_on_a_lock(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:

        async def poll() -> None:
            while True:
                cursor = await conn.execute(
                    "select count(*) from pg_stat_activity "
                    "where datname = current_database() and wait_event_type = 'Lock'"
                )
                if (await cursor.fetchone()) != (0,):
                    return
                await asyncio.sleep(0.01)

        await asyncio.wait_for(poll(), PATIENCE_S)


async def test_a_begin_racing_another_for_the_same_run_answers_the_row_that_won(
    driver: PostgresJobDriver, clock: FrozenClock, pg_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url) as other:
        await other.execute(
            "insert into x_backfills (run_id, name, checksum, status, rows, started_at) "
            "values ('run-1', 'bf', 'c', 'running', 0, %s)",
            (clock.now(),),
        )
        began = asyncio.create_task(driver.backfills.begin(name="bf", run_id="run-1", checksum="c"))
        await until_a_session_waits_on_a_lock(pg_url)
        await other.commit()
        row = await began
    assert (row.run_id, row.status, row.started_at) == ("run-1", "running", clock.now())
