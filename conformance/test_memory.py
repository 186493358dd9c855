"""The shipped conformance suite against the memory driver."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from ultimat3.jobs.core import FrozenClock, memory_event_bus, memory_job_driver
from ultimat3.jobs.testing import ConformanceTarget, job_driver_conformance


@asynccontextmanager
async def memory_target(
    clock: FrozenClock, request: pytest.FixtureRequest
) -> AsyncIterator[ConformanceTarget]:
    yield ConformanceTarget(driver=memory_job_driver(clock=clock), events=memory_event_bus(clock))


TestMemoryDriver = job_driver_conformance(memory_target)
