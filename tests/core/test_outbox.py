"""The transactional outbox: staging inside a transaction, and the relay that publishes after it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from support.eventually import run_clock, settle, until

from ultimat3.jobs.core import (
    OUTBOX_WAKE,
    AckOptions,
    Enqueued,
    EnqueueRequest,
    FrozenClock,
    InvariantError,
    JobFilter,
    JobState,
    OutboxNoTxError,
    job,
    job_worker,
    jobs_facade,
    memory_outbox_store,
    outbox_jobs_facade,
    outbox_relay,
    set_jobs_facade,
    shutdown,
)
from ultimat3.jobs.core.memory import MemoryJobDriver, MemoryOutboxStore
from ultimat3.jobs.core.wake import signal_wake_lost


@dataclass
class Invoice:
    n: int


ran: list[int] = []


@job(input=Invoice, idempotency_key=lambda i: f"invoice:{i.n}", tenant="none", queue="billing")
async def bill(*, input: Invoice) -> None:
    ran.append(input.n)


@pytest.fixture
def store(clock: FrozenClock) -> MemoryOutboxStore:
    return memory_outbox_store(clock=clock)


@pytest.fixture
def installed(driver: MemoryJobDriver, store: MemoryOutboxStore) -> MemoryOutboxStore:
    """The outbox facade installed over the memory store's transactions."""
    ran.clear()
    set_jobs_facade(outbox_jobs_facade(store=store, driver=driver, current_tx=store.current_tx))
    return store


async def job_rows(driver: MemoryJobDriver) -> list[Any]:
    page = await driver.introspect.list(JobFilter(queue="billing", limit=200))
    return sorted(page.rows, key=lambda row: row.idempotency_key)


def relay_of(store: MemoryOutboxStore, driver: Any, clock: FrozenClock, **options: Any) -> Any:
    return outbox_relay(store=store, driver=driver, clock=clock, drain_on_shutdown=False, **options)


# -- the facade ---------------------------------------------------------------------------------


async def test_a_staged_enqueue_answers_the_ids_of_the_job_it_will_become(
    driver: MemoryJobDriver, clock: FrozenClock, installed: MemoryOutboxStore
) -> None:
    async with installed.transaction():
        queued = await bill.enqueue(Invoice(1))
    assert (queued.id, queued.run_id, queued.deduped) != ("", "", True)
    assert await job_rows(driver) == []
    await relay_of(installed, driver, clock).run_once()
    (row,) = await job_rows(driver)
    assert (row.id, row.run_id) == (queued.id, queued.run_id)


async def test_an_enqueue_in_a_transaction_that_rolls_back_never_becomes_a_job(
    driver: MemoryJobDriver, clock: FrozenClock, installed: MemoryOutboxStore
) -> None:

    async def checkout() -> None:
        async with installed.transaction():
            await bill.enqueue(Invoice(1))
            raise RuntimeError("the order insert failed")

    with pytest.raises(RuntimeError):
        await checkout()
    assert installed.retained() == []
    assert await relay_of(installed, driver, clock).run_once() == 0
    assert await job_rows(driver) == []


async def test_outside_a_transaction_the_enqueue_publishes_directly(
    driver: MemoryJobDriver, installed: MemoryOutboxStore
) -> None:
    queued = await bill.enqueue(Invoice(1))
    (row,) = await job_rows(driver)
    assert row.id == queued.id
    assert installed.retained() == []


async def test_the_facade_answers_the_transaction_an_enqueue_would_join(
    installed: MemoryOutboxStore,
) -> None:
    assert jobs_facade().current_tx() is None
    async with installed.transaction() as tx:
        assert jobs_facade().current_tx() is tx


def test_the_fallback_facade_joins_no_transaction() -> None:
    set_jobs_facade(None)
    assert jobs_facade().current_tx() is None


async def test_a_required_outbox_refuses_an_enqueue_outside_a_transaction(
    driver: MemoryJobDriver, store: MemoryOutboxStore
) -> None:
    set_jobs_facade(
        outbox_jobs_facade(store=store, driver=driver, current_tx=store.current_tx, mode="required")
    )
    with pytest.raises(OutboxNoTxError) as raised:
        await bill.enqueue(Invoice(1))
    assert raised.value.code == "X_OUTBOX_NO_TX"
    async with store.transaction():
        await bill.enqueue(Invoice(2))
    assert len(store.retained()) == 1


