"""The Postgres event bus and ``step.wait_for_event`` on its one clock — the database's — with a
worker whose own clock runs an hour ahead of the database."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.buses import ForwardingBus

from ultimat3.jobs.core import (
    EventBus,
    FrozenClock,
    JobContext,
    JobExecution,
    Step,
    execute_job,
    job,
)
from ultimat3.jobs.core.model import JsonValue
from ultimat3.jobs.pg import PostgresJobDriver
from ultimat3.jobs.pg.events import PostgresEventBus, postgres_event_bus

pytestmark = pytest.mark.pg

SKEW = timedelta(hours=1)
WAIT = timedelta(minutes=10)


@dataclass
class Order:
    id: str


@job(
    input=Order,
    idempotency_key=lambda i: f"await-payment:{i.id}",
    tenant="none",
    queue="payments",
    event_poll="30s",
)
async def await_payment(*, input: Order, step: Step, ctx: JobContext[list[Any]]) -> None:
    paid = await step.wait_for_event("paid", "order.paid", match={"order": input.id}, timeout=WAIT)
    ctx.services.append(paid)


@pytest.fixture
def clock() -> FrozenClock:
    """The worker's clock, an hour ahead of the database's."""
    return FrozenClock(datetime.now(UTC) + SKEW)


@pytest.fixture
def bus(driver: PostgresJobDriver) -> PostgresEventBus:
    return postgres_event_bus(executor=driver.executor)


class PublishedWhileAskingTheTime(ForwardingBus):
    """The Postgres bus, with the awaited event landing the moment the step asks the time — after
    its first look found nothing — and the time answered as if the database's clock had then
    passed the wait's deadline: the event came in time, and only a second look finds it."""

    def __init__(self, bus: EventBus, payload: JsonValue) -> None:
        super().__init__(bus)
        self._payload = payload

    async def now(self) -> datetime:
        await self.inner.publish("order.paid", self._payload)
        return await self.inner.now() + WAIT


async def attempt(
    driver: PostgresJobDriver, bus: EventBus, clock: FrozenClock, seen: list[Any]
) -> JobExecution:
    """Claim the order's job and run one attempt of it on the worker's clock."""
    batch = await driver.claim(worker_id="w1", slots={"payments": 1}, visibility_timeout=60)
    (claimed,) = batch.jobs
    return await execute_job(
        claimed, driver=driver, handle=await_payment, services=seen, events=bus, clock=clock
    )


async def begin_wait(
    driver: PostgresJobDriver, bus: EventBus, clock: FrozenClock, seen: list[Any]
) -> JobExecution:
    """Queue the order's job and run its first attempt: it starts waiting and suspends."""
    await driver.enqueue(await_payment.request(Order("o-1"), clock=clock))
    first = await attempt(driver, bus, clock, seen)
    assert first.outcome == "suspended"
    assert first.resume_at is not None
    clock.set(first.resume_at)
    return first


async def let_the_wait_run_out(driver: PostgresJobDriver, first: JobExecution) -> None:
    """Move the stored wait back by its whole timeout: as if the database's clock had moved on."""
    rows = await driver.executor.fetch(
        "select output from x_job_steps where run_id = %(run_id)s and name = 'paid'",
        {"run_id": first.run_id},
    )
    waiting = rows[0][0]
    for field in ("since", "deadline"):
        waiting[field] = (datetime.fromisoformat(waiting[field]) - WAIT).isoformat()
    await driver.executor.fetch(
        "update x_job_steps set output = %(output)s::json "
        "where run_id = %(run_id)s and name = 'paid'",
        {"output": json.dumps(waiting), "run_id": first.run_id},
    )


async def test_a_wait_begun_ahead_of_the_database_matches_an_event_published_after_it(
    driver: PostgresJobDriver, bus: PostgresEventBus, clock: FrozenClock
) -> None:
    seen: list[Any] = []
    await begin_wait(driver, bus, clock, seen)
    await bus.publish("order.paid", {"order": "o-1", "amount": 10})
    assert (await attempt(driver, bus, clock, seen)).outcome == "completed"
    assert seen == [{"order": "o-1", "amount": 10}]


async def test_a_worker_ahead_of_the_database_does_not_time_out_early(
    driver: PostgresJobDriver, bus: PostgresEventBus, clock: FrozenClock
) -> None:
    seen: list[Any] = []
    await begin_wait(driver, bus, clock, seen)
    clock.advance(WAIT)  # past the deadline by the worker's clock — not by the database's
    assert (await attempt(driver, bus, clock, seen)).outcome == "suspended"
    assert seen == []


async def test_the_wait_times_out_once_the_databases_clock_passes_its_deadline(
    driver: PostgresJobDriver, bus: PostgresEventBus, clock: FrozenClock
) -> None:
    seen: list[Any] = []
    first = await begin_wait(driver, bus, clock, seen)
    await let_the_wait_run_out(driver, first)
    assert (await attempt(driver, bus, clock, seen)).outcome == "completed"
    assert seen == [None]


async def test_the_wait_asks_again_before_declaring_a_timeout(
    driver: PostgresJobDriver, bus: PostgresEventBus, clock: FrozenClock
) -> None:
    seen: list[Any] = []
    await begin_wait(driver, bus, clock, seen)
    landing = PublishedWhileAskingTheTime(bus, {"order": "o-1", "amount": 10})
    assert (await attempt(driver, landing, clock, seen)).outcome == "completed"
    assert seen == [{"order": "o-1", "amount": 10}]


async def test_purge_expired_answers_the_rows_it_removed(bus: PostgresEventBus) -> None:
    since = await bus.now()
    for n in range(3):
        await bus.publish("order.paid", {"order": f"o-{n}"}, ttl=0)
    kept = await bus.publish("order.paid", {"order": "o-9"})
    assert await bus.purge_expired() == 3
    assert await bus.purge_expired() == 0
    assert await bus.lookup("order.paid", since=since) == kept
