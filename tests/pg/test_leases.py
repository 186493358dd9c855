"""Fleet slots under real concurrency: acquirers racing on one key never exceed its limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.pg import PostgresJobDriver, postgres_job_driver

pytestmark = pytest.mark.pg


@pytest.fixture
async def fleet(pg_url: str, clock: FrozenClock) -> AsyncIterator[list[PostgresJobDriver]]:
    """Four processes' drivers on one database."""
    drivers = [postgres_job_driver(pg_url, clock=clock) for _ in range(4)]
    yield drivers
    for each in drivers:
        await each.close()


async def test_racing_acquirers_never_exceed_the_limit(fleet: list[PostgresJobDriver]) -> None:
    attempts = [
        fleet[n % len(fleet)].leases.acquire("job:report", f"holder-{n}", limit=3, ttl=30)
        for n in range(24)
    ]
    granted = await asyncio.gather(*attempts)
    assert sum(granted) == 3
    assert len(await fleet[0].leases.holders("job:report")) == 3


async def test_holders_are_listed_in_the_order_they_took_their_slots(
    driver: PostgresJobDriver,
) -> None:
    for holder in ("c", "a", "b"):
        assert await driver.leases.acquire("k", holder, limit=5, ttl=30)
    assert await driver.leases.acquire("k", "c", limit=5, ttl=30)
    assert await driver.leases.holders("k") == ["c", "a", "b"]


@pytest.fixture
async def repeatable_read_url(pg_url: str) -> str:
    """The test's database, its transactions REPEATABLE READ unless told otherwise."""
    name = conninfo_to_dict(pg_url)["dbname"]
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "alter database {} set default_transaction_isolation = 'repeatable read'"
            ).format(sql.Identifier(name))
        )
    return pg_url


@pytest.mark.parametrize("target", ["url", "pool"])
async def test_racing_acquirers_never_exceed_the_limit_whatever_the_default_isolation(
    repeatable_read_url: str, clock: FrozenClock, target: str
) -> None:
    """Under REPEATABLE READ, an acquirer that waited for the key's lock read the holders as
    they were when it asked for the lock: most of 24 racing acquirers got one of 3 slots. The
    driver's transactions run READ COMMITTED, over its own pool (the URL) as over one it is
    handed."""
    pools: list[AsyncConnectionPool[Any]] = []
    drivers: list[PostgresJobDriver] = []
    for _ in range(4):
        if target == "url":
            drivers.append(postgres_job_driver(repeatable_read_url, clock=clock))
            continue
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            repeatable_read_url, kwargs={"autocommit": True}, open=False
        )
        await pool.open()
        pools.append(pool)
        drivers.append(postgres_job_driver(pool, clock=clock))
    try:
        for round_ in range(3):
            key = f"job:report-{round_}"
            granted = await asyncio.gather(
                *(
                    drivers[n % 4].leases.acquire(key, f"holder-{n}", limit=3, ttl=30)
                    for n in range(24)
                )
            )
            assert sum(granted) == 3
            assert len(await drivers[0].leases.holders(key)) == 3
    finally:
        for each in drivers:
            await each.close()
        for pool in pools:
            await pool.close()


async def test_a_renewal_on_its_way_at_the_expiry_is_never_counted_lapsed(
    pg_url: str,
) -> None:
    """A's renewal, sent a moment before its slot expires, waits on a third session's lock on
    the lease row; B's acquire, a moment after the expiry, reads meanwhile. Without the key's
    lock around the renewal, B counted A's slot as lapsed and took one, and both stayed."""
    a_clock, b_clock = FrozenClock(), FrozenClock()
    a = postgres_job_driver(pg_url, clock=a_clock)
    b = postgres_job_driver(pg_url, clock=b_clock)
    key, base = "job:renew-race", a_clock.now()
    try:
        assert await a.leases.acquire(key, "A", limit=1, ttl=30)
        a_clock.set(base + timedelta(seconds=29.999))
        b_clock.set(base + timedelta(seconds=30.001))
        async with (
            await psycopg.AsyncConnection.connect(pg_url) as blocker,
            blocker.transaction(),
        ):
            await blocker.execute("select 1 from x_job_leases where key = %s for update", (key,))
            renewal = asyncio.create_task(a.leases.renew(key, "A", ttl=30))
            await asyncio.sleep(0.3)  # A's renewal waits on the row
            acquire = asyncio.create_task(b.leases.acquire(key, "B", limit=1, ttl=30))
            await asyncio.sleep(0.3)  # B's acquire reads, or waits for A's turn
        renewed, acquired = await renewal, await acquire
        assert (renewed, acquired) == (True, False)
        assert await b.leases.holders(key) == ["A"]
    finally:
        await a.close()
        await b.close()
