"""Stopping a worker: the two-phase drain (SIGTERM) and the manual stop."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.eventually import run_clock, settle, until
from support.jobs import Item
from support.jobs import item_job as any_item_job

from ultimat3.jobs.core import (
    FrozenClock,
    JobDrainedError,
    JobMetrics,
    JobState,
    Retry,
    configure_lifecycle,
    install_shutdown_signals,
    job_worker,
    on_shutdown,
    shutdown,
)
from ultimat3.jobs.core import worker as worker_module
from ultimat3.jobs.core.constants import DRAIN_DEADLINE_S
from ultimat3.jobs.core.memory import MemoryJobDriver

item_job = partial(any_item_job, retry=Retry(attempts=1))
"""The jobs here have one attempt: what a drain hands back comes back uncounted, and any
failure is final."""


class Held:
    """Bodies that park until released; ``stubborn`` ones ignore their signal entirely."""

    def __init__(self, *, stubborn: bool = False) -> None:
        self.stubborn = stubborn
        self.started: list[int] = []
        self.release = asyncio.Event()
        self.reasons: dict[int, BaseException | None] = {}
        self.finished: list[int] = []

    async def run(self, *, input: Item, ctx: Any) -> None:
        self.started.append(input.n)
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.reasons[input.n] = ctx.signal.reason
            if not self.stubborn:
                raise
            await asyncio.shield(self.release.wait())
        self.finished.append(input.n)


async def row(driver: MemoryJobDriver, job_id: str) -> Any:
    detail = await driver.introspect.get(job_id)
    assert detail is not None
    return detail.row


async def test_the_drain_aborts_every_held_job_with_x_draining_naming_the_worker(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Held()
    handle = item_job(body.run)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    await worker.start()
    for n in range(3):
        await handle.enqueue(Item(n))
    await until(lambda: len(body.started) == 3)
    await worker.drain("SIGTERM")
    assert sorted(body.reasons) == [0, 1, 2]
    for reason in body.reasons.values():
        assert isinstance(reason, JobDrainedError)
        assert reason.code == "X_DRAINING"
        assert reason.meta == {"worker": worker.id, "signal": "SIGTERM"}


async def test_a_drained_body_that_unwinds_is_interrupted_ready_at_once_and_uncounted(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Held()
    handle = item_job(body.run)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    await worker.start()
    queued = await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    await worker.drain()
    drained = await row(driver, queued.id)
    assert (drained.state, drained.attempt, drained.run_at) == (JobState.READY, 0, clock.now())
    assert worker.stats.interrupted == 1
    assert await driver.introspect.counter_totals(since=clock.now() - timedelta(days=1)) == []


async def test_the_close_phase_waits_for_a_body_that_finishes_anyway(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Held(stubborn=True)
    handle = item_job(body.run)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    await worker.start()
    queued = await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    draining = asyncio.ensure_future(worker.drain())
    await run_clock(clock, 10)
    assert not draining.done()
    body.release.set()
    await draining
    assert (await row(driver, queued.id)).state is JobState.DONE


async def test_past_the_deadline_the_drain_is_abandoned_and_the_lease_left_to_lapse(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    body = Held(stubborn=True)
    handle = item_job(body.run)
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], clock=clock, drain_deadline=25
    )
    await worker.start()
    queued = await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        draining = asyncio.ensure_future(worker.drain())
        await run_clock(clock, 24)
        assert not draining.done()
        await run_clock(clock, 1)
        await until(draining.done)
    abandoned = [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.drain-abandoned"
    ]
    assert len(abandoned) == 1
    assert abandoned[0].jobs["jobs"] == [queued.id]  # type: ignore[attr-defined]
    held = await row(driver, queued.id)
    assert held.state is JobState.RUNNING  # nothing renews it now; the queue re-delivers it
    await run_clock(clock, 30)
    second = await driver.claim(worker_id="next", slots={"default": 1}, visibility_timeout=30)
    assert [claimed.id for claimed in second.jobs] == []  # final attempt: buried, not re-run
    assert [buried.id for buried in second.exhausted] == [queued.id]
    body.release.set()


async def test_a_drained_body_that_ignores_it_is_still_torn_down_at_its_deadline(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """The job's timeout holds whatever aborted the attempt first: past its deadline (and the
    grace) the body is left behind and the drained row handed back, uncounted, long before
    the drain's own budget runs out."""
    body = Held(stubborn=True)
    handle = item_job(body.run, timeout="5s")
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], clock=clock, drain_deadline=25
    )
    await worker.start()
    queued = await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    draining = asyncio.ensure_future(worker.drain())
    await run_clock(clock, 5)
    await asyncio.wait_for(draining, timeout=30)
    handed_back = await row(driver, queued.id)
    assert (handed_back.state, handed_back.attempt) == (JobState.READY, 0)
    assert worker.stats.interrupted == 1
    body.release.set()


