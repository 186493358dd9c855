"""The shipped conformance suite against the Redis driver."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.redis import redis_job_driver, redis_lease_leader, redis_scheduler_state
from ultimat3.jobs.testing import ConformanceTarget, job_driver_conformance


@asynccontextmanager
async def redis_target(
    clock: FrozenClock, request: pytest.FixtureRequest
) -> AsyncIterator[ConformanceTarget]:
    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    driver = redis_job_driver(url=url, prefix=prefix, clock=clock)
    try:
        yield ConformanceTarget(
            driver=driver,
            scheduler_state=redis_scheduler_state(driver),
            leader=lambda: redis_lease_leader(driver, ttl=30.0),
            leader_ttl=30.0,
            reset=driver.clear,
        )
    finally:
        await driver.clear()
        await driver.close()


TestRedisDriver = job_driver_conformance(redis_target)
