"""Lease renewal: every third of the window, loud when it stops landing, quiet for finished
jobs."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.eventually import run_clock, settle, until
from support.jobs import Item, item_job
from support.outage import AckOutage

from ultimat3.jobs.core import (
    ClaimRef,
    Concurrency,
    EnqueueRequest,
    FrozenClock,
    JobMetrics,
    JobState,
    LeaseLostError,
    Retry,
    job_lease_key,
    job_worker,
    new_id,
)
from ultimat3.jobs.core.memory import MemoryJobDriver
from ultimat3.jobs.core.worker import _Run


class HeartbeatSpy:
    """The memory driver, with heartbeats recorded and, when ``answer`` is set, replaced."""

    def __init__(self, driver: MemoryJobDriver) -> None:
        self.inner = driver
        self.beats: list[datetime] = []
        self.answer: Callable[[], Awaitable[bool]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def heartbeat(self, job_id: str, ref: ClaimRef, visibility_timeout: float) -> bool:
        self.beats.append(self.inner.clock.now())
        if self.answer is not None:
            return await self.answer()
        return await self.inner.heartbeat(job_id, ref, visibility_timeout)


class Parked:
    """A body that parks until released, and remembers how each of its runs ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.endings: list[BaseException | str] = []
        self.reasons: list[BaseException | None] = []

    @property
    def ended(self) -> BaseException | str | None:
        return self.endings[0] if self.endings else None

    @property
    def signal_reason(self) -> BaseException | None:
        return self.reasons[0] if self.reasons else None

    async def run(self, *, input: Item, ctx: Any) -> None:
        self.started.set()
        try:
            await self.release.wait()
            self.endings.append("returned")
        except asyncio.CancelledError as cancelled:
            self.endings.append(cancelled)
            self.reasons.append(ctx.signal.reason)
            raise


def metrics() -> JobMetrics:
    return JobMetrics(registry=CollectorRegistry())


def leases_lost(found: JobMetrics, queue: str = "default") -> float:
    return float(found.leases_lost.labels(queue)._value.get())


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if getattr(record, "event", None) == name]


