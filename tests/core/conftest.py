from __future__ import annotations

from collections.abc import Iterator

import pytest

from ultimat3.jobs.core import (
    FrozenClock,
    memory_job_driver,
    reset_event_bus,
    reset_job_driver,
    set_job_driver,
)
from ultimat3.jobs.core.memory import MemoryJobDriver


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def driver(clock: FrozenClock) -> Iterator[MemoryJobDriver]:
    """A memory driver on a frozen clock, installed for the test and forgotten after it."""
    installed = memory_job_driver(clock=clock)
    set_job_driver(installed)
    reset_event_bus()
    yield installed
    reset_event_bus()
    reset_job_driver()


@pytest.fixture
def quick_ack_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Acks sent again at once, not after a pause of real time."""
    monkeypatch.setattr("ultimat3.jobs.core.execute.ACK_RETRY_FIRST_S", 0.0)
