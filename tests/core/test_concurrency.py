"""Fleet-wide concurrency: a job's cap held as slots in the driver's lease store."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from support.concurrency import Accounts, Sync, keyed, rows, sync_job
from support.eventually import run_clock, settle, until

from ultimat3.jobs.core import (
    Concurrency,
    ConcurrencyUnenforceableError,
    FrozenClock,
    JobSlotLostError,
    JobState,
    cancel_job,
    job_lease_key,
    job_worker,
)
from ultimat3.jobs.core.memory import MemoryJobDriver


async def test_a_plain_cap_holds_across_every_worker_of_the_fleet(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Accounts()
    handle = sync_job(body.run, concurrency=2)
    workers = [
        job_worker(driver=driver, context=lambda: None, jobs=[handle], concurrency=5, clock=clock)
        for _ in range(2)
    ]
    for worker in workers:
        await worker.start()
    for n in range(6):
        await handle.enqueue(Sync("a", n))
    await run_clock(clock, 5)
    assert body.total_peak == 2
    assert sum(w.stats.handed_back for w in workers) > 0
    waiting = [row for row in await rows(driver) if row.state is JobState.READY]
    assert {row.attempt for row in waiting} == {0}  # a hand-back burns no attempt
    body.release.set()
    await run_clock(clock, 5)
    for worker in workers:
        await worker.stop()
    assert [row.state for row in await rows(driver)] == [JobState.DONE] * 6
    assert body.total_peak == 2


async def test_a_keyed_cap_under_wait_runs_one_per_key_and_keys_in_parallel(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Accounts()
    handle = sync_job(body.run, concurrency=keyed("wait"))
    async with job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock):
        for account in ("a", "b"):
            for n in range(2):
                await handle.enqueue(Sync(account, n))
        await run_clock(clock, 2)
        assert sorted(account for account, _ in body.started) == ["a", "b"]
        body.release.set()
        await run_clock(clock, 2)
    assert body.peak == Counter({"a": 1, "b": 1})
    assert [row.state for row in await rows(driver)] == [JobState.DONE] * 4


async def test_a_run_gives_its_key_back_when_its_body_ends_not_after_its_settle(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """Runs of one key one after another never overlap, so under ``fail`` none is refused, however
    long the previous run's settle and ``on_settled`` hook take: the key goes back with the body,
    before the worker slot whose ring brings the next claim."""
    hooks, ran = asyncio.Event(), []

    async def slow_hook(settled: Any) -> None:
        await hooks.wait()  # every hook still running while the next run is claimed

    async def body(*, input: Sync) -> None:
        ran.append(input.n)

    handle = sync_job(body, concurrency=keyed("fail"), on_settled=slow_hook)
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], concurrency=1, clock=clock
    )
    async with worker:
        try:
            for n in range(3):
                await handle.enqueue(Sync("a", n))
            await until(lambda: len(ran) == 3)
        finally:
            hooks.set()
    assert (ran, worker.stats.refused) == ([0, 1, 2], 0)
    assert [row.state for row in await rows(driver)] == [JobState.DONE] * 3


async def test_a_keyed_cap_under_fail_refuses_a_run_another_run_holds_the_key_for(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Accounts()
    told: list[tuple[str, str | None]] = []

    async def on_settled(settled: Any) -> None:
        told.append((settled.outcome, settled.code))

    handle = sync_job(body.run, concurrency=keyed("fail"), on_settled=on_settled)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    async with worker:
        await handle.enqueue(Sync("a", 0))
        await until(lambda: len(body.started) == 1)
        second = await handle.enqueue(Sync("a", 1))
        await until(lambda: worker.stats.refused == 1)
        body.release.set()
    refused = next(row for row in await rows(driver) if row.id == second.id)
    assert (refused.state, refused.attempt) == (JobState.FAILED, 0)
    assert (refused.last_error or "").startswith("X_JOB_KEY_BUSY")
    assert told == [("refused", "X_JOB_KEY_BUSY"), ("completed", None)]
    assert body.started == [("a", 0)]


async def test_a_run_is_never_refused_by_its_own_earlier_claim(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Accounts()
    body.release.set()
    handle = sync_job(body.run, concurrency=keyed("fail"))
    queued = await handle.enqueue(Sync("a"))
    # A previous claim of this very row still holds the key (its worker died holding it).
    key = job_lease_key(handle.name, "a")
    assert driver.leases is not None
    await driver.leases.acquire(key, f"{queued.id}:an-earlier-claim", limit=1, ttl=30)
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    async with worker:
        await settle()
        assert worker.stats.refused == 0
        assert worker.stats.handed_back >= 1
        await run_clock(clock, 31)  # the leftover lapses; the run takes the key
        await until(lambda: body.started == [("a", 0)])
    assert worker.stats.refused == 0


async def test_a_key_busy_at_the_acquire_but_free_a_moment_later_waits_a_poll(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Accounts()
    body.release.set()
    handle = sync_job(body.run, concurrency=keyed("fail"))
    assert driver.leases is not None
    acquire = driver.leases.acquire
    busy_once = iter([True])

    async def racing_acquire(key: str, holder: str, *, limit: int, ttl: float) -> bool:
        if next(busy_once, False):
            return False  # the holder released between this acquire and the holders() read
        return await acquire(key, holder, limit=limit, ttl=ttl)

    driver.leases.acquire = racing_acquire  # type: ignore[method-assign]
    await handle.enqueue(Sync("a"))
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    async with worker:
        await run_clock(clock, 1)
        await until(lambda: body.started == [("a", 0)])
    assert (worker.stats.refused, worker.stats.handed_back) == (0, 1)


async def test_a_key_that_raises_at_claim_fails_the_attempt_without_running_the_body(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Accounts()
    broken: set[str] = set()

    def key(value: Sync) -> str:
        if value.account in broken:
            raise LookupError("account table unreachable")
        return value.account

    handle = sync_job(body.run, concurrency=Concurrency(key=key, limit=1))
    queued = await handle.enqueue(Sync("a"))
    broken.add("a")
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    async with worker:
        await until(lambda: worker.stats.retried == 1)
    (row,) = await rows(driver)
    assert row.id == queued.id
    assert (row.state, row.attempt) == (JobState.READY, 1)  # the ordinary retry path
    assert "account table unreachable" in (row.last_error or "")
    assert body.started == []


async def test_a_held_slot_is_renewed_with_the_lease_and_released_when_the_run_ends(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Accounts()
    handle = sync_job(body.run, concurrency=keyed("wait"))
    key = job_lease_key(handle.name, "a")
    assert driver.leases is not None
    async with job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock):
        queued = await handle.enqueue(Sync("a"))
        await until(lambda: len(body.started) == 1)
        await run_clock(clock, 300)  # ten visibility timeouts
        (holder,) = await driver.leases.holders(key)
        assert holder.startswith(f"{queued.id}:")
        body.release.set()
        await until(lambda: body.active["a"] == 0)
        await settle()
        assert await driver.leases.holders(key) == []


async def test_a_slot_taken_by_another_run_aborts_with_x_job_slot_lost(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    body = Accounts()
    handle = sync_job(body.run, concurrency=keyed("wait"))
    key = job_lease_key(handle.name, "a")
    leases = driver.leases
    assert leases is not None
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    async with worker:
        await handle.enqueue(Sync("a"))
        await until(lambda: len(body.started) == 1)
        (mine,) = await leases.holders(key)
        await leases.release(key, mine)
        await leases.acquire(key, "someone-else", limit=1, ttl=300)
        with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
            await run_clock(clock, 10)
            await until(lambda: len(body.reasons) == 1)
        assert isinstance(body.reasons[0], JobSlotLostError)
        assert body.reasons[0].code == "X_JOB_SLOT_LOST"
        assert [r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.slot-lost"]
        await until(lambda: worker.stats.retried == 1)
        await leases.release(key, "someone-else")
        body.release.set()
        await run_clock(clock, 5)


async def test_a_slot_whose_holder_was_killed_frees_itself_after_its_ttl(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Accounts()
    body.release.set()
    handle = sync_job(body.run, concurrency=keyed("wait"))
    assert driver.leases is not None
    await driver.leases.acquire(job_lease_key(handle.name, "a"), "killed", limit=1, ttl=30)
    await handle.enqueue(Sync("a"))
    async with job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock):
        await run_clock(clock, 29)
        assert body.started == []
        await run_clock(clock, 2)
        await until(lambda: body.started == [("a", 0)])


class NoLeases:
    """A driver without a lease store."""

    def __init__(self, driver: MemoryJobDriver) -> None:
        self.inner = driver

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def leases(self) -> None:
        return None


async def test_a_worker_serving_a_capped_job_refuses_to_start_without_a_lease_store(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def capped(*, input: Sync) -> None:
        return None

    handle = sync_job(capped, concurrency=1, queue="capped-queue")
    worker = job_worker(
        driver=NoLeases(driver),  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        clock=clock,
    )
    with pytest.raises(ConcurrencyUnenforceableError) as raised:
        await worker.start()
    assert raised.value.code == "X_JOB_CONCURRENCY_UNENFORCEABLE"


async def test_a_capped_row_enqueued_on_another_queue_never_runs_uncapped_without_a_lease_store(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    ran: list[int] = []

    async def capped(*, input: Sync) -> None:
        ran.append(1)

    handle = sync_job(capped, concurrency=1, queue="capped-home")
    queued = await handle.enqueue(Sync("a", 0), queue="elsewhere")
    # The worker serves a queue the declaration does not name, so its boot check passes.
    worker = job_worker(
        driver=NoLeases(driver),  # type: ignore[arg-type]
        context=lambda: None,
        queues=["elsewhere"],
        jobs=[handle],
        clock=clock,
    )
    async with worker:
        await until(lambda: worker.stats.dead == 1)
    assert ran == []
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.DEAD
    assert "X_JOB_CONCURRENCY_UNENFORCEABLE" in (detail.row.last_error or "")


async def test_a_resumed_run_takes_its_key_again_and_a_holder_meanwhile_refuses_it(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    ran: list[str] = []

    async def sleeper(*, input: Sync, step: Any) -> None:
        ran.append(f"{input.account}:{input.n}")
        if input.n == 0:
            await step.sleep("wait", timedelta(seconds=60))

    handle = sync_job(sleeper, concurrency=keyed("fail"))
    assert driver.leases is not None
    worker = job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock)
    async with worker:
        await handle.enqueue(Sync("a", 0))
        await until(lambda: worker.stats.suspended == 1)
        # While it sleeps, another run holds the key.
        await driver.leases.acquire(job_lease_key(handle.name, "a"), "other", limit=1, ttl=300)
        await run_clock(clock, 61)
        await until(lambda: worker.stats.refused == 1)
    assert ran == ["a:0"]


class SlowSlotRenewals:
    """The memory lease store with ``renew`` answering only when told: a slow network."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.answer = asyncio.Event()
        self.on_the_wire = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def renew(self, key: str, holder: str, *, ttl: float) -> bool:
        self.on_the_wire.set()
        await self.answer.wait()
        return bool(await self.inner.renew(key, holder, ttl=ttl))


