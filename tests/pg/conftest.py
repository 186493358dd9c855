from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.pg import PostgresJobDriver, install, postgres_job_driver


@pytest.fixture
async def pg_url(pg_database_url: str) -> str:
    """A fresh database with the ultimat3-jobs tables in it."""
    await install(pg_database_url)
    return pg_database_url


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
async def driver(pg_url: str, clock: FrozenClock) -> AsyncIterator[PostgresJobDriver]:
    """A Postgres driver on a frozen clock, over its own pool."""
    built = postgres_job_driver(pg_url, clock=clock)
    yield built
    await built.close()