async def test_a_running_lease_is_renewed_every_third_of_the_visibility_timeout(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = HeartbeatSpy(driver)
    body = Parked()
    handle = item_job(body.run)
    start = clock.now()
    async with job_worker(
        driver=spy,  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        visibility_timeout=30,
        clock=clock,
    ):
        queued = await handle.enqueue(Item(1))
        await until(body.started.is_set)
        await run_clock(clock, 95)
        offsets = [(at - start).total_seconds() for at in spy.beats]
        assert offsets == [10, 20, 30, 40, 50, 60, 70, 80, 90]
        detail = await driver.introspect.get(queued.id)
        assert detail is not None
        assert detail.row.state is JobState.RUNNING
        body.release.set()
        await until(lambda: body.ended == "returned")


async def test_a_failed_renewal_warns_while_the_window_still_has_room(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    spy = HeartbeatSpy(driver)
    failures = iter([True])

    async def fail_once() -> bool:
        if next(failures, False):
            raise ConnectionError("pool blip")
        return True

    spy.answer = fail_once
    body = Parked()
    handle = item_job(body.run)
    found = metrics()
    async with job_worker(
        driver=spy,  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        clock=clock,
        metrics=found,
    ):
        await handle.enqueue(Item(1))
        await until(body.started.is_set)
        with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
            await run_clock(clock, 35)
        assert len(events(caplog, "jobs.heartbeat.failed")) == 1
        assert events(caplog, "jobs.lease.lost") == []
        assert body.ended is None
        body.release.set()
    assert leases_lost(found) == 0


async def test_a_whole_window_without_a_renewal_loses_the_lease_and_aborts_the_run(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    spy = HeartbeatSpy(driver)

    async def always_fail() -> bool:
        raise ConnectionError("database gone")

    spy.answer = always_fail
    body = Parked()
    handle = item_job(body.run)
    found = metrics()
    worker = job_worker(
        driver=spy,  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        clock=clock,
        metrics=found,
    )
    async with worker:
        queued = await handle.enqueue(Item(1))
        await until(body.started.is_set)
        with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
            await run_clock(clock, 29)
            assert body.ended is None
            await run_clock(clock, 1)
        await until(lambda: body.ended is not None)
        assert isinstance(body.signal_reason, LeaseLostError)
        assert body.signal_reason.code == "X_JOB_LEASE_LOST"
        assert len(events(caplog, "jobs.lease.lost")) == 1
        assert leases_lost(found) == 1
        # The lost run settled nothing: its row went back to the queue, which re-delivers it.
        spy.answer = None
        body.release.set()
        await until(lambda: body.endings[1:] == ["returned"])
    assert worker.stats.lease_lost == 1
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.state, detail.row.attempt) == (JobState.DONE, 2)


async def test_the_lease_window_is_counted_from_the_claim_not_from_its_answer(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    class SlowClaims(HeartbeatSpy):
        """Claims whose answer takes five seconds to come back; renewals that never land."""

        async def claim(self, **options: Any) -> Any:
            batch = await self.inner.claim(**options)
            if batch.jobs:
                clock.advance(5)
            return batch

    spy = SlowClaims(driver)

    async def always_fail() -> bool:
        raise ConnectionError("database gone")

    spy.answer = always_fail
    body = Parked()
    handle = item_job(body.run)
    worker = job_worker(driver=spy, context=lambda: None, jobs=[handle], clock=clock)  # type: ignore[arg-type]
    async with worker:
        try:
            await handle.enqueue(Item(1))
            await until(body.started.is_set)
            await run_clock(clock, 25)  # 30 s after the claim, when the queue's lease lapses
            await until(lambda: body.ended is not None)
            assert isinstance(body.signal_reason, LeaseLostError)
        finally:
            body.release.set()


async def test_a_renewal_that_hangs_is_caught_like_one_that_fails(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = HeartbeatSpy(driver)
    never = asyncio.Event()

    async def hang() -> bool:
        await never.wait()
        return True

    spy.answer = hang
    body = Parked()
    handle = item_job(body.run)
    found = metrics()
    async with job_worker(
        driver=spy,  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        clock=clock,
        metrics=found,
    ):
        await handle.enqueue(Item(1))
        await until(body.started.is_set)
        await run_clock(clock, 30)
        await until(lambda: body.ended is not None)
        assert isinstance(body.signal_reason, LeaseLostError)
        assert len(spy.beats) == 1  # one renewal on the wire, never a second stacked on it
        assert leases_lost(found) == 1
        spy.answer = None
        never.set()
        body.release.set()


async def test_a_renewal_refused_by_the_queue_loses_the_lease_at_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = HeartbeatSpy(driver)

    async def refused() -> bool:
        return False

    spy.answer = refused
    body = Parked()
    handle = item_job(body.run)
    found = metrics()
    async with job_worker(
        driver=spy,  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        clock=clock,
        metrics=found,
    ):
        await handle.enqueue(Item(1))
        await until(body.started.is_set)
        await run_clock(clock, 10)
        await until(lambda: body.ended is not None)
        assert isinstance(body.signal_reason, LeaseLostError)
        assert leases_lost(found) == 1
        spy.answer = None
        body.release.set()


async def test_a_job_that_finished_while_its_renewal_was_on_the_wire_reports_nothing(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    spy = HeartbeatSpy(driver)
    on_the_wire = asyncio.Event()
    answer = asyncio.Event()

    async def slow_refusal() -> bool:
        on_the_wire.set()
        await answer.wait()
        return False  # the ack moved the row out of running: the fenced renewal misses

    spy.answer = slow_refusal
    body = Parked()
    handle = item_job(body.run)
    found = metrics()
    async with job_worker(
        driver=spy,  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        clock=clock,
        metrics=found,
    ):
        queued = await handle.enqueue(Item(1))
        await until(body.started.is_set)
        await run_clock(clock, 10)
        await until(on_the_wire.is_set)
        body.release.set()
        await until(lambda: body.ended == "returned")
        with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
            answer.set()
            await run_clock(clock, 60)
    assert events(caplog, "jobs.lease.lost") == []
    assert events(caplog, "jobs.heartbeat.failed") == []
    assert leases_lost(found) == 0
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.DONE


async def test_a_job_cancelled_while_running_is_aborted_at_its_next_renewal(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    body = Parked()
    handle = item_job(body.run)
    found = metrics()
    async with job_worker(
        driver=driver, context=lambda: None, jobs=[handle], clock=clock, metrics=found
    ):
        queued = await handle.enqueue(Item(1))
        await until(body.started.is_set)
        await driver.introspect.cancel(queued.id, "runaway")
        with caplog.at_level(logging.INFO, logger="ultimat3.jobs"):
            await run_clock(clock, 10)
            await until(lambda: body.ended is not None)
    assert isinstance(body.signal_reason, LeaseLostError)
    assert body.signal_reason.meta["cancelled"] is True
    assert len(events(caplog, "jobs.job.cancelled")) == 1
    assert leases_lost(found) == 0  # an operator's cancel is not a lost lease
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.CANCELLED


async def test_the_renewal_loop_wakes_only_when_a_renewal_is_due(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    spy = HeartbeatSpy(driver)
    done: list[int] = []

    async def quick(*, input: Item) -> None:
        done.append(input.n)

    handle = item_job(quick)
    async with job_worker(
        driver=spy,  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        clock=clock,
    ):
        for n in range(50):
            await handle.enqueue(Item(n))
        await until(lambda: len(done) == 50)
        await settle()
        await run_clock(clock, 60)
    assert spy.beats == []  # jobs that finish before their first renewal are never renewed


async def test_a_renewal_refused_after_the_ack_landed_is_not_a_lost_lease(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A slow on_settled keeps the run's task alive past a heartbeat: the renewal sent then finds
    the row done and is refused — that is the ack having landed, not a lost lease."""
    hook_running = asyncio.Event()
    hook_release = asyncio.Event()

    async def slow_hook(settled: Any) -> None:
        hook_running.set()
        await hook_release.wait()

    async def quick(*, input: Item) -> None:
        return None

    handle = item_job(quick, on_settled=slow_hook)
    found = metrics()
    async with job_worker(
        driver=driver, context=lambda: None, jobs=[handle], clock=clock, metrics=found
    ) as worker:
        await handle.enqueue(Item(2))
        await until(hook_running.is_set)
        with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
            await run_clock(clock, 25)  # two heartbeat intervals with the hook still running
            hook_release.set()
            await until(lambda: worker.stats.completed == 1)
    assert events(caplog, "jobs.lease.lost") == []
    assert leases_lost(found) == 0
    assert worker.stats.lease_lost == 0


async def test_a_finished_run_is_freed_by_reference_counting_alone(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """Nothing of a settled run stays reachable (its lease's heap slot included) or waits for
    the cycle collector: a busy worker would otherwise pay full collections for every run."""
    done: list[int] = []

    async def record(*, input: Item) -> None:
        done.append(input.n)

    handle = item_job(record)
    was_enabled = gc.isenabled()
    gc.collect()  # what earlier tests left for the collector is not this test's
    gc.disable()
    try:
        async with job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock):
            for n in range(5):
                await handle.enqueue(Item(n))
            await until(lambda: len(done) == 5)
            await settle()
            assert [o for o in gc.get_objects() if isinstance(o, _Run)] == []
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("path", ["context-failed", "key-refused", "input-invalid"])
async def test_a_run_settled_without_its_body_reports_no_lost_lease(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """A run failed because the services would not build or its input no longer parses, or
    refused by its busy key, is settled without its body; a renewal refused while its
    on_settled still runs is that settle, too."""
    hook_running = asyncio.Event()
    hook_release = asyncio.Event()

    async def slow_hook(settled: Any) -> None:
        hook_running.set()
        await hook_release.wait()

    async def never(*, input: Item) -> None:
        raise AssertionError("the body never runs")

    def services() -> None:
        if path == "context-failed":
            raise RuntimeError("services unavailable")

    busy = Concurrency(key=lambda i: "k", limit=1, when_busy="fail")
    handle = item_job(never, on_settled=slow_hook, concurrency=busy, retry=Retry(attempts=1))
    assert driver.leases is not None
    if path == "key-refused":
        await driver.leases.acquire(job_lease_key(handle.name, "k"), "other", limit=1, ttl=300)
    found = metrics()
    async with job_worker(
        driver=driver, context=services, jobs=[handle], clock=clock, metrics=found
    ) as worker:
        if path == "input-invalid":
            await driver.enqueue(
                EnqueueRequest(
                    id=new_id(),
                    run_id=new_id(),
                    name=handle.name,
                    queue="default",
                    input={"not": "an item"},
                    idempotency_key="stale",
                    tenant_id=None,
                    max_attempts=1,
                    run_at=clock.now(),
                )
            )
        else:
            await handle.enqueue(Item(3))
        await until(hook_running.is_set)
        with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
            await run_clock(clock, 25)  # two heartbeat intervals with the hook still running
            hook_release.set()
            await until(lambda: worker.stats.dead + worker.stats.refused > 0)
    assert events(caplog, "jobs.lease.lost") == []
    assert leases_lost(found) == 0


@pytest.mark.usefixtures("quick_ack_retries")
async def test_a_completed_final_attempt_whose_ack_fails_twice_still_ends_done(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """An outage longer than the driver's own retry: given up, the ack would leave the row to
    lapse, and the claim would bury this final attempt dead although its body completed."""
    ran: list[int] = []

    async def body(*, input: Item) -> None:
        ran.append(input.n)

    handle = item_job(body, retry=Retry(attempts=1))
    flaky = AckOutage(driver, failures=2)
    worker = job_worker(driver=flaky, context=lambda: None, jobs=[handle], clock=clock)  # type: ignore[arg-type]
    async with worker:
        queued = await handle.enqueue(Item(1))
        await until(lambda: worker.stats.completed == 1)
    assert (ran, flaky.acks) == ([1], 3)
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.DONE


@pytest.mark.usefixtures("quick_ack_retries")
async def test_the_worker_stops_sending_an_ack_once_the_lease_has_lapsed(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Renewals fail with the acks; a whole window later the row is the queue's again, and the
    run is given up (the next claim re-delivers it)."""
    flaky = AckOutage(driver, failures=10**9)
    spy = HeartbeatSpy(flaky)  # type: ignore[arg-type]

    async def down() -> bool:
        raise ConnectionError("database gone")

    spy.answer = down
    handle = item_job(lambda *, input: None)
    worker = job_worker(driver=spy, context=lambda: None, jobs=[handle], clock=clock)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="ultimat3.jobs"):
        async with worker:
            queued = await handle.enqueue(Item(1))
            await until(lambda: flaky.acks > 0)
            sent = flaky.acks
            await run_clock(clock, 31)
            await until(lambda: bool(events(caplog, "jobs.worker.run-failed")))
            assert flaky.acks > sent  # sent again until the lapse, and then no more
            given_up = flaky.acks
            await settle()
            assert flaky.acks == given_up
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.RUNNING


@pytest.mark.usefixtures("quick_ack_retries")
async def test_an_ack_is_sent_again_past_the_claims_lease_while_renewals_keep_it(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """The lease the worker holds is the renewed one, not the one the claim answered."""
    handle = item_job(lambda *, input: None)
    flaky = AckOutage(driver, failures=12, step=5)  # a minute of failed acks
    worker = job_worker(driver=flaky, context=lambda: None, jobs=[handle], clock=clock)  # type: ignore[arg-type]
    async with worker:
        queued = await handle.enqueue(Item(1))
        await until(lambda: worker.stats.completed == 1)
    assert flaky.acks == 13
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.DONE