def keyed_on(driver: MemoryJobDriver, store: SlowSlotRenewals) -> tuple[Accounts, Any, str]:
    """A job keyed by account under ``when_busy='fail'``, on a driver whose lease store is
    ``store``; its body, its handle and the lease key of account acme."""
    body = Accounts()
    handle = sync_job(body.run, concurrency=keyed("fail"))
    driver._leases = store  # type: ignore[assignment]
    return body, handle, job_lease_key(handle.name, "acme")


async def renewal_on_the_wire(
    body: Accounts, handle: Any, store: SlowSlotRenewals, clock: FrozenClock
) -> None:
    """A run of acme going, with its slot's renewal sent and hanging."""
    await handle.enqueue(Sync("acme", 1))
    await until(lambda: body.started != [])
    await run_clock(clock, 10)
    await until(store.on_the_wire.is_set)


async def test_a_slot_renewal_answering_after_the_run_ended_leaves_no_ghost_holder(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    slow = SlowSlotRenewals(driver.leases)
    body, handle, key = keyed_on(driver, slow)
    async with job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock):
        await renewal_on_the_wire(body, handle, slow, clock)
        body.release.set()  # the run ends and hands its slot back
        await until(lambda: body.active["acme"] == 0)
        await settle()
        slow.answer.set()  # the late renewal answers: refused, the holder is gone
        await settle()
        assert await driver.leases.holders(key) == []
        await handle.enqueue(Sync("acme", 2))
        await until(lambda: len(body.started) == 2)
    assert [row.state for row in await rows(driver)] == [JobState.DONE, JobState.DONE]


