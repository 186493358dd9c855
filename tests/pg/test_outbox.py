"""The transactional outbox on Postgres, with real transactions and the core relay: a job commits
or rolls back with the business rows written beside it, and each committed one runs once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from psycopg import AsyncConnection

from ultimat3.jobs.core import (
    Enqueued,
    EnqueueRequest,
    FrozenClock,
    JobContext,
    JobFilter,
    JobState,
    execute_job,
    job,
    outbox_jobs_facade,
    outbox_relay,
    reset_job_driver,
    set_job_driver,
    set_jobs_facade,
)
from ultimat3.jobs.core.errors import OutboxNoTxError
from ultimat3.jobs.core.model import OutboxRecord
from ultimat3.jobs.core.outbox import OutboxRelay
from ultimat3.jobs.pg import PostgresJobDriver, postgres_job_driver, start_queue_wake
from ultimat3.jobs.pg.outbox import PostgresOutboxStore, postgres_outbox_store
from ultimat3.jobs.pg.transaction import current_tx, jobs_transaction

pytestmark = pytest.mark.pg

LEASE_S = 30


@dataclass
class Invoice:
    number: str


@job(
    input=Invoice,
    idempotency_key=lambda i: f"invoice:{i.number}",
    tenant="none",
    queue="invoices",
)
async def send_invoice(*, input: Invoice, ctx: JobContext[list[str]]) -> None:
    ctx.services.append(input.number)


class AbandonedError(Exception):
    """The application gave up on its transaction."""


class RelayDiedError(Exception):
    """The relay's process ended here."""


class DiesBeforeMarking(PostgresOutboxStore):
    """The store as seen by a relay whose process dies after publishing, before marking."""

    async def mark_published(self, ids: Sequence[str], *, claimant: str) -> int:
        raise RelayDiedError()


@pytest.fixture
def store(driver: PostgresJobDriver, clock: FrozenClock) -> PostgresOutboxStore:
    return postgres_outbox_store(executor=driver.executor, clock=clock)


@pytest.fixture(autouse=True)
def outbox_installed(driver: PostgresJobDriver, store: PostgresOutboxStore) -> Iterator[None]:
    set_job_driver(driver)
    set_jobs_facade(outbox_jobs_facade(store=store, driver=driver, current_tx=current_tx))
    yield
    reset_job_driver()


@pytest.fixture
async def app(pg_url: str) -> AsyncIterator[AsyncConnection[Any]]:
    """The application's own connection, and its business table beside the jobs tables."""
    async with await AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("create table invoices (number text primary key)")
        yield conn


@pytest.fixture
async def other_process(pg_url: str, clock: FrozenClock) -> AsyncIterator[PostgresJobDriver]:
    """A driver over a pool of its own: another relay process on the same database."""
    driver = postgres_job_driver(pg_url, clock=clock)
    yield driver
    await driver.close()


def relay_of(
    store: PostgresOutboxStore, driver: PostgresJobDriver, clock: FrozenClock, batch: int = 100
) -> OutboxRelay:
    return outbox_relay(
        store=store,
        driver=driver,
        clock=clock,
        claim_lease=LEASE_S,
        batch=batch,
        drain_on_shutdown=False,
    )


def relay_in(process: PostgresJobDriver, clock: FrozenClock) -> OutboxRelay:
    """A relay of another process: a store and driver over that process's own pool."""
    return relay_of(postgres_outbox_store(executor=process.executor, clock=clock), process, clock)


async def invoice(app: AsyncConnection[Any], number: str) -> Enqueued:
    """Write an invoice and enqueue its email in one transaction, and commit."""
    async with jobs_transaction(app):
        await app.execute("insert into invoices (number) values (%s)", (number,))
        return await send_invoice.enqueue(Invoice(number))


async def abandoned_invoice(app: AsyncConnection[Any], number: str) -> None:
    """Write an invoice and enqueue its email in one transaction, then give up on it."""
    async with jobs_transaction(app):
        await app.execute("insert into invoices (number) values (%s)", (number,))
        await send_invoice.enqueue(Invoice(number))
        raise AbandonedError()


async def run_jobs(driver: PostgresJobDriver) -> list[str]:
    """Claim and run every due invoice job; answers the invoices the handler ran for."""
    ran: list[str] = []
    while True:
        batch = await driver.claim(worker_id="w1", slots={"invoices": 10}, visibility_timeout=30)
        if not batch.jobs:
            return ran
        for claimed in batch.jobs:
            await execute_job(claimed, driver=driver, handle=send_invoice, services=ran)


