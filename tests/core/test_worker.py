"""The worker's claim loop: slots, one claim per pass, refills, wakes, idle back-off, routing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from support.eventually import run_clock, settle, until
from support.jobs import Item, item_job
from support.naming import job_name_of

from ultimat3.jobs.core import (
    JOBS_CONCURRENCY_DEFAULT,
    ClaimQueuesEmptyError,
    EnqueueRequest,
    FrozenClock,
    InvariantError,
    JobState,
    JobWorker,
    LimitConfig,
    Retry,
    job_worker,
    new_id,
    signal_enqueued,
)
from ultimat3.jobs.core.constants import UNDECLARED_GRACE_S, UNDECLARED_RETRY_S
from ultimat3.jobs.core.durations import Duration
from ultimat3.jobs.core.memory import MemoryJobDriver
from ultimat3.jobs.core.model import ClaimedJob, WorkerInfo
from ultimat3.jobs.core.protocol import ClaimBatch, ClaimedOnRead
from ultimat3.jobs.core.wake import signal_wake_lost


class ClaimSpy:
    """The memory driver, with every claim call recorded (when, and for which slots)."""

    def __init__(self, driver: MemoryJobDriver) -> None:
        self.inner = driver
        self.claims: list[tuple[datetime, dict[str, int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def worker(self, **options: Any) -> JobWorker:
        """A worker claiming through this spy, with no services."""
        return job_worker(driver=self, context=lambda: None, **options)  # type: ignore[arg-type]

    async def claim(
        self,
        *,
        worker_id: str,
        slots: Mapping[str, int],
        visibility_timeout: float,
        drop_exhausted: Collection[str] = (),
    ) -> ClaimBatch:
        self.claims.append((self.inner.clock.now(), dict(slots)))
        return await self.inner.claim(
            worker_id=worker_id,
            slots=slots,
            visibility_timeout=visibility_timeout,
            drop_exhausted=drop_exhausted,
        )


class Gate:
    """Bodies park on a gate until the test opens it."""

    def __init__(self) -> None:
        self.entered: list[int] = []
        self.event = asyncio.Event()

    async def run(self, *, input: Item) -> int:
        self.entered.append(input.n)
        await self.event.wait()
        return input.n


async def test_an_enqueue_in_this_process_starts_the_job_at_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    done: list[int] = []

    async def record(*, input: Item) -> None:
        done.append(input.n)

    handle = item_job(record)
    async with job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock):
        await settle()
        await handle.enqueue(Item(1))
        await until(lambda: done == [1])


async def test_each_queue_gets_its_own_slots_and_unnamed_queues_the_default(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    worker = job_worker(
        driver=driver,
        context=lambda: None,
        queues=["mail", "reports"],
        concurrency={"mail": 3},
        clock=clock,
    )
    assert worker.queues == {"mail": 3, "reports": JOBS_CONCURRENCY_DEFAULT}


async def test_one_number_sets_the_slots_of_every_queue(driver: MemoryJobDriver) -> None:
    worker = job_worker(driver=driver, context=lambda: None, queues=["a", "b"], concurrency=2)
    assert worker.queues == {"a": 2, "b": 2}


async def test_a_worker_serves_the_queues_of_the_jobs_it_is_given(
    driver: MemoryJobDriver,
) -> None:
    async def on_mail(*, input: Item) -> None:
        return None

    handle = item_job(on_mail, queue="mail-out")
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle])
    assert worker.queues == {"mail-out": JOBS_CONCURRENCY_DEFAULT}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
async def test_a_slot_count_that_is_not_a_whole_positive_number_is_refused(
    driver: MemoryJobDriver, bad: Any
) -> None:
    with pytest.raises(InvariantError):
        job_worker(driver=driver, context=lambda: None, queues=["a"], concurrency=bad)


async def test_an_empty_queue_list_is_refused(driver: MemoryJobDriver) -> None:
    with pytest.raises(ClaimQueuesEmptyError):
        job_worker(driver=driver, context=lambda: None, queues=[])


async def test_a_heartbeat_no_shorter_than_the_visibility_timeout_is_refused(
    driver: MemoryJobDriver,
) -> None:
    with pytest.raises(InvariantError):
        job_worker(
            driver=driver,
            context=lambda: None,
            queues=["a"],
            visibility_timeout=10,
            heartbeat_interval=10,
        )


async def test_a_pass_is_one_claim_over_every_queue_with_a_free_slot(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = ClaimSpy(driver)
    worker = spy.worker(queues=["a", "b", "c"], concurrency={"a": 2, "b": 1, "c": 4}, clock=clock)
    async with worker:
        await settle()
        # Each queue is asked for half its slots, rounded up (see the next test for why).
        assert spy.claims == [(clock.now(), {"a": 1, "b": 1, "c": 2})]


async def test_a_claim_takes_half_the_slots_and_a_full_one_is_followed_at_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """Half-slot claims keep the next batch on the wire while the last one runs; a full batch
    says more may be due, so the slots it left free are claimed for without waiting."""
    gate = Gate()
    handle = item_job(gate.run, name="worker-half-claims-gate")
    for n in range(10):
        await handle.enqueue(Item(n))
    spy = ClaimSpy(driver)
    async with spy.worker(jobs=[handle], concurrency=5, clock=clock):
        try:
            # No clock movement and no slot freed: only the full first batch asked for more.
            await until(lambda: len(gate.entered) == 5)
            await settle()
            assert [slots for _, slots in spy.claims] == [{handle.queue: 3}, {handle.queue: 2}]
        finally:
            gate.event.set()  # a failed check must not leave the worker waiting on its jobs
        await until(lambda: len(gate.entered) == 10)


async def held_at_each_claim(
    driver: MemoryJobDriver, clock: FrozenClock, name: str, **options: Any
) -> list[tuple[dict[str, int], int]]:
    """Each claim a worker with 4 slots sends over 10 parked jobs: what it asked for, and how
    many jobs the worker held as it asked."""
    gate = Gate()
    handle = item_job(gate.run, name=name)
    for n in range(10):
        await handle.enqueue(Item(n))
    spy = ClaimSpy(driver)
    original = spy.claim
    asked: list[tuple[dict[str, int], int]] = []
    worker = spy.worker(jobs=[handle], concurrency=4, clock=clock, **options)

    async def claim(**kwargs: Any) -> ClaimBatch:
        asked.append((dict(kwargs["slots"]), len(worker.in_flight)))
        return await original(**kwargs)

    spy.claim = claim  # type: ignore[method-assign]
    async with worker:
        try:
            await until(lambda: len(gate.entered) == 4)
            await settle()
        finally:
            gate.event.set()
    return asked


async def test_a_full_batch_sends_the_next_claim_before_it_is_launched(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """The claim a full batch calls for goes out first, and its round trip overlaps the
    decoding and launching of the batch in hand: the slots the batch will fill are known."""
    asked = await held_at_each_claim(driver, clock, "worker-claim-ahead-gate")
    assert asked[:2] == [({"default": 2}, 0), ({"default": 2}, 0)]


async def test_under_process_limits_the_next_claim_waits_for_the_launch(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """The limits' room depends on the rows themselves (their tenants, their names): the next
    claim is only sized once the batch in hand is launched."""
    asked = await held_at_each_claim(
        driver, clock, "worker-limited-claim-gate", limits=LimitConfig(per_tenant=10)
    )
    assert asked[:2] == [({"default": 2}, 0), ({"default": 2}, 2)]


async def test_a_queue_whose_batch_came_back_full_is_claimed_for_again_whatever_the_others_gave(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    gate = Gate()
    handle = item_job(gate.run, name="worker-full-queue-beside-empty-gate", queue="busy")
    for n in range(4):
        await handle.enqueue(Item(n))
    spy = ClaimSpy(driver)
    async with spy.worker(
        jobs=[handle], queues=["busy", "empty"], concurrency={"busy": 4, "empty": 2}, clock=clock
    ):
        try:
            await until(lambda: len(gate.entered) == 4)
            await settle()
            assert [slots for _, slots in spy.claims] == [
                {"busy": 2, "empty": 1},
                {"busy": 2, "empty": 1},
            ]
        finally:
            gate.event.set()


async def test_a_batch_that_comes_back_short_is_not_followed_at_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    gate = Gate()
    handle = item_job(gate.run, name="worker-short-claim-gate")
    await handle.enqueue(Item(1))
    spy = ClaimSpy(driver)
    async with spy.worker(jobs=[handle], concurrency=4, clock=clock):
        try:
            await until(lambda: gate.entered == [1])
            await settle()
            assert [slots for _, slots in spy.claims] == [{handle.queue: 2}]
        finally:
            gate.event.set()


async def test_a_full_queue_is_left_out_of_the_claim(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    gate = Gate()
    handle = item_job(gate.run, name="worker-full-queue-gate", queue="slow")
    spy = ClaimSpy(driver)
    worker = spy.worker(jobs=[handle], queues=["slow", "fast"], concurrency=1, clock=clock)
    async with worker:
        await settle()
        await handle.enqueue(Item(1))
        await until(lambda: gate.entered == [1])
        spy.claims.clear()
        signal_enqueued("fast")
        await settle()
        assert [slots for _, slots in spy.claims] == [{"fast": 1}]
        gate.event.set()


async def test_a_slot_coming_free_is_refilled_at_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    gate = Gate()
    handle = item_job(gate.run, name="worker-refill-gate")
    for n in range(3):
        await handle.enqueue(Item(n))
    async with job_worker(
        driver=driver, context=lambda: None, jobs=[handle], concurrency=1, clock=clock
    ):
        await until(lambda: gate.entered == [0])
        gate.event.set()
        # No clock movement: only the freed slot can have started the others.
        await until(lambda: gate.entered == [0, 1, 2])


async def test_a_full_worker_asks_the_queue_for_nothing(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    gate = Gate()
    handle = item_job(gate.run, name="worker-full-gate")
    await handle.enqueue(Item(1))
    spy = ClaimSpy(driver)
    async with spy.worker(jobs=[handle], concurrency=1, clock=clock):
        await until(lambda: gate.entered == [1])
        before = len(spy.claims)
        await run_clock(clock, 60)
        assert len(spy.claims) == before
        gate.event.set()


async def test_idle_the_wait_doubles_from_the_poll_interval_to_the_ceiling(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = ClaimSpy(driver)
    start = clock.now()
    async with spy.worker(queues=["idle"], clock=clock):
        await run_clock(clock, 10)
    offsets = [(at - start).total_seconds() for at, _ in spy.claims]
    assert offsets == [0, 0.25, 0.75, 1.75, 3.75, 5.75, 7.75, 9.75]


async def test_a_declared_idle_ceiling_is_the_ceiling(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = ClaimSpy(driver)
    start = clock.now()
    async with spy.worker(queues=["idle"], idle_poll_max=0.5, clock=clock):
        await run_clock(clock, 2)
    offsets = [(at - start).total_seconds() for at, _ in spy.claims]
    assert offsets == [0, 0.25, 0.75, 1.25, 1.75]


class FakeWake:
    def __init__(self, *, live: bool) -> None:
        self.live = live
        self.hears_outbox = False
        self.listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener)

    async def close(self) -> None:
        return None

    def notify(self, queue: str) -> None:
        for listener in list(self.listeners):
            listener(queue)

    def lose(self) -> None:
        """What a driver's wake does when its session dies."""
        self.live = False
        signal_wake_lost(self)


