"""run_jobs: queued work driven to quiescence under a frozen clock, every attempt answered."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from ultimat3.jobs.core import (
    AnyJobHandle,
    FrozenClock,
    InvariantError,
    JobState,
    Retry,
    Settled,
    Step,
    job,
    memory_event_bus,
    memory_job_driver,
    publish_event,
    set_event_bus,
)
from ultimat3.jobs.core.events import MemoryEventBus
from ultimat3.jobs.core.memory import MemoryJobDriver
from ultimat3.jobs.testing import RunawayJobsError, run_jobs


@dataclass
class Order:
    order_id: str


@dataclass
class Services:
    failures_left: int = 0
    calls: list[str] = field(default_factory=list)
    settled: list[Settled[Any]] = field(default_factory=list)
    bus: MemoryEventBus | None = None


def _key(order: Order) -> str:
    return f"order:{order.order_id}"


@job(input=Order, idempotency_key=_key, tenant="none", name="run-jobs-ship")
async def ship(*, input: Order, ctx: Any) -> str:
    ctx.services.calls.append(f"ship {input.order_id}")
    return f"shipped {input.order_id}"


@job(
    input=Order,
    idempotency_key=_key,
    tenant="none",
    name="run-jobs-flaky",
    retry=Retry(attempts=3, backoff="fixed", delay="1m", jitter=False),
)
async def flaky(*, input: Order, ctx: Any) -> None:
    if ctx.services.failures_left > 0:
        ctx.services.failures_left -= 1
        raise RuntimeError("the carrier is down")


@job(
    input=Order,
    idempotency_key=_key,
    tenant="none",
    name="run-jobs-doomed",
    retry=Retry(attempts=2, backoff="fixed", delay="10s", jitter=False),
)
async def doomed(*, input: Order) -> None:
    raise RuntimeError("never works")


@job(input=Order, idempotency_key=_key, tenant="none", name="run-jobs-nudge")
async def nudge(*, input: Order, step: Step, ctx: Any) -> None:
    await step.run("welcome", lambda: ctx.services.calls.append("welcome"))
    await step.sleep("3d")
    await step.run("nudge", lambda: ctx.services.calls.append("nudge"))


@job(
    input=Order, idempotency_key=_key, tenant="none", name="run-jobs-await-payment", event_poll="1m"
)
async def await_payment(*, input: Order, step: Step) -> Any:
    return await step.wait_for_event("paid", "payment.settled", match={"order": input.order_id})


@job(input=Order, idempotency_key=_key, tenant="none", name="run-jobs-pay")
async def pay(*, input: Order, ctx: Any) -> None:
    await ctx.services.bus.publish("payment.settled", {"order": input.order_id, "cents": 500})


@job(input=Order, idempotency_key=_key, tenant="none", name="run-jobs-pay-installed")
async def pay_installed(*, input: Order) -> None:
    await publish_event("payment.settled", {"order": input.order_id, "cents": 700})


@job(
    input=Order,
    idempotency_key=_key,
    tenant="none",
    name="run-jobs-patient",
    event_poll="10m",
)
async def patient(*, input: Order, step: Step) -> Any:
    return await step.wait_for_event("reply", "never.sent", timeout="1h")


@job(input=Order, idempotency_key=_key, tenant="none", name="run-jobs-forever")
async def forever(*, input: Order, step: Step) -> Any:
    return await step.wait_for_event("reply", "never.sent")


@job(
    input=Order,
    idempotency_key=_key,
    tenant="none",
    name="run-jobs-hangs",
    timeout="30s",
    retry=Retry(attempts=1),
)
async def hangs(*, input: Order) -> None:
    await asyncio.Event().wait()


@job(
    input=Order,
    idempotency_key=_key,
    tenant="none",
    name="run-jobs-slow-thread",
    timeout="1h",
    retry=Retry(attempts=1),
)
async def slow_thread(*, input: Order, step: Step) -> str:
    return str(await step.run("label", lambda: _slowly(f"label {input.order_id}")))


def _slowly(value: str) -> str:
    time.sleep(0.2)
    return value


@job(
    input=Order,
    idempotency_key=_key,
    tenant="none",
    name="run-jobs-slow-io",
    timeout="1h",
    retry=Retry(attempts=1),
)
async def slow_io(*, input: Order) -> str:
    await asyncio.sleep(0.2)  # a real round trip, slower than a frozen clock's tick
    return f"fetched {input.order_id}"


told: list[Settled[Any]] = []
"""What ``crashes``' ``on_settled`` was told, in order."""


@job(
    input=Order,
    idempotency_key=_key,
    tenant="none",
    name="run-jobs-crashes",
    retry=Retry(attempts=1),
    on_settled=told.append,
)
async def crashes(*, input: Order) -> None:
    return None


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def driver(clock: FrozenClock) -> MemoryJobDriver:
    return memory_job_driver(clock=clock)


@pytest.fixture
def services(clock: FrozenClock) -> Services:
    told.clear()
    return Services(bus=memory_event_bus(clock))