async def job_rows(driver: PostgresJobDriver) -> list[tuple[str, JobState]]:
    page = await driver.introspect.list(JobFilter(name=send_invoice.name, limit=200))
    return [(row.id, row.state) for row in page.rows]


async def invoice_in_plain_transaction(app: AsyncConnection[Any], number: str) -> None:
    """Write an invoice and enqueue its email in a transaction another layer opened."""
    async with app.transaction():
        await app.execute("insert into invoices (number) values (%s)", (number,))
        await send_invoice.enqueue(Invoice(number))


async def test_a_store_that_cannot_see_the_facades_transaction_publishes_nothing(
    driver: PostgresJobDriver, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    """The facade joins a transaction another layer opened; the store was left on the default
    ``tx_executor``, which sees none. The enqueue fails inside the transaction rather than
    staging on the pool, where the job would outlive the rollback."""
    blind = postgres_outbox_store(executor=driver.executor, clock=clock)
    set_jobs_facade(outbox_jobs_facade(store=blind, driver=driver, current_tx=lambda: app))
    with pytest.raises(OutboxNoTxError):
        await invoice_in_plain_transaction(app, "INV-9")
    assert await blind.retained() == []
    assert await relay_of(blind, driver, clock).run_once() == 0
    assert await run_jobs(driver) == []


async def test_an_enqueue_in_a_rolled_back_transaction_never_runs(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: PostgresJobDriver,
    clock: FrozenClock,
) -> None:
    with pytest.raises(AbandonedError):
        await abandoned_invoice(app, "INV-1")
    assert await relay_of(store, driver, clock).run_once() == 0
    assert await run_jobs(driver) == []


async def test_a_staged_job_waits_for_its_transaction_to_commit(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: PostgresJobDriver,
    clock: FrozenClock,
) -> None:
    relay = relay_of(store, driver, clock)
    async with jobs_transaction(app):
        await send_invoice.enqueue(Invoice("INV-1"))
        assert await relay.run_once() == 0
    assert await relay.run_once() == 1
    assert await run_jobs(driver) == ["INV-1"]


async def test_a_staged_enqueue_answers_the_ids_of_the_job_it_becomes(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: PostgresJobDriver,
    clock: FrozenClock,
) -> None:
    queued = await invoice(app, "INV-1")
    await relay_of(store, driver, clock).run_once()
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.id, detail.row.run_id) == (queued.id, queued.run_id)


async def test_a_relay_dying_between_publish_and_mark_still_runs_the_job_once(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: PostgresJobDriver,
    clock: FrozenClock,
) -> None:
    await invoice(app, "INV-1")
    dying = DiesBeforeMarking(executor=driver.executor, tx_executor=current_tx, clock=clock)
    with pytest.raises(RelayDiedError):
        await relay_of(dying, driver, clock).run_once()
    clock.advance(LEASE_S)
    assert await relay_of(store, driver, clock).run_once() == 1  # published again
    assert await run_jobs(driver) == ["INV-1"]
    assert len(await job_rows(driver)) == 1
    assert await store.retained() == []


async def test_a_republish_after_the_job_finished_does_not_run_it_again(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: PostgresJobDriver,
    clock: FrozenClock,
) -> None:
    queued = await invoice(app, "INV-1")
    dying = DiesBeforeMarking(executor=driver.executor, tx_executor=current_tx, clock=clock)
    with pytest.raises(RelayDiedError):
        await relay_of(dying, driver, clock).run_once()
    assert await run_jobs(driver) == ["INV-1"]  # done: its idempotency key is free again
    clock.advance(LEASE_S)
    assert await relay_of(store, driver, clock).run_once() == 1
    assert await run_jobs(driver) == []
    assert await job_rows(driver) == [(queued.id, JobState.DONE)]


