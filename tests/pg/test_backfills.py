"""The backfill ledger under concurrency (two attempts of one run beginning at once both adopt
its one row) and across the upgrade that gave passes their begin order."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import psycopg
import pytest

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.pg import PostgresJobDriver, install, postgres_job_driver

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


STARTED = datetime(2026, 3, 2, 9, tzinfo=UTC)

BACKFILLS_BEFORE_BEGIN_ORDER = """
create table x_backfills (
    run_id       text collate "C" primary key,
    name         text collate "C" not null,
    checksum     text not null,
    status       text not null check (status in ('running', 'completed', 'failed')),
    app_version  text,
    rows         bigint not null default 0,
    cursor       jsonb,
    started_at   timestamptz not null,
    completed_at timestamptz,
    error        text
);
create index x_backfills_name_idx on x_backfills (name, started_at desc);
insert into x_backfills (run_id, name, checksum, status, rows, started_at)
values ('run-1', 'bf', 'c', 'completed', 0, '2026-03-02T09:00:00Z'),
       ('run-2', 'bf', 'c', 'failed', 0, '2026-03-02T09:00:00Z');
"""
"""x_backfills as installs made it before passes carried their begin order, with two passes of
one name that began at one instant."""


async def test_install_orders_the_passes_of_a_database_made_before_begin_order(
    pg_database_url: str,
) -> None:
    """The passes stored before get a place each, and one begun since at the same instant is
    newer than both; installing again adds nothing more."""
    with psycopg.connect(pg_database_url) as conn:
        conn.execute(BACKFILLS_BEFORE_BEGIN_ORDER)
    await install(pg_database_url)
    await install(pg_database_url)
    with psycopg.connect(pg_database_url) as conn:
        sequences = conn.execute(
            "select count(*) from pg_class where relkind = 'S' and relname like 'x_backfills%'"
        ).fetchone()
        indexes = conn.execute(
            "select indexname from pg_indexes where tablename = 'x_backfills' order by 1"
        ).fetchall()
    assert sequences == (1,)
    assert indexes == [("x_backfills_newest_idx",), ("x_backfills_pkey",)]
    driver = postgres_job_driver(pg_database_url, clock=FrozenClock(STARTED))
    try:
        await driver.backfills.begin(name="bf", run_id="run-0", checksum="c")
        listed = [row.run_id for row in await driver.backfills.list(name="bf")]
        latest = await driver.backfills.latest("bf")
    finally:
        await driver.close()
    assert (listed[0], sorted(listed[1:])) == ("run-0", ["run-1", "run-2"])
    assert latest is not None
    assert latest.run_id == "run-0"