def counted_worker(
    driver: MemoryJobDriver, clock: FrozenClock, body: Held, found: JobMetrics
) -> tuple[Any, Any]:
    """A job over ``body`` and a worker counting into ``found``, with a 25 s drain budget."""
    handle = item_job(body.run)
    worker = job_worker(
        driver=driver,
        context=lambda: None,
        jobs=[handle],
        clock=clock,
        drain_deadline=25,
        metrics=found,
    )
    return handle, worker


async def test_a_run_the_drain_abandoned_is_still_counted_when_it_settles(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body, found = Held(stubborn=True), JobMetrics(registry=CollectorRegistry())
    handle, worker = counted_worker(driver, clock, body, found)
    await worker.start()
    await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    draining = asyncio.ensure_future(worker.drain())
    await run_clock(clock, 25)
    await until(draining.done)
    body.release.set()
    await until(lambda: worker.stats.completed == 1)
    assert found.jobs_total.labels("default", "ok")._value.get() == 1


async def test_a_run_that_settles_while_the_worker_deregisters_is_counted(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body, found = Held(stubborn=True), JobMetrics(registry=CollectorRegistry())
    handle, worker = counted_worker(driver, clock, body, found)
    deregistered = asyncio.Event()
    remove_worker = driver.introspect.remove_worker

    async def slow_remove(worker_id: str) -> None:
        body.release.set()  # the abandoned run settles while the worker deregisters
        await deregistered.wait()
        await remove_worker(worker_id)

    driver.introspect.remove_worker = slow_remove  # type: ignore[method-assign]
    await worker.start()
    await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    draining = asyncio.ensure_future(worker.drain())
    await run_clock(clock, 25)
    await until(lambda: worker.stats.completed == 1)
    deregistered.set()
    await until(draining.done)
    assert found.jobs_total.labels("default", "ok")._value.get() == 1


async def test_a_row_claimed_as_the_drain_begins_goes_back_without_running(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Held()
    handle = item_job(body.run)
    claim_started = asyncio.Event()
    finish_claim = asyncio.Event()
    original = driver.claim

    async def slow_claim(**kwargs: Any) -> Any:
        claim_started.set()
        await finish_claim.wait()
        return await original(**kwargs)

    driver.claim = slow_claim  # type: ignore[method-assign]
    queued = await handle.enqueue(Item(1))
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    await worker.start()
    await until(claim_started.is_set)
    draining = asyncio.ensure_future(worker.drain())
    await settle()
    finish_claim.set()
    await draining
    assert body.started == []
    drained = await row(driver, queued.id)
    assert (drained.state, drained.attempt) == (JobState.READY, 0)


async def test_a_claim_sent_ahead_as_the_drain_begins_hands_its_rows_back_without_running(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """A full batch sends the next claim before it launches; a drain beginning while that
    claim is out waits for its answer and hands every row of it back."""
    body = Held()
    handle = item_job(body.run)
    queued = [await handle.enqueue(Item(n)) for n in range(4)]
    ahead_sent = asyncio.Event()
    finish_claim = asyncio.Event()
    original = driver.claim
    calls = 0

    async def claim(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:  # the claim the first (full) batch sent ahead
            ahead_sent.set()
            await finish_claim.wait()
        return await original(**kwargs)

    driver.claim = claim  # type: ignore[method-assign]
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], concurrency=4, clock=clock
    )
    await worker.start()
    await until(lambda: ahead_sent.is_set() and len(body.started) == 2)
    draining = asyncio.ensure_future(worker.drain())
    await settle()
    finish_claim.set()
    await draining
    assert body.started == [0, 1]
    for job in queued:
        drained = await row(driver, job.id)
        assert (drained.state, drained.attempt) == (JobState.READY, 0)


async def test_a_manual_stop_aborts_nothing_and_waits_for_the_work_in_hand(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Held()
    handle = item_job(body.run)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    await worker.start()
    queued = await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    stopping = asyncio.ensure_future(worker.stop())
    await run_clock(clock, 3600)  # no budget: an hour later it is still waiting
    assert not stopping.done()
    assert body.reasons == {}
    body.release.set()
    await stopping
    assert (await row(driver, queued.id)).state is JobState.DONE


async def test_a_shutdown_landing_on_a_manual_stop_bounds_the_wait_already_in_flight(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Held(stubborn=True)
    handle = item_job(body.run)
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], clock=clock, drain_deadline=25
    )
    await worker.start()
    await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    stopping = asyncio.ensure_future(worker.stop())
    await run_clock(clock, 100)
    assert not stopping.done()
    shutting = asyncio.ensure_future(shutdown("SIGTERM"))
    await run_clock(clock, 25)
    await until(lambda: stopping.done() and shutting.done())
    body.release.set()


async def test_every_role_stops_taking_work_before_any_waits_out_its_own(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    order: list[str] = []

    async def close_first(budget: float | None) -> None:
        order.append("close-first")

    first = on_shutdown(lambda reason: order.append("accept-first"), close_first)

    async def close_second(budget: float | None) -> None:
        order.append("close-second")

    second = on_shutdown(lambda reason: order.append("accept-second"), close_second)
    try:
        await shutdown("SIGTERM")
    finally:
        first()
        second()
    assert order[:2] == ["accept-first", "accept-second"]
    assert sorted(order[2:]) == ["close-first", "close-second"]


async def test_run_drains_on_sigterm_and_returns(
    driver: MemoryJobDriver, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    froze: list[bool] = []
    monkeypatch.setattr(worker_module, "tune_collector_for_worker", lambda: froze.append(True))
    body = Held()
    handle = item_job(body.run)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    running = asyncio.ensure_future(worker.run())
    queued = await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(running, timeout=10)
    assert isinstance(body.reasons[1], JobDrainedError)
    assert body.reasons[1].meta["signal"] == "SIGTERM"
    assert (await row(driver, queued.id)).state is JobState.READY
    assert froze == [True]  # a process that runs a worker tunes its collector


async def test_one_role_returning_leaves_sigterm_to_the_drain_still_running() -> None:
    """Two roles run in one process, each with the signals installed: the handlers stay until
    the last lets go, so a second SIGTERM never meets the default action (the process killed
    mid-drain) while a role still drains."""
    first, second = install_shutdown_signals(), install_shutdown_signals()
    first()
    first()  # a remover is good once
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    second()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


async def test_run_returns_once_every_role_of_the_process_has_closed(
    driver: MemoryJobDriver, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "tune_collector_for_worker", lambda: None)
    closing, closed = asyncio.Event(), []

    async def slow_close(deadline: Any) -> None:
        closing.set()
        await asyncio.sleep(0.2)
        closed.append(True)

    remove = on_shutdown(lambda reason: None, slow_close)
    try:
        worker = job_worker(driver=driver, context=lambda: None, queues=["q"], clock=clock)
        running = asyncio.ensure_future(worker.run())
        await until(lambda: worker.in_flight == [] and worker._state == "running")
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(running, timeout=10)
        assert closed == [True]
    finally:
        remove()


async def test_the_worker_leaves_the_driver_it_was_handed_open(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    driver.close = close  # type: ignore[method-assign]
    worker = job_worker(driver=driver, context=lambda: None, queues=["q"], clock=clock)
    await worker.start()
    await worker.drain()
    assert closed == []


async def test_a_worker_without_its_own_budget_drains_on_the_processs_lifecycle_deadline(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    body = Held(stubborn=True)
    handle = item_job(body.run)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    await worker.start()
    await handle.enqueue(Item(1))
    await until(lambda: body.started == [1])
    configure_lifecycle(deadline=100)
    try:
        with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
            draining = asyncio.ensure_future(worker.drain())
            await run_clock(clock, 99)
            assert not draining.done()  # not the 25 s default
            await run_clock(clock, 1)
            await until(draining.done)
    finally:
        configure_lifecycle(deadline=DRAIN_DEADLINE_S)
        body.release.set()
    assert [r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.drain-abandoned"]


async def test_a_failing_hook_neither_stops_the_other_roles_nor_goes_unlogged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    accepted: list[str] = []

    def broken_accept(reason: str) -> None:
        raise RuntimeError("accept broke")

    async def broken_close(budget: float | None) -> None:
        raise RuntimeError("close broke")

    async def fine_close(budget: float | None) -> None:
        return None

    removers = [
        on_shutdown(broken_accept, broken_close),
        on_shutdown(accepted.append, fine_close),
    ]
    try:
        with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
            await shutdown("SIGTERM")
    finally:
        for remove in removers:
            remove()
    assert accepted == ["SIGTERM"]
    phases = [
        r.jobs["phase"]  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.lifecycle.hook-failed"
    ]
    assert sorted(phases) == ["accept", "close"]