def test_an_unknown_mode_is_refused(driver: MemoryJobDriver, store: MemoryOutboxStore) -> None:
    with pytest.raises(InvariantError):
        outbox_jobs_facade(store=store, driver=driver, current_tx=store.current_tx, mode="maybe")  # type: ignore[arg-type]


# -- the store ----------------------------------------------------------------------------------


def request(n: int) -> EnqueueRequest:
    return bill.request(Invoice(n))


async def test_a_claim_hands_out_rows_in_staged_order(
    store: MemoryOutboxStore, clock: FrozenClock
) -> None:
    staged = []
    for n in range(5):
        staged.append(request(n))
        await store.stage(staged[-1])
        clock.advance(0.001 if n % 2 else 0)
    claimed = await store.claim(claimant="r1", limit=3, lease=30)
    assert [r.request.id for r in claimed] == [s.id for s in staged[:3]]
    assert {r.claimed_by for r in claimed} == {"r1"}


async def test_a_claimed_row_is_nobody_elses_until_its_lease_lapses(
    store: MemoryOutboxStore, clock: FrozenClock
) -> None:
    await store.stage(request(1))
    assert len(await store.claim(claimant="r1", limit=10, lease=30)) == 1
    assert await store.claim(claimant="r2", limit=10, lease=30) == []
    clock.advance(30)
    assert [r.claimed_by for r in await store.claim(claimant="r2", limit=10, lease=30)] == ["r2"]


async def test_rows_staged_after_another_relays_live_batch_wait_for_it(
    store: MemoryOutboxStore, clock: FrozenClock
) -> None:
    """create_invoice then charge_card: while one relay holds the invoice (publishing it, or
    stuck after a failed publish it could not hand back), no relay takes the charge."""
    invoice, charge = request(1), request(2)
    await store.stage(invoice)
    clock.advance(0.001)
    await store.stage(charge)
    assert [r.request.id for r in await store.claim(claimant="r1", limit=1, lease=30)] == [
        invoice.id
    ]
    assert await store.claim(claimant="r2", limit=10, lease=30) == []
    clock.advance(31)  # r1's claim lapsed: the invoice goes first again
    taken = await store.claim(claimant="r2", limit=10, lease=30)
    assert [r.request.id for r in taken] == [invoice.id, charge.id]


async def test_release_and_mark_published_move_only_the_claimants_rows(
    store: MemoryOutboxStore, clock: FrozenClock
) -> None:
    staged = request(1)
    await store.stage(staged)
    await store.claim(claimant="stalled", limit=10, lease=30)
    clock.advance(31)
    await store.claim(claimant="current", limit=10, lease=30)
    assert await store.release([staged.id], claimant="stalled") == 0
    assert await store.mark_published([staged.id], claimant="stalled") == 0
    assert [r.claimed_by for r in store.retained()] == ["current"]
    assert await store.mark_published([staged.id], claimant="current") == 1
    assert store.retained() == []


# -- the relay ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, "0s", "-5s", "soon", float("nan"), 1e-9, 0.0009])
def test_a_claim_lease_that_is_not_a_positive_duration_of_a_millisecond_or_more_is_refused(
    driver: MemoryJobDriver, store: MemoryOutboxStore, bad: Any
) -> None:
    with pytest.raises(InvariantError) as raised:
        outbox_relay(store=store, driver=driver, claim_lease=bad)
    assert raised.value.code == "X_INVARIANT"


@pytest.mark.parametrize("lease", [30, 30.0, "30s", timedelta(seconds=30), 0.001])
def test_a_claim_lease_is_any_duration(
    driver: MemoryJobDriver, store: MemoryOutboxStore, lease: Any
) -> None:
    outbox_relay(store=store, driver=driver, claim_lease=lease)


async def test_the_relay_publishes_in_staged_order_and_wakes_this_processs_worker(
    driver: MemoryJobDriver, clock: FrozenClock, installed: MemoryOutboxStore
) -> None:
    async with installed.transaction():
        for n in range(3):
            await bill.enqueue(Invoice(n))
    relay = relay_of(installed, driver, clock)
    async with job_worker(
        driver=driver, context=lambda: None, jobs=[bill], concurrency=1, clock=clock
    ):
        await settle()
        relay.start()
        await until(lambda: ran == [0, 1, 2])
        await relay.stop()
    assert installed.retained() == []


