"""The shipped conformance suite against the Redis driver, with the outbox staged in Postgres
(the pairing a deployment on Redis uses: the outbox must join the application's transaction)."""

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from support.outbox import StagingInItsOwnTransaction

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.pg import SQL_JOBS_TABLE, pg_executor, truncate_tables
from ultimat3.jobs.redis import redis_job_driver, redis_lease_leader, redis_scheduler_state
from ultimat3.jobs.testing import ConformanceTarget, job_driver_conformance
from ultimat3.jobs.testing.services import scratch_database

pytestmark = pytest.mark.redis  # its servers are asked for inside the fixtures


@pytest.fixture(scope="module")
def outbox_database(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """One database holding the outbox table for the whole suite, emptied per test; None
    without a Postgres server (then only the outbox section skips)."""
    try:
        postgres_url: str = request.getfixturevalue("postgres_url")
    except pytest.skip.Exception:
        yield None
        return
    with scratch_database(postgres_url, setup=SQL_JOBS_TABLE) as url:
        yield url


@asynccontextmanager
async def redis_target(
    clock: FrozenClock, request: pytest.FixtureRequest
) -> AsyncIterator[ConformanceTarget]:
    driver = redis_job_driver(
        url=request.getfixturevalue("redis_url"),
        prefix=request.getfixturevalue("redis_prefix"),
        clock=clock,
    )
    database = request.getfixturevalue("outbox_database")
    postgres = pg_executor(database) if database is not None else None
    outbox = StagingInItsOwnTransaction(postgres, clock) if postgres else None

    async def reset() -> None:
        await driver.clear()
        if postgres is not None:
            await truncate_tables(postgres)

    await reset()
    try:
        yield ConformanceTarget(
            driver=driver,
            outbox=outbox,
            scheduler_state=redis_scheduler_state(driver),
            leader=lambda: redis_lease_leader(driver, ttl=30.0),
            leader_ttl=30.0,
            reset=reset,
        )
    finally:
        await driver.clear()
        await driver.close()
        if postgres is not None:
            await postgres.close()


TestRedisDriver = job_driver_conformance(redis_target)