async def _enqueue(
    driver: MemoryJobDriver, handle: AnyJobHandle, order_id: str, **options: Any
) -> str:
    queued = await driver.enqueue(handle.request(Order(order_id), clock=driver.clock, **options))
    return queued.id


async def test_a_queued_job_runs_to_completion(driver: MemoryJobDriver, services: Services) -> None:
    await _enqueue(driver, ship, "o-1")
    (execution,) = await run_jobs(driver, services=services)
    assert (execution.name, execution.outcome, execution.result) == (
        "run-jobs-ship",
        "completed",
        "shipped o-1",
    )
    assert services.calls == ["ship o-1"]


async def test_nothing_queued_runs_nothing(driver: MemoryJobDriver) -> None:
    assert await run_jobs(driver) == []


async def test_every_attempt_is_answered_in_order(
    driver: MemoryJobDriver, services: Services
) -> None:
    services.failures_left = 2
    await _enqueue(driver, flaky, "o-1")
    executions = await run_jobs(driver, services=services)
    assert [(e.attempt, e.outcome) for e in executions] == [
        (1, "retried"),
        (2, "retried"),
        (3, "completed"),
    ]


async def test_a_backoff_moves_the_clock_instead_of_waiting(
    driver: MemoryJobDriver, clock: FrozenClock, services: Services
) -> None:
    services.failures_left = 2
    start = clock.now()
    await _enqueue(driver, flaky, "o-1")
    await run_jobs(driver, services=services)
    assert clock.now() == start + timedelta(minutes=2)


async def test_a_step_sleep_moves_the_clock_and_replays(
    driver: MemoryJobDriver, clock: FrozenClock, services: Services
) -> None:
    start = clock.now()
    await _enqueue(driver, nudge, "o-1")
    executions = await run_jobs(driver, services=services)
    assert [e.outcome for e in executions] == ["suspended", "completed"]
    assert services.calls == ["welcome", "nudge"]
    assert clock.now() == start + timedelta(days=3)


async def test_a_delayed_job_runs_when_due(
    driver: MemoryJobDriver, clock: FrozenClock, services: Services
) -> None:
    start = clock.now()
    await _enqueue(driver, ship, "o-1", delay="1h")
    (execution,) = await run_jobs(driver, services=services)
    assert execution.outcome == "completed"
    assert clock.now() == start + timedelta(hours=1)


async def test_jobs_run_in_due_order(driver: MemoryJobDriver, services: Services) -> None:
    await _enqueue(driver, ship, "later", delay="2h")
    await _enqueue(driver, ship, "sooner", delay="1h")
    await _enqueue(driver, ship, "now")
    await run_jobs(driver, services=services)
    assert services.calls == ["ship now", "ship sooner", "ship later"]


async def test_an_exhausted_job_is_dead_lettered(driver: MemoryJobDriver) -> None:
    job_id = await _enqueue(driver, doomed, "o-1")
    executions = await run_jobs(driver)
    assert [e.outcome for e in executions] == ["retried", "dead-lettered"]
    detail = await driver.introspect.get(job_id)
    assert detail is not None
    assert detail.row.state is JobState.DEAD


async def test_a_wait_resumes_when_another_job_publishes(
    driver: MemoryJobDriver, services: Services
) -> None:
    await _enqueue(driver, await_payment, "o-1")
    await _enqueue(driver, pay, "o-1", delay="5m")
    executions = await run_jobs(driver, services=services, events=services.bus)
    waits = [e for e in executions if e.name == "run-jobs-await-payment"]
    assert [e.outcome for e in waits][-1] == "completed"
    assert waits[-1].result == {"order": "o-1", "cents": 500}
    assert all(e.outcome == "suspended" for e in waits[:-1])