class FlakyDriver:
    """The memory driver, whose ``enqueue_many`` can be made to fail or to hang."""

    def __init__(self, driver: MemoryJobDriver) -> None:
        self.inner = driver
        self.fail = 0
        self.gate: asyncio.Event | None = None
        self.published: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("pool blip")
        gate = self.gate
        if gate is not None:
            await gate.wait()
        self.published.append([r.id for r in requests])
        return await self.inner.enqueue_many(requests)


async def test_a_failed_publish_stops_the_batch_and_hands_it_back_at_once(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    staged = [request(n) for n in range(3)]
    for item in staged:
        await store.stage(item)
    flaky = FlakyDriver(driver)
    flaky.fail = 1
    relay = relay_of(store, flaky, clock)
    with pytest.raises(ConnectionError):
        await relay.run_once()
    assert [r.claimed_by for r in store.retained()] == [None, None, None]
    assert await relay.run_once() == 3  # the next pass, not a lease window later
    assert flaky.published == [[s.id for s in staged]]


async def test_a_crash_between_publish_and_retire_republishes_into_the_same_job(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    staged = request(1)
    await store.stage(staged)
    first = relay_of(store, driver, clock)
    original = store.mark_published

    async def crash(ids: Sequence[str], *, claimant: str) -> int:
        raise SystemExit("the relay process died here")

    store.mark_published = crash  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        await first.run_once()
    store.mark_published = original  # type: ignore[method-assign]
    # The job ran and finished before the row comes round again.
    claimed = await driver.claim(worker_id="w", slots={"billing": 1}, visibility_timeout=30)
    await driver.ack(claimed.jobs[0].id, _ack(claimed.jobs[0]))
    clock.advance(30)
    assert await relay_of(store, driver, clock).run_once() == 1
    rows = await job_rows(driver)
    assert [(row.id, row.state) for row in rows] == [(staged.id, JobState.DONE)]
    assert store.retained() == []


@pytest.mark.parametrize("lost", ["release", "mark_published"])
async def test_a_batch_a_pass_left_claimed_is_taken_by_the_next_pass_not_a_lease_later(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore, lost: str
) -> None:
    """The hand-back or the retirement failed (the connection died under it): the batch is still
    claimed, by this relay, and its next pass takes it again, the rows staged after it too."""
    first = request(1)
    await store.stage(first)
    original = getattr(store, lost)

    async def connection_lost(ids: Sequence[str], *, claimant: str) -> int:
        setattr(store, lost, original)
        raise ConnectionError("the connection died")

    setattr(store, lost, connection_lost)
    flaky = FlakyDriver(driver)
    flaky.fail = 1 if lost == "release" else 0
    relay = relay_of(store, flaky, clock)
    with pytest.raises(ConnectionError):
        await relay.run_once()
    assert [r.claimed_by for r in store.retained()] == [relay.id]
    later = request(2)
    await store.stage(later)
    assert await relay.run_once() == 2
    assert store.retained() == []
    assert sorted(r.id for r in await job_rows(driver)) == sorted([first.id, later.id])


def _ack(claimed: Any) -> AckOptions:
    return AckOptions(claimed.claim.worker_id, claimed.claim.claim)


async def test_two_relays_never_hold_one_batch(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    for n in range(3):
        await store.stage(request(n))
    slow = FlakyDriver(driver)
    slow.gate = asyncio.Event()
    first = relay_of(store, slow, clock)
    publishing = asyncio.ensure_future(first.run_once())
    await settle()
    assert await relay_of(store, driver, clock).run_once() == 0
    slow.gate.set()
    assert await publishing == 3
    assert len(await job_rows(driver)) == 3


async def test_a_relay_that_stalls_past_its_lease_retires_nothing_another_relay_reclaimed(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    staged = request(1)
    await store.stage(staged)
    stalled_driver = FlakyDriver(driver)
    stalled_driver.gate = asyncio.Event()
    stalled = relay_of(store, stalled_driver, clock, claim_lease=30)
    stalled_pass = asyncio.ensure_future(stalled.run_once())
    await settle()
    clock.advance(31)  # its lease lapses mid-publish
    current_driver = FlakyDriver(driver)
    current_driver.gate = asyncio.Event()
    current = relay_of(store, current_driver, clock)
    current_pass = asyncio.ensure_future(current.run_once())
    await settle()
    # The stalled relay wakes while the current one is mid-publish on the same row.
    stalled_driver.gate.set()
    await stalled_pass
    (row,) = store.retained()
    assert row.claimed_by is not None
    assert row.claimed_by.startswith(current.id)
    current_driver.gate.set()
    await current_pass
    assert store.retained() == []
    assert [r.id for r in await job_rows(driver)] == [staged.id]


async def test_a_pass_that_throws_is_logged_and_the_loop_rearms(
    driver: MemoryJobDriver,
    clock: FrozenClock,
    store: MemoryOutboxStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await store.stage(request(1))
    flaky = FlakyDriver(driver)
    flaky.fail = 1
    relay = relay_of(store, flaky, clock)
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        relay.start()
        await settle()
        await run_clock(clock, 0.2)
        await until(lambda: store.retained() == [])
        await relay.stop()
    assert [r for r in caplog.records if getattr(r, "event", "") == "jobs.outbox.tick-failed"]


def claim_times(store: MemoryOutboxStore, clock: FrozenClock) -> list[datetime]:
    """When each of ``store``'s claims was made, from now on (the list fills as they come)."""
    claims: list[datetime] = []
    original = store.claim

    async def spy(**kwargs: Any) -> Any:
        claims.append(clock.now())
        return await original(**kwargs)

    store.claim = spy  # type: ignore[method-assign]
    return claims


async def test_idle_the_relay_backs_off_from_its_interval_to_the_ceiling(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    claims = claim_times(store, clock)
    start = clock.now()
    relay = relay_of(store, driver, clock)
    relay.start()
    await run_clock(clock, 8)
    await relay.stop()
    offsets = [round((at - start).total_seconds(), 3) for at in claims]
    assert offsets == [0, 0.2, 0.6, 1.4, 3.0, 5.0, 7.0]


class StubWake:
    """A cross-process wake a test rings by hand."""

    def __init__(self, live: bool = True, *, hears_outbox: bool = True) -> None:
        self.live = live
        self.hears_outbox = hears_outbox
        self.listeners: list[Any] = []

    def subscribe(self, listener: Any) -> Any:
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener)

    def ring(self, name: str) -> None:
        for listener in list(self.listeners):
            listener(name)

    def lose(self) -> None:
        """What a driver's wake does when its session dies."""
        self.live = False
        signal_wake_lost(self)

    async def close(self) -> None:
        return None


async def test_an_outbox_wake_brings_a_pass_at_once_and_a_queue_name_does_not(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    wake = StubWake()
    relay = relay_of(store, driver, clock, wake=wake)
    relay.start()
    await run_clock(clock, 30)  # idle at its ceiling now: 5 s apart, the wake being live
    await store.stage(request(1))
    wake.ring("billing")
    await settle()
    assert store.retained() != []
    wake.ring(OUTBOX_WAKE)
    await until(lambda: store.retained() == [])
    await relay.stop()
    assert wake.listeners == []


async def test_a_live_wake_raises_the_relays_idle_ceiling_to_five_seconds(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    claims = claim_times(store, clock)
    start = clock.now()
    relay = relay_of(store, driver, clock, wake=StubWake(live=True))
    relay.start()
    await run_clock(clock, 16)
    await relay.stop()
    offsets = [round((at - start).total_seconds(), 3) for at in claims]
    assert offsets == [0, 0.2, 0.6, 1.4, 3.0, 6.2, 11.2]


async def test_a_live_wake_that_never_hears_the_outbox_leaves_the_two_second_ceiling(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    """A Redis wake is proven on the job queues' channel; staged rows are announced in Postgres,
    where it does not listen, so its word promises nothing about them."""
    claims = claim_times(store, clock)
    start = clock.now()
    relay = relay_of(store, driver, clock, wake=StubWake(live=True, hears_outbox=False))
    relay.start()
    await run_clock(clock, 10)
    await relay.stop()
    offsets = [round((at - start).total_seconds(), 3) for at in claims]
    assert offsets == [0, 0.2, 0.6, 1.4, 3.0, 5.0, 7.0, 9.0]


async def test_a_lost_wake_brings_a_pass_at_once_then_the_two_second_ceiling(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    """Idle on a live wake's word, the relay waits 5 s; once the wake loses its session, rows
    staged meanwhile were announced to nobody, so the relay passes at once and then polls every
    2 s. Another wake's loss is not this relay's."""
    claims = claim_times(store, clock)
    start = clock.now()
    wake = StubWake(live=True)
    relay = relay_of(store, driver, clock, wake=wake)
    relay.start()
    await run_clock(clock, 12)  # passes at 0, .2, .6, 1.4, 3, 6.2, 11.2; the next at 16.2
    StubWake(live=True).lose()
    await settle()
    wake.lose()
    await run_clock(clock, 6)
    await relay.stop()
    offsets = [round((at - start).total_seconds(), 3) for at in claims]
    assert offsets == [0, 0.2, 0.6, 1.4, 3.0, 6.2, 11.2, 12, 14, 16, 18]


async def test_a_full_batch_is_followed_by_another_pass_at_once(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    for n in range(5):
        await store.stage(request(n))
    relay = relay_of(store, driver, clock, batch=2)
    relay.start()
    await until(lambda: store.retained() == [])  # no clock movement needed
    await relay.stop()


async def test_a_started_relay_drains_with_the_process(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    await store.stage(request(1))
    slow = FlakyDriver(driver)
    slow.gate = asyncio.Event()
    relay = outbox_relay(store=store, driver=slow, clock=clock)
    relay.start()
    await settle()
    shutting = asyncio.ensure_future(shutdown("SIGTERM"))
    await settle()
    assert not shutting.done()  # the close phase joins the publish in flight
    slow.gate.set()
    await shutting
    assert store.retained() == []
    await store.stage(request(2))
    await run_clock(clock, 60)
    assert len(store.retained()) == 1  # it polls no more


async def test_stop_joins_the_pass_in_flight(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    await store.stage(request(1))
    slow = FlakyDriver(driver)
    slow.gate = asyncio.Event()
    relay = relay_of(store, slow, clock)
    relay.start()
    await settle()
    stopping = asyncio.ensure_future(relay.stop())
    await run_clock(clock, 3600)
    assert not stopping.done()
    slow.gate.set()
    await stopping
    assert store.retained() == []  # the publish and its retire both happened


async def test_a_deadline_bound_late_cuts_the_wait_short_and_the_earliest_wins(
    driver: MemoryJobDriver,
    clock: FrozenClock,
    store: MemoryOutboxStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await store.stage(request(1))
    slow = FlakyDriver(driver)
    slow.gate = asyncio.Event()
    relay = relay_of(store, slow, clock)
    relay.start()
    await settle()
    manual = asyncio.ensure_future(relay.stop())
    await run_clock(clock, 10)
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        bounded = asyncio.ensure_future(relay.stop(clock.now() + timedelta(seconds=5)))
        later = asyncio.ensure_future(relay.stop(clock.now() + timedelta(seconds=60)))
        await run_clock(clock, 5)
        await until(lambda: manual.done() and bounded.done() and later.done())
    abandoned = [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.outbox.drain-abandoned"
    ]
    assert len(abandoned) == 1
    slow.gate.set()


async def test_a_relay_whose_passes_keep_failing_backs_off_like_an_idle_one(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    await store.stage(request(1))
    flaky = FlakyDriver(driver)
    flaky.fail = 10_000
    relay = relay_of(store, flaky, clock)
    relay.start()
    await run_clock(clock, 60)
    await relay.stop()
    tries = 10_000 - flaky.fail
    assert tries < 40  # backing off to the idle ceiling, not one try every 200 ms (300 a minute)


async def test_a_publish_deduped_then_not_retired_is_not_published_again(
    driver: MemoryJobDriver, clock: FrozenClock, store: MemoryOutboxStore
) -> None:
    """The staged job met a live job holding its key: nothing was inserted under its id. Its
    retirement failed, and by the time the batch came round again the live job had finished:
    a second publish would have inserted a row, and run the work twice."""
    live = await driver.enqueue(request(1))
    staged = request(1)
    await store.stage(staged)
    original = store.mark_published

    async def blip(ids: Sequence[str], *, claimant: str) -> int:
        store.mark_published = original  # type: ignore[method-assign]
        raise ConnectionError("the connection died")

    store.mark_published = blip  # type: ignore[method-assign]
    relay = relay_of(store, driver, clock)
    with pytest.raises(ConnectionError):
        await relay.run_once()
    claimed = await driver.claim(worker_id="w", slots={"billing": 1}, visibility_timeout=30)
    assert [job.id for job in claimed.jobs] == [live.id]
    await driver.ack(live.id, _ack(claimed.jobs[0]))
    assert await relay.run_once() == 1
    assert store.retained() == []
    assert [(row.id, row.state) for row in await job_rows(driver)] == [(live.id, JobState.DONE)]