class SlowReleases(SlowSlotRenewals):
    """``SlowSlotRenewals`` whose ``release`` is applied at once but answers only when told."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.released = asyncio.Event()
        self.release_answer = asyncio.Event()

    async def release(self, key: str, holder: str) -> None:
        await self.inner.release(key, holder)
        self.released.set()
        await self.release_answer.wait()


async def test_a_slot_renewal_answering_while_the_release_is_on_its_way_takes_no_slot(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """The renewal finds the holder gone (the release landed) before the release's answer came:
    the run is over all the same, and its slot is not taken again."""
    slow = SlowReleases(driver.leases)
    body, handle, key = keyed_on(driver, slow)
    async with job_worker(driver=driver, context=lambda: None, jobs=[handle], clock=clock):
        await renewal_on_the_wire(body, handle, slow, clock)
        body.release.set()  # the run ends; its release lands, and its answer hangs
        await until(slow.released.is_set)
        slow.answer.set()  # the renewal answers: refused, the holder is gone
        await settle()
        slow.release_answer.set()
        await settle()
        assert await slow.inner.holders(key) == []
        await handle.enqueue(Sync("acme", 2))
        await until(lambda: len(body.started) == 2)
    assert [row.state for row in await rows(driver)] == [JobState.DONE, JobState.DONE]


async def test_a_cancelled_run_whose_body_ignores_it_gives_its_key_back_at_its_deadline(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """The cancel aborts the attempt first; the body swallows every cancel. Its timeout still
    ends the attempt at the deadline: the run leaves the worker and its key is free."""
    release = asyncio.Event()

    async def deaf(*, input: Sync) -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    handle = sync_job(deaf, timeout="5s", concurrency=keyed("fail"))
    key = job_lease_key(handle.name, "acme")
    assert driver.leases is not None
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], clock=clock, visibility_timeout=3
    )
    async with worker:
        try:
            queued = await handle.enqueue(Sync("acme", 1))
            await until(lambda: worker.in_flight == [queued.id])
            await cancel_job(driver, queued.id)
            await run_clock(clock, 1)  # the heartbeat finds the row cancelled
            await run_clock(clock, 4)  # the deadline
            for _ in range(300):
                if not worker.in_flight:
                    break
                await asyncio.sleep(0.01)
            assert worker.in_flight == []
            assert await driver.leases.holders(key) == []
        finally:
            release.set()
