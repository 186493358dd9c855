"""The shipped conformance suite against the memory driver and the memory stores."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from ultimat3.jobs.core import (
    FrozenClock,
    lease_store_leader,
    memory_event_bus,
    memory_job_driver,
    memory_outbox_store,
    memory_scheduler_state,
)
from ultimat3.jobs.testing import ConformanceTarget, job_driver_conformance


@asynccontextmanager
async def memory_target(
    clock: FrozenClock, request: pytest.FixtureRequest
) -> AsyncIterator[ConformanceTarget]:
    driver = memory_job_driver(clock=clock)
    yield ConformanceTarget(
        driver=driver,
        outbox=memory_outbox_store(clock=clock),
        events=memory_event_bus(clock),
        scheduler_state=memory_scheduler_state(driver),
        leader=lambda: lease_store_leader(driver.leases, ttl=30.0),
        leader_ttl=30.0,
    )


TestMemoryDriver = job_driver_conformance(memory_target)