async def test_two_relays_never_hold_one_batch(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: PostgresJobDriver,
    other_process: PostgresJobDriver,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with jobs_transaction(app):
        staged = [(await send_invoice.enqueue(Invoice(f"INV-{n}"))).id for n in range(60)]
    stores = [store, postgres_outbox_store(executor=other_process.executor, clock=clock)]
    batches: list[list[str]] = []
    for each in stores:
        claim = each.claim

        async def recorded(*, claimant: str, limit: int, lease: float, claim: Any = claim) -> Any:
            records: list[OutboxRecord] = await claim(claimant=claimant, limit=limit, lease=lease)
            batches.append([record.request.id for record in records])
            return records

        monkeypatch.setattr(each, "claim", recorded)
    relays = [
        relay_of(stores[0], driver, clock, batch=7),
        relay_of(stores[1], other_process, clock, batch=7),
    ]

    async def drain(relay: OutboxRelay) -> None:
        while await relay.run_once():
            pass

    await asyncio.gather(*(drain(relay) for relay in relays))
    claimed = [job_id for batch in batches for job_id in batch]
    assert sorted(claimed) == sorted(staged)  # every row was held once, by one relay
    assert len(await job_rows(driver)) == 60


async def test_a_stalled_relays_late_mark_retires_nothing(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    other_process: PostgresJobDriver,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queued = await invoice(app, "INV-1")
    stalled = stall_publishing(other_process, monkeypatch)
    pass_in_flight = asyncio.create_task(relay_in(other_process, clock).run_once())
    await stalled.publishing.wait()
    clock.advance(LEASE_S)  # the stalled relay's claim lapses
    (reclaimed,) = await store.claim(claimant="relay-b", limit=10, lease=LEASE_S)
    assert reclaimed.request.id == queued.id
    stalled.resume.set()
    await pass_in_flight  # published, then marked — too late
    (row,) = await store.retained()
    assert (row.request.id, row.claimed_by) == (queued.id, "relay-b")
    assert await store.mark_published([queued.id], claimant="relay-b") == 1


async def test_a_stalled_relays_late_release_frees_nothing(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    other_process: PostgresJobDriver,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queued = await invoice(app, "INV-1")
    stalled = stall_publishing(other_process, monkeypatch, then_fail=True)
    pass_in_flight = asyncio.create_task(relay_in(other_process, clock).run_once())
    await stalled.publishing.wait()
    clock.advance(LEASE_S)
    await store.claim(claimant="relay-b", limit=10, lease=LEASE_S)
    stalled.resume.set()
    with pytest.raises(ConnectionError):
        await pass_in_flight  # its publish failed: it hands the batch back — too late
    assert await store.claim(claimant="relay-c", limit=10, lease=LEASE_S) == []
    (row,) = await store.retained()
    assert (row.request.id, row.claimed_by) == (queued.id, "relay-b")


async def test_staged_order_holds_across_a_failed_publish(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: PostgresJobDriver,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with jobs_transaction(app):
        create = await send_invoice.enqueue(Invoice("create-invoice"))
        charge = await send_invoice.enqueue(Invoice("charge-card"))
    published: list[str] = []
    failures = [ConnectionError("the server is restarting")]
    enqueue_many = driver.enqueue_many

    async def flaky(requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        if failures:
            raise failures.pop()
        published.extend(request.id for request in requests)
        return await enqueue_many(requests)

    monkeypatch.setattr(driver, "enqueue_many", flaky)
    relay = relay_of(store, driver, clock, batch=1)
    with pytest.raises(ConnectionError):
        await relay.run_once()
    assert await relay.run_once() == 1  # at once: the failed batch was handed back
    assert await relay.run_once() == 1
    assert published == [create.id, charge.id]
    assert await run_jobs(driver) == ["create-invoice", "charge-card"]


@dataclass
class Stall:
    publishing: asyncio.Event
    resume: asyncio.Event


def stall_publishing(
    driver: PostgresJobDriver, monkeypatch: pytest.MonkeyPatch, *, then_fail: bool = False
) -> Stall:
    """Make ``driver``'s publish stop until ``resume`` is set (then publish, or fail)."""
    stall = Stall(asyncio.Event(), asyncio.Event())
    enqueue_many = driver.enqueue_many

    async def stalled(requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        stall.publishing.set()
        await stall.resume.wait()
        if then_fail:
            raise ConnectionError("the connection was lost mid-publish")
        return await enqueue_many(requests)

    monkeypatch.setattr(driver, "enqueue_many", stalled)
    return stall


async def test_a_commit_that_staged_a_row_wakes_the_relay_of_another_process(
    app: AsyncConnection[Any], other_process: PostgresJobDriver, pg_url: str
) -> None:
    """Polling every 30 s at best, the relay publishes within seconds only if the commit's
    NOTIFY reaches it."""
    wake = start_queue_wake(listener=pg_url, executor=other_process.executor)
    relay = outbox_relay(
        store=postgres_outbox_store(executor=other_process.executor),
        driver=other_process,
        interval=30,
        idle_poll_max=60,
        drain_on_shutdown=False,
        wake=wake,
    )
    try:
        await asyncio.wait_for(until_live(wake), timeout=10)
        relay.start()
        await asyncio.sleep(0.5)  # the relay found nothing and is idle until woken
        queued = await invoice(app, "INV-WAKE")
        async with asyncio.timeout(15):
            while await other_process.introspect.get(queued.id) is None:
                await asyncio.sleep(0.02)
    finally:
        await relay.stop()
        await wake.close()


async def until_live(wake: Any) -> None:
    while not wake.live:
        await asyncio.sleep(0.01)
