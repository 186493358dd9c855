"""The outbox stages in Postgres and the relay publishes onto Redis, under the staged ids.

The transaction that writes the business rows stages the job beside them; only a committed one
reaches the Redis queue, and it lands there as the job the enqueue already named (its id and run
id). A relay that published and died before marking publishes again: the id already names the
Redis row, so nothing is inserted twice, even once that row has finished.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from psycopg import AsyncConnection

from ultimat3.jobs.core import (
    AckOptions,
    Enqueued,
    FrozenClock,
    JobState,
    job,
    outbox_jobs_facade,
    outbox_relay,
    reset_job_driver,
    set_job_driver,
    set_jobs_facade,
)
from ultimat3.jobs.core.outbox import OutboxRelay
from ultimat3.jobs.pg import install
from ultimat3.jobs.pg.outbox import PostgresOutboxStore, postgres_outbox_store
from ultimat3.jobs.pg.transaction import current_tx, jobs_transaction
from ultimat3.jobs.redis import RedisJobDriver

pytestmark = [pytest.mark.pg, pytest.mark.redis]


@dataclass
class Receipt:
    order: str


@job(input=Receipt, idempotency_key=lambda r: f"receipt:{r.order}", tenant="none", queue="mail")
async def send_receipt(*, input: Receipt) -> None:
    return None


class AbandonedError(Exception):
    """The application gave up on its transaction."""


@pytest.fixture
async def pg_url(pg_database_url: str) -> str:
    await install(pg_database_url)
    return pg_database_url


@pytest.fixture
async def store(pg_url: str, clock: FrozenClock) -> AsyncIterator[PostgresOutboxStore]:
    built = postgres_outbox_store(executor=pg_url, clock=clock)
    yield built
    await built.close()


@pytest.fixture(autouse=True)
def outbox_installed(driver: RedisJobDriver, store: PostgresOutboxStore) -> Iterator[None]:
    set_job_driver(driver)
    set_jobs_facade(outbox_jobs_facade(store=store, driver=driver, current_tx=current_tx))
    yield
    reset_job_driver()


@pytest.fixture
async def app(pg_url: str) -> AsyncIterator[AsyncConnection[Any]]:
    """The application's connection, with its business table beside the outbox."""
    async with await AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("create table orders (id text primary key)")
        yield conn


def relay(store: PostgresOutboxStore, driver: RedisJobDriver, clock: FrozenClock) -> OutboxRelay:
    return outbox_relay(store=store, driver=driver, clock=clock, drain_on_shutdown=False)


async def abandoned_order(app: AsyncConnection[Any], number: str) -> None:
    async with jobs_transaction(app):
        await app.execute("insert into orders (id) values (%s)", (number,))
        await send_receipt.enqueue(Receipt(number))
        raise AbandonedError()


async def order(app: AsyncConnection[Any], number: str) -> Enqueued:
    async with jobs_transaction(app):
        await app.execute("insert into orders (id) values (%s)", (number,))
        return await send_receipt.enqueue(Receipt(number))


async def test_a_committed_job_lands_on_redis_under_the_ids_its_enqueue_answered(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: RedisJobDriver,
    clock: FrozenClock,
) -> None:
    queued = await order(app, "o-1")
    assert await driver.stats() == []  # staged in Postgres, not on the queue yet
    assert await relay(store, driver, clock).run_once() == 1
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.id, detail.row.run_id, detail.row.queue) == (
        queued.id,
        queued.run_id,
        "mail",
    )


async def test_a_rolled_back_job_never_reaches_redis(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: RedisJobDriver,
    clock: FrozenClock,
) -> None:
    with pytest.raises(AbandonedError):
        await abandoned_order(app, "o-1")
    assert await relay(store, driver, clock).run_once() == 0
    assert await driver.stats() == []


async def test_a_publish_repeated_after_the_job_finished_inserts_nothing(
    app: AsyncConnection[Any],
    store: PostgresOutboxStore,
    driver: RedisJobDriver,
    clock: FrozenClock,
) -> None:
    queued = await order(app, "o-1")
    (record,) = await store.claim(claimant="dying-relay", limit=10, lease=30)
    await driver.enqueue(record.request)  # published; the relay dies before marking it
    (job_run,) = (await driver.claim(worker_id="w", slots={"mail": 1}, visibility_timeout=30)).jobs
    await driver.ack(job_run.id, AckOptions(job_run.claim.worker_id, job_run.claim.claim))
    clock.advance(30)  # the dead relay's claim lapses; another relay publishes the row again
    assert await relay(store, driver, clock).run_once() == 1
    (stats,) = await driver.stats()
    assert (stats.done, stats.ready) == (1, 0)
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.DONE
