from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from support.markers import mark_folder

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.pg import PostgresJobDriver, install, postgres_job_driver
from ultimat3.jobs.testing.services import Found, start_local_postgres


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


@pytest.fixture
def private_postgres() -> Iterator[Found]:
    """A cluster of this test's own, started from the local server binaries in a temp dir, so
    the test may restart it (``.restart()``) without touching the shared server."""
    try:
        found = start_local_postgres()
    except Exception as exc:  # every reason it could not start says what it tried
        pytest.skip(f"restarting a server needs a cluster of the test's own: {exc}")
    assert found.stop is not None
    try:
        yield found
    finally:
        found.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of this folder needs a PostgreSQL server (some start their own of it), so
    ``-m "not pg"`` leaves them all out."""
    mark_folder(items, __file__, pytest.mark.pg)
