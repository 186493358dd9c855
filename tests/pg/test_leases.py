"""Fleet slots under real concurrency: acquirers racing on one key never exceed its limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

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