async def test_a_proven_wake_raises_the_idle_ceiling_to_five_seconds(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = ClaimSpy(driver)
    start = clock.now()
    async with spy.worker(queues=["idle"], wake=FakeWake(live=True), clock=clock):
        await run_clock(clock, 14)
    offsets = [(at - start).total_seconds() for at, _ in spy.claims]
    assert offsets == [0, 0.25, 0.75, 1.75, 3.75, 7.75, 12.75]


async def test_an_unproven_wake_keeps_the_two_second_ceiling(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = ClaimSpy(driver)
    start = clock.now()
    async with spy.worker(queues=["idle"], wake=FakeWake(live=False), clock=clock):
        await run_clock(clock, 6)
    offsets = [(at - start).total_seconds() for at, _ in spy.claims]
    assert offsets == [0, 0.25, 0.75, 1.75, 3.75, 5.75]


async def test_a_notification_from_another_process_starts_a_pass_and_resets_the_back_off(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = ClaimSpy(driver)
    wake = FakeWake(live=True)
    start = clock.now()
    async with spy.worker(queues=["q"], wake=wake, clock=clock):
        await run_clock(clock, 4)  # passes at 0, .25, .75, 1.75, 3.75; next at 7.75
        wake.notify("q")
        await settle()
        await run_clock(clock, 0.25)
    offsets = [(at - start).total_seconds() for at, _ in spy.claims]
    assert offsets == [0, 0.25, 0.75, 1.75, 3.75, 4, 4.25]


async def claims_around(
    driver: MemoryJobDriver,
    clock: FrozenClock,
    wake: FakeWake,
    event: Callable[[], None],
    *,
    after: float,
) -> list[float]:
    """The seconds of each claim of an idle worker on ``wake``: 8 s idle (passes at 0, .25,
    .75, 1.75, 3.75 and 7.75, the wait in progress ending at 12.75), ``event``, ``after`` more."""
    spy = ClaimSpy(driver)
    start = clock.now()
    async with spy.worker(queues=["q"], wake=wake, clock=clock):
        await run_clock(clock, 8)
        event()
        await run_clock(clock, after)
    return [(at - start).total_seconds() for at, _ in spy.claims]


async def test_a_wake_losing_its_session_brings_a_pass_at_once_then_the_two_second_ceiling(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    wake = FakeWake(live=True)
    offsets = await claims_around(driver, clock, wake, wake.lose, after=6)
    assert offsets == [0, 0.25, 0.75, 1.75, 3.75, 7.75, 8, 8.25, 8.75, 9.75, 11.75, 13.75]


async def test_another_wakes_loss_rings_nothing(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    other = FakeWake(live=True)
    offsets = await claims_around(driver, clock, FakeWake(live=True), other.lose, after=5)
    assert offsets == [0, 0.25, 0.75, 1.75, 3.75, 7.75, 12.75]


async def test_a_wake_that_stops_being_live_caps_the_next_wait_at_the_two_second_ceiling(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    wake = FakeWake(live=True)

    def silently_lost() -> None:  # a wake that signals nothing: the ceiling is read at each wait
        wake.live = False

    offsets = await claims_around(driver, clock, wake, silently_lost, after=7)
    assert offsets == [0, 0.25, 0.75, 1.75, 3.75, 7.75, 12.75, 14.75]


async def test_a_wake_naming_a_queue_the_worker_does_not_serve_is_ignored(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = ClaimSpy(driver)
    async with spy.worker(queues=["mine"], clock=clock):
        await settle()
        before = len(spy.claims)
        signal_enqueued("someone-elses")
        await settle()
        assert len(spy.claims) == before


async def test_wakes_during_a_pass_ask_for_one_more_pass_not_one_each(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    release = asyncio.Event()
    spy = ClaimSpy(driver)
    original = spy.claim

    async def slow_claim(**kwargs: Any) -> ClaimBatch:
        batch = await original(**kwargs)
        await release.wait()
        return batch

    spy.claim = slow_claim  # type: ignore[method-assign]
    async with spy.worker(queues=["q"], clock=clock):
        await settle()
        assert len(spy.claims) == 1
        for _ in range(5):
            signal_enqueued("q")
        release.set()
        await settle()
        assert len(spy.claims) == 2


async def test_a_retry_due_within_a_minute_is_picked_up_by_a_local_timer(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    attempts: list[int] = []

    async def flaky(*, input: Item, attempt: int) -> None:
        attempts.append(attempt)
        if attempt == 1:
            raise RuntimeError("transient")

    handle = item_job(flaky, retry=Retry(attempts=3, delay=30, jitter=False))
    spy = ClaimSpy(driver)
    async with spy.worker(
        jobs=[handle],
        idle_poll_max=3600,  # the poll alone would not come back for an hour
        clock=clock,
    ):
        await settle()
        started = clock.now()
        await handle.enqueue(Item(1))
        await until(lambda: attempts == [1])
        await run_clock(clock, 31)
        assert attempts == [1, 2]
        assert any((at - started).total_seconds() == 30 for at, _ in spy.claims)


async def test_rows_are_routed_to_the_explicit_jobs_ahead_of_the_registry(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    seen: list[str] = []

    def declare(label: str) -> Any:
        async def twin(*, input: Item) -> None:
            seen.append(label)

        return item_job(twin)

    declare("registered")
    mine = declare("explicit")  # same implicit name: the registry keeps the first
    async with job_worker(driver=driver, context=lambda: None, jobs=[mine], clock=clock):
        await mine.enqueue(Item(1))
        await until(lambda: seen == ["explicit"])


async def test_ctx_services_is_what_the_context_factory_built(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    seen: list[Any] = []

    async def uses(*, input: Item, ctx: Any) -> None:
        seen.append(ctx.services)

    handle = item_job(uses)
    services = object()
    async with job_worker(driver=driver, context=lambda: services, jobs=[handle], clock=clock):
        await handle.enqueue(Item(1))
        await until(lambda: seen == [services])


async def test_an_async_context_factory_is_awaited(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    seen: list[Any] = []

    async def uses(*, input: Item, ctx: Any) -> None:
        seen.append(ctx.services)

    async def build() -> str:
        return "built"

    handle = item_job(uses)
    async with job_worker(driver=driver, context=build, jobs=[handle], clock=clock):
        await handle.enqueue(Item(1))
        await until(lambda: seen == ["built"])


async def test_a_context_factory_that_raises_fails_the_attempt_without_the_body(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    ran: list[int] = []

    async def body(*, input: Item) -> None:
        ran.append(input.n)

    def broken() -> Any:
        raise RuntimeError("no database")

    handle = item_job(body)
    worker = job_worker(driver=driver, context=broken, jobs=[handle], clock=clock)
    async with worker:
        queued = await handle.enqueue(Item(1))
        await until(lambda: worker.stats.retried == 1)
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert ran == []
    assert "no database" in (detail.row.last_error or "")


async def test_a_claim_whose_rows_cannot_be_read_is_a_failed_claim_and_the_loop_goes_on(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch decoded as the worker reads it (``ClaimedOnRead``) fails there, not in the
    driver's claim: the same warning as any failed claim, and the next pass claims again."""
    ran: list[int] = []

    async def body(*, input: Item) -> None:
        ran.append(input.n)

    def unreadable(rows: Sequence[str]) -> list[ClaimedJob]:
        raise ValueError(f"cannot decode {list(rows)}")

    handle = item_job(body)
    spy = ClaimSpy(driver)
    original = spy.claim
    calls = 0

    async def claim(**kwargs: Any) -> ClaimBatch:
        nonlocal calls
        calls += 1
        if calls == 1:
            return ClaimBatch(jobs=ClaimedOnRead(["garbled"], unreadable))
        return await original(**kwargs)

    spy.claim = claim  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
        async with spy.worker(jobs=[handle], clock=clock):
            await until(lambda: calls == 1)
            await handle.enqueue(Item(1))
            await until(lambda: ran == [1])
    failed = [r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.claim-failed"]
    assert len(failed) == 1
    assert "cannot decode ['garbled']" in failed[0].jobs["error"]


async def test_stats_count_how_each_attempt_ended(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def ends(*, input: Item, step: Any) -> None:
        if input.n == 1:
            raise RuntimeError("boom")
        if input.n == 2:
            await step.sleep("nap", 3600)

    handle = item_job(ends, retry=Retry(attempts=1))
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    async with worker:
        for n in range(3):
            await handle.enqueue(Item(n))
        await until(
            lambda: worker.stats.completed + worker.stats.dead + worker.stats.suspended == 3
        )
    assert (worker.stats.completed, worker.stats.dead, worker.stats.suspended) == (1, 1, 1)


async def test_a_running_worker_folds_the_counters_once_a_minute(
    driver: MemoryJobDriver, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = clock.now()
    rollups: list[float] = []

    async def rollup() -> None:
        rollups.append((clock.now() - start).total_seconds())

    monkeypatch.setattr(driver.introspect, "rollup_counters", rollup)
    async with job_worker(driver=driver, context=lambda: None, queues=["idle"], clock=clock):
        await run_clock(clock, 150)
    # The idle loop passes every two seconds: each rollup comes with the first pass past its minute.
    assert len(rollups) == 2
    assert 60 <= rollups[0] < 62
    assert 60 <= rollups[1] - rollups[0] < 62


async def test_a_failing_rollup_is_logged_and_the_worker_goes_on(
    driver: MemoryJobDriver, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    async def rollup() -> None:
        raise RuntimeError("counters unreachable")

    monkeypatch.setattr(driver.introspect, "rollup_counters", rollup)
    ran: list[int] = []

    async def body(*, input: Item) -> None:
        ran.append(input.n)

    handle = item_job(body)
    with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
        async with job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock):
            await run_clock(clock, 65)
            await handle.enqueue(Item(1))
            await until(lambda: ran == [1])
    assert [r.getMessage() for r in caplog.records if "rollup-failed" in r.getMessage()]


async def test_the_worker_is_listed_with_its_queues_slots_and_jobs_in_flight(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    gate = Gate()
    handle = item_job(gate.run, name="worker-registry-gate")
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], concurrency=2, clock=clock
    )
    async with worker:
        queued = await handle.enqueue(Item(1))
        await until(lambda: gate.entered == [1])
        await run_clock(clock, 10)  # one renewal of the registry row
        (info,) = await driver.introspect.workers()
        assert (info.id, dict(info.slots), list(info.in_flight)) == (
            worker.id,
            {"default": 2},
            [queued.id],
        )
        assert info.last_heartbeat == clock.now()
        gate.event.set()
    assert await driver.introspect.workers() == []


class HeldRegistry:
    """The memory driver's introspection, holding registry writes on the wire while ``hold``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.hold = False
        self.sent = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def record_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        if self.hold:
            self.sent.set()
            await self.release.wait()
        await self.inner.record_worker(info, ttl=ttl)


async def test_a_registry_renewal_on_the_wire_at_stop_does_not_list_the_stopped_worker(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = ClaimSpy(driver)
    registry = HeldRegistry(driver.introspect)
    spy.introspect = registry
    worker = spy.worker(queues=["q"], clock=clock)
    await worker.start()
    registry.hold = True
    await run_clock(clock, 10)  # the row's renewal is due
    await until(registry.sent.is_set)
    stopping = asyncio.create_task(worker.stop())
    await settle()
    registry.release.set()  # it lands while stop() waits for it, ahead of remove_worker
    await stopping
    await settle()
    assert await driver.introspect.workers() == []


async def test_a_served_queue_no_job_names_is_polled_and_reported_once(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    spy = ClaimSpy(driver)
    with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
        async with spy.worker(queues=["nobody-names-this"], clock=clock):
            await run_clock(clock, 3)
    events = [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.queue-unregistered"
    ]
    assert len(events) == 1
    assert spy.claims


def _undeclared_request(clock: FrozenClock, name: str) -> EnqueueRequest:
    return EnqueueRequest(new_id(), new_id(), name, "q", {"n": 1}, "k", None, 3, clock.now())


async def test_a_young_row_of_an_undeclared_job_waits_uncounted_for_a_worker_that_declares_it(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling deploy: the new code enqueues a job the old workers have never heard of. They
    hand it back instead of spending its attempts, and a worker on the new code runs it."""
    ran: list[int] = []

    async def from_the_next_deploy(*, input: Item, attempt: int) -> None:
        ran.append(attempt)

    name = job_name_of(from_the_next_deploy)
    queued = await driver.enqueue(_undeclared_request(clock, name))
    old = job_worker(driver=driver, context=lambda: None, queues=["q"], clock=clock)
    with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
        async with old:
            await until(lambda: old.stats.handed_back == 1)
            detail = await driver.introspect.get(queued.id)
            assert detail is not None
            row = detail.row
            assert (row.state, row.attempt, row.last_error) == (JobState.READY, 0, None)
            assert row.run_at == clock.now() + timedelta(seconds=UNDECLARED_RETRY_S)
            await run_clock(clock, 2 * UNDECLARED_RETRY_S)  # claimed and handed back again
            assert old.stats.handed_back > 1
            assert old.stats.retried == old.stats.dead == 0
    events = [r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.job-undeclared"]
    assert len(events) == 1

    new = item_job(from_the_next_deploy, name=name, queue="q")
    async with job_worker(driver=driver, context=lambda: None, jobs=[new], clock=clock):
        await run_clock(clock, UNDECLARED_RETRY_S + 5)  # due, and the idle poll comes by
        await until(lambda: ran == [1])


async def test_an_old_row_of_an_undeclared_job_fails_on_its_retry_path(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """Past the grace it is not a deploy in progress: a name no worker declares (a typo, a job
    removed) fails its attempts, and dead-letters, where an operator sees it."""
    queued = await driver.enqueue(_undeclared_request(clock, "nobody-declares-this"))
    clock.advance(UNDECLARED_GRACE_S)
    worker = job_worker(driver=driver, context=lambda: None, queues=["q"], clock=clock)
    async with worker:
        await until(lambda: worker.stats.retried == 1)
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.attempt == 1
    assert "no job named" in (detail.row.last_error or "")
    assert worker.stats.handed_back == 0


@pytest.mark.parametrize("grace", ["1h", timedelta(hours=1), 3600])
async def test_a_worker_may_stretch_the_grace_past_a_slow_rollout(
    driver: MemoryJobDriver, clock: FrozenClock, grace: Duration
) -> None:
    queued = await driver.enqueue(_undeclared_request(clock, "from-a-slow-rollout"))
    clock.advance(UNDECLARED_GRACE_S)  # past the default grace, inside the worker's own
    worker = job_worker(
        driver=driver, context=lambda: None, queues=["q"], clock=clock, undeclared_grace=grace
    )
    async with worker:
        await until(lambda: worker.stats.handed_back == 1)
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.state, detail.row.attempt, detail.row.last_error) == (
        JobState.READY,
        0,
        None,
    )


async def test_a_grace_of_zero_fails_an_undeclared_row_at_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    queued = await driver.enqueue(_undeclared_request(clock, "nobody-declares-this"))
    worker = job_worker(
        driver=driver, context=lambda: None, queues=["q"], clock=clock, undeclared_grace=0
    )
    async with worker:
        await until(lambda: worker.stats.retried == 1)
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert "no job named" in (detail.row.last_error or "")
    assert worker.stats.handed_back == 0


@pytest.mark.parametrize("grace", [-1, "-5s", "soon", float("nan")])
async def test_a_malformed_grace_is_refused_where_it_is_written(
    driver: MemoryJobDriver, grace: Any
) -> None:
    with pytest.raises(InvariantError) as raised:
        job_worker(driver=driver, context=lambda: None, queues=["q"], undeclared_grace=grace)
    assert raised.value.code == "X_INVARIANT"


async def test_rows_buried_by_the_claim_are_announced_and_dropped_names_are_passed(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    told: list[str] = []

    async def dies(*, input: Item) -> None:
        return None

    async def on_settled(settled: Any) -> None:
        told.append(settled.outcome)

    handle = item_job(
        dies, retry=Retry(attempts=1, dead_letter=False), on_settled=on_settled, queue="burial"
    )
    queued = await handle.enqueue(Item(1))
    await driver.claim(worker_id="gone", slots={"burial": 1}, visibility_timeout=30)
    clock.advance(31)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    async with worker:
        await until(lambda: told == ["dropped"])
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.FAILED
    assert worker.stats.dropped == 1


async def test_a_dead_letter_false_job_enqueued_on_another_queue_is_buried_failed(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    told: list[str] = []

    async def dies(*, input: Item) -> None:
        return None

    async def on_settled(settled: Any) -> None:
        told.append(settled.outcome)

    handle = item_job(
        dies, retry=Retry(attempts=1, dead_letter=False), on_settled=on_settled, queue="home"
    )
    queued = await handle.enqueue(Item(1), queue="away")
    await driver.claim(worker_id="gone", slots={"away": 1}, visibility_timeout=30)
    clock.advance(31)
    worker = job_worker(
        driver=driver, context=lambda: None, queues=["away"], jobs=[handle], clock=clock
    )
    async with worker:
        await until(lambda: told == ["dropped"])
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.FAILED


async def test_a_dead_letter_false_job_declared_after_the_worker_started_is_buried_failed(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """A job imported lazily, after ``start()``: the claim still names it among the jobs whose
    exhausted rows are dropped, not dead-lettered."""

    async def imported_late(*, input: Item) -> None:
        return None

    request = EnqueueRequest(
        new_id(), new_id(), job_name_of(imported_late), "late", {"n": 1}, "k", None, 1, clock.now()
    )
    queued = await driver.enqueue(request)
    await driver.claim(worker_id="gone", slots={"late": 1}, visibility_timeout=30)
    worker = job_worker(driver=driver, context=lambda: None, queues=["late"], clock=clock)
    async with worker:
        await settle()
        item_job(imported_late, retry=Retry(attempts=1, dead_letter=False), queue="late")
        await run_clock(clock, 35)  # the lease lapses at 30 s; the idle poll comes within 2 s
        await until(lambda: worker.stats.dropped == 1)
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.FAILED


async def test_a_worker_cannot_be_started_twice(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    worker = job_worker(driver=driver, context=lambda: None, queues=["q"], clock=clock)
    async with worker:
        with pytest.raises(InvariantError):
            await worker.start()


async def test_a_metrics_hook_that_throws_neither_ends_the_claim_loop_nor_goes_unlogged(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    from prometheus_client import CollectorRegistry

    from ultimat3.jobs.core import JobMetrics

    class BrokenMetrics(JobMetrics):
        def settled(self, queue: str, outcome: Any, count: int = 1) -> None:
            raise RuntimeError("exporter down")

    ran: list[int] = []

    async def body(*, input: Item) -> None:
        ran.append(input.n)

    handle = item_job(body, name="worker-broken-metrics")
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        async with job_worker(
            driver=driver,
            context=lambda: None,
            jobs=[handle],
            clock=clock,
            metrics=BrokenMetrics(registry=CollectorRegistry()),
        ):
            await handle.enqueue(Item(1))
            await until(lambda: ran == [1])
            await run_clock(clock, 5)
            await handle.enqueue(Item(2))
            await run_clock(clock, 5)
            await until(lambda: ran == [1, 2])
    assert [r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.tick-failed"]


async def test_a_driver_handing_one_claim_token_to_a_whole_batch_runs_every_row(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """The protocol lets one token serve a batch: the worker tells runs apart by job id too."""
    import dataclasses

    from ultimat3.jobs.core import ClaimRef

    class OneToken:
        def __init__(self, inner: MemoryJobDriver) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def claim(self, **options: Any) -> ClaimBatch:
            batch = await self.inner.claim(**options)
            if not batch.jobs:
                return batch
            token = batch.jobs[0].claim.claim
            for claimed in batch.jobs:
                self.inner._state.rows[claimed.id].claim = token
            return ClaimBatch(
                jobs=[
                    dataclasses.replace(c, claim=ClaimRef(c.claim.worker_id, token))
                    for c in batch.jobs
                ],
                exhausted=batch.exhausted,
            )

    release = asyncio.Event()

    async def held(*, input: Item) -> None:
        await release.wait()

    handle = item_job(held, name="worker-one-token")
    for n in (1, 2, 3):
        await handle.enqueue(Item(n))
    async with job_worker(
        driver=OneToken(driver),  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        concurrency=3,
        clock=clock,
    ) as worker:
        await until(lambda: len(worker.in_flight) == 3)
        release.set()
        await until(lambda: worker.stats.completed == 3)
