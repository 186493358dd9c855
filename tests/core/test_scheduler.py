"""The scheduler: one fire per occurrence, catch-up after downtime, pauses, leadership, drain."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.eventually import run_clock, settle, until

from ultimat3.jobs.core import (
    Concurrency,
    Enqueued,
    EnqueueRequest,
    FrozenClock,
    InvariantError,
    JobFilter,
    JobScheduler,
    LeaseStoreLeader,
    job,
    job_scheduler,
    job_worker,
    lease_store_leader,
    memory_job_driver,
    next_task_run,
    task,
)
from ultimat3.jobs.core import scheduler as scheduler_module
from ultimat3.jobs.core.clock import Clock
from ultimat3.jobs.core.cron import instant_of, occurrence_ms
from ultimat3.jobs.core.memory import MemoryJobDriver, MemorySchedulerState

START = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)


@dataclass
class Tick:
    at: int


@job(input=Tick, idempotency_key=lambda i: f"tick:{i.at}", tenant="none", queue="ticks")
async def on_tick(*, input: Tick) -> None:
    return None


def hourly(catch_up: str = "skip", max_catch_up: int = 10, cron: str = "0 * * * *") -> Any:
    def fire(occurrence: int) -> list[tuple[Any, Tick]]:
        return [(on_tick, Tick(occurrence))]

    return task(cron=cron, tz="UTC", enqueue=fire, catch_up=catch_up, max_catch_up=max_catch_up)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


async def fired(driver: MemoryJobDriver) -> list[datetime]:
    page = await driver.introspect.list(JobFilter(queue="ticks", limit=200))
    return sorted(instant_of(row.input["at"]) for row in page.rows)


def hour(n: int) -> datetime:
    return datetime(2026, 6, 1, n, tzinfo=UTC)


class StateSpy(MemorySchedulerState):
    """The memory state, counting every call the scheduler makes to it."""

    def __init__(self, driver: MemoryJobDriver) -> None:
        super().__init__(driver)
        self.calls: list[str] = []

    async def watermarks(self, tasks: Sequence[str]) -> dict[str, int]:
        self.calls.append("watermarks")
        return await super().watermarks(tasks)

    async def arm(self, task: str, occurrence_ms: int) -> None:
        self.calls.append("arm")
        await super().arm(task, occurrence_ms)

    async def fire(
        self,
        task: str,
        occurrence_ms: int,
        requests: Sequence[EnqueueRequest],
        *,
        previous: int | None,
    ) -> list[Enqueued] | None:
        self.calls.append("fire")
        return await super().fire(task, occurrence_ms, requests, previous=previous)


async def test_each_occurrence_fires_once(driver: MemoryJobDriver, clock: FrozenClock) -> None:
    scheduler = job_scheduler(driver=driver, tasks=[hourly()], clock=clock)
    await scheduler.run_once()
    for _ in range(3):
        await run_clock(clock, 3600)
        await scheduler.run_once()
        await scheduler.run_once()
    assert await fired(driver) == [hour(1), hour(2), hour(3)]


async def test_a_task_seen_for_the_first_time_is_armed_at_now_not_fired(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    state = StateSpy(driver)
    the_task = hourly()
    scheduler = job_scheduler(driver=driver, state=state, tasks=[the_task], clock=clock)
    assert await scheduler.run_once() == []
    assert await state.watermarks([the_task.name]) == {the_task.name: occurrence_ms(START)}
    assert await driver.introspect.task_fires() == []


async def test_an_idle_round_reads_no_store_and_resolves_no_cron(
    driver: MemoryJobDriver, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = StateSpy(driver)
    scheduler = job_scheduler(driver=driver, state=state, tasks=[hourly()], clock=clock)
    await scheduler.run_once()
    resolved: list[datetime] = []
    real = scheduler_module.next_occurrence

    def counted(cron: str, zone: Any, after: datetime) -> datetime:
        resolved.append(after)
        return real(cron, zone, after)

    monkeypatch.setattr(scheduler_module, "next_occurrence", counted)
    paused_reads: list[int] = []
    real_paused = driver.introspect.paused_tasks

    async def paused() -> list[str]:
        paused_reads.append(1)
        return await real_paused()

    monkeypatch.setattr(driver.introspect, "paused_tasks", paused)
    state.calls.clear()
    for _ in range(50):  # fifty idle seconds before 01:00
        clock.advance(1)
        await scheduler.run_once()
    assert (state.calls, resolved, paused_reads) == ([], [], [])


@pytest.mark.parametrize(
    ("catch_up", "expected_fires", "watermark"),
    [
        ("skip", [5], 5),
        ("run-once", [1], 5),
        ("run-all", [1, 2, 3, 4, 5], 5),
    ],
)
async def test_after_downtime_the_catch_up_mode_decides_what_fires(
    driver: MemoryJobDriver,
    clock: FrozenClock,
    catch_up: str,
    expected_fires: list[int],
    watermark: int,
) -> None:
    the_task = hourly(catch_up)
    state = MemorySchedulerState(driver)
    await state.arm(the_task.name, occurrence_ms(START))
    clock.set(hour(5) + timedelta(minutes=10))  # down from 00:00:30 to 05:10
    scheduler = job_scheduler(driver=driver, state=state, tasks=[the_task], clock=clock)
    await scheduler.run_once()
    await scheduler.run_once()  # and nothing more on the next round
    assert await fired(driver) == [hour(n) for n in expected_fires]
    assert await state.watermarks([the_task.name]) == {
        the_task.name: occurrence_ms(hour(watermark))
    }


async def test_run_once_fires_once_and_then_waits_for_the_next_real_occurrence(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    the_task = hourly("run-once")
    state = MemorySchedulerState(driver)
    await state.arm(the_task.name, occurrence_ms(START))
    clock.set(hour(23) + timedelta(minutes=10))
    scheduler = job_scheduler(driver=driver, state=state, tasks=[the_task], clock=clock)
    for _ in range(30):
        await scheduler.run_once()
        clock.advance(1)
    assert await fired(driver) == [hour(1)]
    await run_clock(clock, 3600)
    await scheduler.run_once()
    assert await fired(driver) == [hour(1), datetime(2026, 6, 2, 0, tzinfo=UTC)]


async def test_run_all_walks_at_most_max_catch_up_occurrences_a_round(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    the_task = hourly("run-all", max_catch_up=3)
    state = MemorySchedulerState(driver)
    await state.arm(the_task.name, occurrence_ms(START))
    clock.set(hour(7) + timedelta(minutes=10))
    scheduler = job_scheduler(driver=driver, state=state, tasks=[the_task], clock=clock)
    rounds = [len(await scheduler.run_once()) for _ in range(4)]
    assert rounds == [3, 3, 1, 0]
    assert await fired(driver) == [hour(n) for n in range(1, 8)]


async def test_skip_after_a_year_down_fires_the_true_latest_occurrence(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    daily = hourly("skip", cron="15 3 * * *")
    state = MemorySchedulerState(driver)
    await state.arm(daily.name, occurrence_ms(START))
    clock.set(datetime(2027, 5, 20, 9, tzinfo=UTC))
    scheduler = job_scheduler(driver=driver, state=state, tasks=[daily], clock=clock)
    await scheduler.run_once()
    assert await fired(driver) == [datetime(2027, 5, 20, 3, 15, tzinfo=UTC)]


async def test_a_paused_task_is_not_dispatched_and_is_looked_at_again_after_five_seconds(
    driver: MemoryJobDriver, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    the_task = hourly()
    scheduler = job_scheduler(driver=driver, tasks=[the_task], clock=clock)
    await scheduler.run_once()
    await driver.introspect.pause_task(the_task.name)
    reads: list[datetime] = []
    real_paused = driver.introspect.paused_tasks

    async def paused() -> list[str]:
        reads.append(clock.now())
        return await real_paused()

    monkeypatch.setattr(driver.introspect, "paused_tasks", paused)
    clock.set(hour(1))
    for _ in range(12):
        await scheduler.run_once()
        clock.advance(1)
    assert await fired(driver) == []
    assert [(at - hour(1)).total_seconds() for at in reads] == [0, 5, 10]
    await driver.introspect.resume_task(the_task.name)
    clock.set(hour(3) + timedelta(minutes=1))
    await scheduler.run_once()
    assert await fired(driver) == [hour(3)]  # its catch-up (skip) decides what it missed


async def test_two_leaders_over_one_state_fire_each_occurrence_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    the_task = hourly()
    state = MemorySchedulerState(driver)
    schedulers = [
        job_scheduler(driver=driver, state=state, tasks=[the_task], clock=clock) for _ in range(2)
    ]
    for scheduler in schedulers:
        await scheduler.run_once()
    for _ in range(3):
        await run_clock(clock, 3600)
        results = await asyncio.gather(*(s.run_once() for s in schedulers))
        assert sum(len(fires) for fires in results) == 1
    assert await fired(driver) == [hour(1), hour(2), hour(3)]


class CountingLeader:
    def __init__(self, answers: list[bool]) -> None:
        self.answers = answers
        self.asked: list[datetime] = []
        self.released = 0
        self.clock: Clock | None = None

    async def acquire(self) -> bool:
        assert self.clock is not None
        self.asked.append(self.clock.now())
        return self.answers[min(len(self.asked), len(self.answers)) - 1]

    async def release(self) -> None:
        self.released += 1


async def test_a_standby_asks_for_the_lease_every_renew_interval_not_every_round(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    leader = CountingLeader([False])
    leader.clock = clock
    scheduler = job_scheduler(driver=driver, leader=leader, tasks=[hourly()], clock=clock)
    for _ in range(30):
        await scheduler.run_once()
        clock.advance(1)
    assert [(at - START).total_seconds() for at in leader.asked] == [0, 10, 20]
    assert not scheduler.leading


async def test_a_leader_renews_every_third_of_its_ttl_so_a_late_standby_never_leads_beside_it(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """A 6 s lease renewed every 10 s sat empty 4 s of every 10: a standby started 7 s later
    took it at 7 s while the leader still believed it led until 10 s — two leaders."""
    the_task = hourly()
    state = MemorySchedulerState(driver)

    def node(holder: str) -> JobScheduler:
        leader = lease_store_leader(driver.leases, ttl=6, holder=holder)
        return job_scheduler(
            driver=driver, leader=leader, state=state, tasks=[the_task], clock=clock
        )

    first, second = node("first"), node("second")
    for elapsed in range(60):
        await first.run_once()
        if elapsed >= 7:
            await second.run_once()
        assert await driver.leases.holders("leader:scheduler") == ["first"], elapsed
        assert (first.leading, second.leading) == (True, False), elapsed
        clock.advance(1)


async def test_a_standby_asks_for_a_lease_every_third_of_its_ttl(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    holder = lease_store_leader(driver.leases, ttl=6, holder="holder")
    assert holder.ttl == 6
    assert await holder.acquire()
    asked: list[float] = []

    class Recording(LeaseStoreLeader):
        async def acquire(self) -> bool:
            asked.append((clock.now() - START).total_seconds())
            return await super().acquire()

    standby = Recording(driver.leases, name="scheduler", ttl=6, holder="standby")
    scheduler = job_scheduler(driver=driver, leader=standby, tasks=[hourly()], clock=clock)
    for _ in range(7):
        await scheduler.run_once()
        clock.advance(1)
    assert asked == [0, 2, 4, 6]
    assert scheduler.leading  # the holder went silent at 0: its 6 s lease lapsed at 6


async def test_a_tick_longer_than_the_renewal_interval_still_renews_in_time(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """Renewals ride on rounds: a 60 s tick over a 6 s lease would renew it a minute late."""
    leader = lease_store_leader(driver.leases, ttl=6, holder="first")
    scheduler = job_scheduler(
        driver=driver, leader=leader, tasks=[hourly()], clock=clock, tick_interval=60
    )
    await scheduler.start()
    try:
        for elapsed in range(30):
            await run_clock(clock, 1)
            assert await driver.leases.holders("leader:scheduler") == ["first"], elapsed
    finally:
        await scheduler.stop()


def test_a_renew_interval_not_shorter_than_the_leaders_ttl_is_refused(
    driver: MemoryJobDriver,
) -> None:
    leader = lease_store_leader(driver.leases, ttl=6)
    for interval in (6, "6s", timedelta(seconds=30)):
        with pytest.raises(InvariantError) as refused:
            job_scheduler(driver=driver, leader=leader, tasks=[], leader_renew_interval=interval)
        assert refused.value.code == "X_INVARIANT"
        assert refused.value.meta["field"] == "leader_renew_interval"
    job_scheduler(driver=driver, leader=leader, tasks=[], leader_renew_interval=5.9)


async def test_an_explicit_renew_interval_is_kept(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    leader = CountingLeader([False])
    leader.clock = clock
    scheduler = job_scheduler(
        driver=driver, leader=leader, tasks=[hourly()], clock=clock, leader_renew_interval="4s"
    )
    for _ in range(10):
        await scheduler.run_once()
        clock.advance(1)
    assert [(at - START).total_seconds() for at in leader.asked] == [0, 4, 8]


async def test_a_demoted_leader_stops_dispatching_and_a_promoted_one_reads_the_watermarks(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    the_task = hourly()
    state = StateSpy(driver)
    leader = CountingLeader([True, False, True])
    leader.clock = clock
    scheduler = job_scheduler(
        driver=driver, leader=leader, state=state, tasks=[the_task], clock=clock
    )
    await scheduler.run_once()
    assert scheduler.leading
    clock.set(START + timedelta(seconds=10))
    await scheduler.run_once()
    assert not scheduler.leading
    # Meanwhile the node that leads now fired 01:00.
    await state.arm(the_task.name, occurrence_ms(hour(1)))
    clock.set(hour(1) + timedelta(minutes=30))
    state.calls.clear()
    await scheduler.run_once()
    assert scheduler.leading
    assert state.calls[0] == "watermarks"
    assert await fired(driver) == []  # 01:00 is behind the watermark it read


async def test_each_fire_is_recorded_for_task_fires(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    the_task = hourly()
    scheduler = job_scheduler(driver=driver, tasks=[the_task], clock=clock)
    await scheduler.run_once()
    clock.set(hour(1) + timedelta(seconds=2))
    await scheduler.run_once()
    (fire,) = await driver.introspect.task_fires()
    assert (fire.task, fire.occurrence_ms, fire.fired_at) == (
        the_task.name,
        occurrence_ms(hour(1)),
        clock.now(),
    )


async def test_a_state_that_records_its_own_fires_is_not_recorded_twice(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    class Durable(MemorySchedulerState):
        records_fires = True

    scheduler = job_scheduler(driver=driver, state=Durable(driver), tasks=[hourly()], clock=clock)
    await scheduler.run_once()
    clock.set(hour(1))
    await scheduler.run_once()
    assert await driver.introspect.task_fires() == []


async def test_the_leader_rolls_the_counters_up_once_a_minute(
    driver: MemoryJobDriver, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    rollups: list[datetime] = []

    async def rollup() -> None:
        rollups.append(clock.now())

    monkeypatch.setattr(driver.introspect, "rollup_counters", rollup)
    scheduler = job_scheduler(driver=driver, tasks=[hourly()], clock=clock)
    for _ in range(150):
        await scheduler.run_once()
        clock.advance(1)
    assert [(at - START).total_seconds() for at in rollups] == [0, 60, 120]


def test_next_task_run_is_the_schedulers_own_resolver() -> None:
    daily = hourly(cron="30 2 * * *")
    assert next_task_run(daily, datetime(2026, 3, 8, tzinfo=UTC)) == datetime(
        2026, 3, 8, 2, 30, tzinfo=UTC
    )


async def test_the_defaults_warn_and_name_the_durable_state_and_leader(
    driver: MemoryJobDriver, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
        job_scheduler(driver=driver, tasks=[])
    text = " ".join(record.getMessage() for record in caplog.records)
    assert "postgres_scheduler_state" in text
    assert "postgres_lease_leader" in text


async def test_a_fire_wakes_a_worker_of_this_process_at_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    ran: list[int] = []

    @job(input=Tick, idempotency_key=lambda i: f"woken:{i.at}", tenant="none", queue="woken")
    async def woken(*, input: Tick) -> None:
        ran.append(input.at)

    def fire(occurrence: int) -> list[tuple[Any, Tick]]:
        return [(woken, Tick(occurrence))]

    the_task = task(cron="0 * * * *", tz="UTC", enqueue=fire)
    scheduler = job_scheduler(driver=driver, tasks=[the_task], clock=clock)
    async with job_worker(
        driver=driver, context=lambda: None, jobs=[woken], idle_poll_max=3600, clock=clock
    ):
        await scheduler.run_once()
        await settle()
        clock.set(hour(1))
        await scheduler.run_once()
        await until(lambda: ran == [occurrence_ms(hour(1))])


async def test_an_occurrence_whose_entries_raise_is_logged_and_passed_over(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(occurrence: int) -> list[tuple[Any, Tick]]:
        raise ValueError("no entries today")

    the_task = task(cron="0 * * * *", tz="UTC", enqueue=broken)
    scheduler = job_scheduler(driver=driver, tasks=[the_task], clock=clock)
    await scheduler.run_once()
    clock.set(hour(1))
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        assert await scheduler.run_once() == []
        assert await scheduler.run_once() == []
    invalid = [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.scheduler.task-invalid"
    ]
    assert len(invalid) == 1


class ArmFails(MemorySchedulerState):
    """The memory state, whose arm fails for one task once ``failing`` names it."""

    failing: str | None = None

    async def arm(self, task: str, occurrence_ms: int) -> None:
        if task == self.failing:
            raise ConnectionError("the state went away")
        await super().arm(task, occurrence_ms)


async def test_a_task_whose_dispatch_fails_holds_back_none_of_the_tasks_after_it(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(occurrence: int) -> list[tuple[Any, Tick]]:
        raise ValueError("no entries today")

    first = task(cron="0 * * * *", tz="UTC", enqueue=broken, name="scheduler-arm-fails")
    state = ArmFails(driver)
    scheduler = job_scheduler(
        driver=driver, tasks=[first, hourly()], clock=clock, state=state, leader=None
    )
    await scheduler.run_once()
    state.failing = "scheduler-arm-fails"  # passing its occurrence over fails now, in the round
    clock.set(hour(1))
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        assert [fire.occurrence_ms for fire in await scheduler.run_once()] == [
            occurrence_ms(hour(1))
        ]
    failed = [r for r in caplog.records if getattr(r, "event", "") == "jobs.scheduler.tick-failed"]
    assert [getattr(r, "jobs", {}).get("task") for r in failed] == ["scheduler-arm-fails"]
    assert await fired(driver) == [hour(1)]


async def test_a_fire_asks_each_jobs_concurrency_key_as_an_enqueue_does(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    @job(
        input=Tick,
        idempotency_key=lambda i: f"keyed:{i.at}",
        tenant="none",
        queue="ticks",
        concurrency=Concurrency(key=lambda i: "" if i.at else "ok", limit=1),
    )
    async def keyed(*, input: Tick) -> None:
        return None

    def fire(occurrence: int) -> list[tuple[Any, Tick]]:
        return [(keyed, Tick(occurrence))]

    the_task = task(cron="0 * * * *", tz="UTC", enqueue=fire)
    scheduler = job_scheduler(driver=driver, tasks=[the_task], clock=clock)
    await scheduler.run_once()
    clock.set(hour(1))
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        await scheduler.run_once()
    (invalid,) = [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.scheduler.task-invalid"
    ]
    assert "X_JOB_DECLARATION_INVALID" in invalid.getMessage()
    assert await fired(driver) == []


async def test_stopping_finishes_the_round_in_flight_and_hands_the_lease_back(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    leader = CountingLeader([True])
    leader.clock = clock
    scheduler = job_scheduler(driver=driver, leader=leader, tasks=[hourly()], clock=clock)
    await scheduler.start()
    await settle()
    await scheduler.stop()
    assert leader.released == 1


async def test_a_round_still_enqueueing_at_the_deadline_keeps_the_lease(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    leader = CountingLeader([True])
    leader.clock = clock
    stuck = asyncio.Event()
    original = driver.enqueue_many

    async def hanging_enqueue(requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        await stuck.wait()
        return await original(requests)

    driver.enqueue_many = hanging_enqueue  # type: ignore[method-assign]
    scheduler = job_scheduler(driver=driver, leader=leader, tasks=[hourly()], clock=clock)
    await scheduler.start()
    await settle()
    clock.set(hour(1) - timedelta(seconds=1))
    await run_clock(clock, 1)  # the next tick fires 01:00, which hangs in the enqueue
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        stopping = asyncio.ensure_future(scheduler.stop(clock.now() + timedelta(seconds=5)))
        await run_clock(clock, 5)
        await until(stopping.done)
    assert leader.released == 0
    assert [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.scheduler.drain-abandoned"
    ]
    stuck.set()


# -- catch-up, as a property --------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["skip", "run-once", "run-all"]),
    st.sampled_from(["*/5 * * * *", "0 * * * *", "30 */3 * * *", "0 9 * * *"]),
    st.integers(1, 5),
    st.integers(0, 4 * 86400),
)
async def test_one_round_after_downtime_fires_what_its_catch_up_mode_promises(
    catch_up: str, cron: str, max_catch_up: int, downtime: int
) -> None:
    clock = FrozenClock(START)
    driver = memory_job_driver(clock=clock)

    def fire(occurrence: int) -> list[tuple[Any, Tick]]:
        return [(on_tick, Tick(occurrence))]

    the_task = task(
        cron=cron,
        tz="UTC",
        enqueue=fire,
        catch_up=catch_up,  # type: ignore[arg-type]
        max_catch_up=max_catch_up,
    )
    missed: list[datetime] = []
    at, now = START, START + timedelta(seconds=downtime)
    while (at := next_task_run(the_task, at)) <= now:
        missed.append(at)
    state = MemorySchedulerState(driver)
    await state.arm(the_task.name, occurrence_ms(START))
    clock.set(now)
    scheduler = job_scheduler(driver=driver, state=state, tasks=[the_task], clock=clock)
    fires = [instant_of(f.occurrence_ms) for f in await scheduler.run_once()]
    marks = await state.watermarks([the_task.name])
    if not missed:
        expected, mark = [], START
    elif catch_up == "skip":
        expected, mark = missed[-1:], missed[-1]
    elif catch_up == "run-once":
        expected, mark = missed[:1], missed[-1]
    else:
        expected = missed[:max_catch_up]
        mark = expected[-1]
    assert fires == expected
    assert await fired(driver) == expected
    assert marks[the_task.name] == occurrence_ms(mark)


class NodeClock:
    """A node's wall clock, which an operator (or NTP) may step back."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at

    async def sleep(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


async def test_a_clock_set_back_does_not_stop_the_leader_renewing(
    driver: MemoryJobDriver,
) -> None:
    """Renewal is what tells a leader it was demoted: a node whose clock went back half an hour
    must not wait half an hour of its new clock before asking again."""
    clock = NodeClock(START)
    leader = CountingLeader([True])
    leader.clock = clock
    scheduler = job_scheduler(driver=driver, leader=leader, tasks=[hourly()], clock=clock)
    await scheduler.run_once()
    clock.at = START - timedelta(minutes=30)
    await scheduler.run_once()
    clock.at += timedelta(seconds=10)
    await scheduler.run_once()
    assert [(at - START).total_seconds() for at in leader.asked] == [0, -1800, -1790]


@pytest.mark.parametrize("ttl", [True, 0, -1, "never"], ids=repr)
def test_a_leaders_ttl_that_is_not_a_positive_duration_is_refused(
    driver: MemoryJobDriver, ttl: object
) -> None:
    with pytest.raises(InvariantError):
        lease_store_leader(driver.leases, ttl=ttl)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", ["30s", timedelta(seconds=30), 30])
def test_a_leaders_ttl_is_any_duration(driver: MemoryJobDriver, ttl: object) -> None:
    assert lease_store_leader(driver.leases, ttl=ttl).ttl == 30  # type: ignore[arg-type]
