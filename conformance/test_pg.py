"""The shipped conformance suite against the Postgres driver."""

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from support.outbox import StagingInItsOwnTransaction

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.pg import (
    SQL_JOBS_TABLE,
    postgres_event_bus,
    postgres_job_driver,
    postgres_lease_leader,
    postgres_scheduler_state,
    truncate_tables,
)
from ultimat3.jobs.testing import ConformanceTarget, job_driver_conformance
from ultimat3.jobs.testing.services import scratch_database

pytestmark = pytest.mark.pg  # its servers are asked for inside the fixtures


@pytest.fixture(scope="module")
def pg_conformance_url(postgres_url: str) -> Iterator[str]:
    """One database for the whole suite: each test starts from emptied tables, which is much
    cheaper than a database per test."""
    with scratch_database(postgres_url, setup=SQL_JOBS_TABLE) as url:
        yield url


@asynccontextmanager
async def postgres_target(
    clock: FrozenClock, request: pytest.FixtureRequest
) -> AsyncIterator[ConformanceTarget]:
    driver = postgres_job_driver(request.getfixturevalue("pg_conformance_url"), clock=clock)
    executor = driver.executor
    await truncate_tables(executor)
    try:
        yield ConformanceTarget(
            driver=driver,
            outbox=StagingInItsOwnTransaction(executor, clock),
            events=postgres_event_bus(executor=executor),
            scheduler_state=postgres_scheduler_state(executor, clock=clock),
            leader=lambda: postgres_lease_leader(executor=executor, ttl=30.0, clock=clock),
            leader_ttl=30.0,
            reset=lambda: truncate_tables(executor),
        )
    finally:
        await driver.close()


TestPostgresDriver = job_driver_conformance(postgres_target)
