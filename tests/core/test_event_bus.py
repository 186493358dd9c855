"""Which bus ``publish_event`` and ``step.wait_for_event`` use, and what ``reset_event_bus``
forgets: one resolution for both sides, so a wait reads the bus an answer went to."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from support.buses import ForwardingBus
from support.jobs import declared

from ultimat3.jobs.core import (
    ClaimedJob,
    FrozenClock,
    JobState,
    Step,
    event_bus,
    execute_job,
    memory_event_bus,
    publish_event,
    reset_event_bus,
    set_event_bus,
)
from ultimat3.jobs.core.events import MemoryEventBus
from ultimat3.jobs.core.memory import MemoryJobDriver


@dataclass
class Order:
    order_id: str


async def _paid(*, input: Order, step: Step) -> Any:
    return await step.wait_for_event("paid", "order.paid", match={"order": input.order_id})


await_paid = declared(_paid, input=Order, key=lambda o: f"order:{o.order_id}", event_poll="1m")


@pytest.fixture(autouse=True)
def _forget_the_installed_bus() -> Iterator[None]:
    yield
    set_event_bus(None)


async def _claim(driver: MemoryJobDriver) -> ClaimedJob:
    batch = await driver.claim(worker_id="w1", slots={"default": 1}, visibility_timeout=30)
    (claimed,) = batch.jobs
    return claimed


async def _state(driver: MemoryJobDriver, job_id: str) -> JobState:
    detail = await driver.introspect.get(job_id)
    assert detail is not None
    return detail.row.state


async def test_a_wait_reads_the_bus_set_event_bus_installed_as_publish_event_does(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """The driver offers a bus of its own; the installed one still wins on both sides."""
    installed = memory_event_bus(clock)
    set_event_bus(installed)
    queued = await await_paid.enqueue(Order("o-1"))
    first = await execute_job(await _claim(driver), driver=driver, handle=await_paid)
    assert first.outcome == "suspended"

    await publish_event("order.paid", {"order": "o-1", "cents": 500})
    assert await installed.lookup("order.paid", since=clock.now() - timedelta(hours=1))
    clock.advance(60)
    second = await execute_job(await _claim(driver), driver=driver, handle=await_paid)
    assert (second.outcome, second.result) == ("completed", {"order": "o-1", "cents": 500})
    assert await _state(driver, queued.id) is JobState.DONE


async def test_a_bus_passed_to_the_run_wins_over_the_installed_one(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    installed, passed = memory_event_bus(clock), memory_event_bus(clock)
    set_event_bus(installed)
    await await_paid.enqueue(Order("o-2"))
    await installed.publish("order.paid", {"order": "o-2", "source": "installed"})
    await passed.publish("order.paid", {"order": "o-2", "source": "passed"})
    execution = await execute_job(
        await _claim(driver), driver=driver, handle=await_paid, events=passed
    )
    assert execution.result == {"order": "o-2", "source": "passed"}


async def test_with_nothing_installed_both_sides_use_the_drivers_bus(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    assert event_bus() is driver.events
    await await_paid.enqueue(Order("o-3"))
    await publish_event("order.paid", {"order": "o-3"})
    execution = await execute_job(await _claim(driver), driver=driver, handle=await_paid)
    assert (execution.outcome, execution.result) == ("completed", {"order": "o-3"})


async def test_reset_forgets_the_installed_memory_drivers_events(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """One test's answer must not resume the next test's wait on a driver both share."""
    since = clock.now() - timedelta(seconds=1)
    await publish_event("order.paid", {"order": "o-4"})
    assert await driver.events.lookup("order.paid", since=since) is not None
    reset_event_bus()
    assert await driver.events.lookup("order.paid", since=since) is None
    assert await event_bus().lookup("order.paid", since=since) is None


async def test_reset_forgets_an_installed_memory_bus_and_uninstalls_it(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    since = clock.now() - timedelta(seconds=1)
    installed = memory_event_bus(clock)
    set_event_bus(installed)
    await publish_event("order.paid", {"order": "o-5"})
    reset_event_bus()
    assert await installed.lookup("order.paid", since=since) is None
    assert event_bus() is driver.events


class ServerBus(ForwardingBus):
    """A bus other processes share (a stand-in for Postgres or Redis): not this test's to wipe."""


async def test_reset_leaves_a_servers_bus_its_events(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    since = clock.now() - timedelta(seconds=1)
    server = ServerBus(MemoryEventBus(clock))
    set_event_bus(server)
    await publish_event("order.paid", {"order": "o-6"})
    reset_event_bus()
    assert event_bus() is driver.events
    assert await server.lookup("order.paid", since=since) is not None