async def test_a_wait_reads_the_installed_bus_publish_event_went_to(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """No ``events=``: the wait reads the bus ``set_event_bus`` installed, as ``publish_event``
    writes to it — not the driver's own, which nobody published on."""
    installed = memory_event_bus(clock)
    set_event_bus(installed)
    try:
        await _enqueue(driver, await_payment, "o-1")
        await _enqueue(driver, pay_installed, "o-1", delay="5m")
        executions = await run_jobs(driver, max_attempts_guard=20)
    finally:
        set_event_bus(None)
    waits = [e for e in executions if e.name == "run-jobs-await-payment"]
    assert (waits[-1].outcome, waits[-1].result) == ("completed", {"order": "o-1", "cents": 700})


async def test_a_wait_times_out_on_the_moving_clock(
    driver: MemoryJobDriver, clock: FrozenClock, services: Services
) -> None:
    start = clock.now()
    await _enqueue(driver, patient, "o-1")
    executions = await run_jobs(driver, events=services.bus)
    assert executions[-1].outcome == "completed"
    assert executions[-1].result is None
    assert clock.now() == start + timedelta(hours=1)


async def test_a_wait_nobody_answers_is_runaway(
    driver: MemoryJobDriver, services: Services
) -> None:
    await _enqueue(driver, forever, "o-1")
    with pytest.raises(RunawayJobsError) as runaway:
        await run_jobs(driver, events=services.bus, max_attempts_guard=5)
    assert len(runaway.value.executions) == 5
    assert "run-jobs-forever" in str(runaway.value)


async def test_a_runaway_hands_back_the_row_it_claimed_and_did_not_run(
    driver: MemoryJobDriver, services: Services
) -> None:
    """The guard stops run_jobs with a row claimed: the row goes back to the queue as it was,
    so a later run_jobs (once the wait is answered, say) runs it."""
    job_id = await _enqueue(driver, forever, "o-1")
    with pytest.raises(RunawayJobsError):
        await run_jobs(driver, events=services.bus, max_attempts_guard=2)
    detail = await driver.introspect.get(job_id)
    assert detail is not None
    assert (detail.row.state, detail.row.worker_id) == (JobState.READY, None)


async def test_a_hung_body_meets_its_timeout_on_the_frozen_clock(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    start = clock.now()
    await _enqueue(driver, hangs, "o-1")
    (execution,) = await run_jobs(driver, stuck_after=0.05)
    assert execution.outcome == "dead-lettered"
    assert getattr(execution.error, "code", None) == "X_JOB_TIMEOUT"
    assert clock.now() == start + timedelta(seconds=30)


async def test_a_thread_step_slower_than_stuck_after_does_not_time_out(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    start = clock.now()
    await _enqueue(driver, slow_thread, "o-1")
    (execution,) = await run_jobs(driver, stuck_after=0.05)
    assert (execution.outcome, execution.result) == ("completed", "label o-1")
    assert clock.now() == start


async def test_real_io_within_stuck_after_does_not_time_out(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    start = clock.now()
    await _enqueue(driver, slow_io, "o-1")
    (execution,) = await run_jobs(driver)
    assert (execution.outcome, execution.result) == ("completed", "fetched o-1")
    assert clock.now() == start


async def test_stuck_after_must_be_positive(driver: MemoryJobDriver) -> None:
    with pytest.raises(ValueError, match="stuck_after"):
        await run_jobs(driver, stuck_after=0)


async def test_jobs_limits_the_queues_served(driver: MemoryJobDriver, services: Services) -> None:
    await _enqueue(driver, ship, "elsewhere", queue="other")
    await _enqueue(driver, ship, "here")
    await run_jobs(driver, jobs=[ship], services=services)
    assert services.calls == ["ship here"]
    stats = {entry.queue: entry for entry in await driver.stats()}
    assert stats["other"].ready == 1


async def test_queues_names_the_queues_served(driver: MemoryJobDriver, services: Services) -> None:
    await _enqueue(driver, ship, "elsewhere", queue="other")
    await _enqueue(driver, ship, "here")
    await run_jobs(driver, queues=["other"], services=services)
    assert services.calls == ["ship elsewhere"]


async def test_a_paused_queue_is_left_alone(
    driver: MemoryJobDriver, clock: FrozenClock, services: Services
) -> None:
    start = clock.now()
    await _enqueue(driver, ship, "o-1", delay="1h")
    await driver.introspect.pause_queue("default")
    assert await run_jobs(driver, services=services) == []
    assert clock.now() == start


async def test_a_lease_lapsed_on_the_final_attempt_is_buried_and_announced(
    driver: MemoryJobDriver, clock: FrozenClock, services: Services
) -> None:
    job_id = await _enqueue(driver, crashes, "o-1")
    batch = await driver.claim(worker_id="died", slots={"default": 1}, visibility_timeout=30)
    clock.set(batch.jobs[0].lease_until)
    assert await run_jobs(driver, services=services) == []
    assert [(s.outcome, s.job_id) for s in told] == [("dead-lettered", job_id)]


async def test_a_driver_without_an_operator_surface_still_follows_backoffs(
    clock: FrozenClock, services: Services
) -> None:
    driver = _WithoutIntrospection(clock)
    services.failures_left = 1
    await driver.enqueue(flaky.request(Order("o-1"), clock=clock))
    await driver.enqueue(ship.request(Order("o-2"), clock=clock, delay="90m"))
    executions = await run_jobs(driver, services=services)
    assert [(e.name, e.outcome) for e in executions] == [
        ("run-jobs-flaky", "retried"),
        ("run-jobs-flaky", "completed"),
        ("run-jobs-ship", "completed"),
    ]


async def test_run_jobs_refuses_a_driver_on_the_system_clock() -> None:
    with pytest.raises(InvariantError, match="FrozenClock"):
        await run_jobs(memory_job_driver())


async def test_run_jobs_refuses_a_clock_the_driver_does_not_run_on(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    other = FrozenClock(clock.now() + timedelta(days=1))
    with pytest.raises(InvariantError, match="does not run on"):
        await run_jobs(driver, clock=other)


class _WithoutIntrospection(MemoryJobDriver):
    """A driver offering only the required protocol members."""

    def __init__(self, clock: FrozenClock) -> None:
        super().__init__(clock=clock)

    @property
    def introspect(self) -> None:  # type: ignore[override]
        return None
