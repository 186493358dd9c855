"""The wake: one LISTEN session, proven by a probe, fed by throttled NOTIFYs, re-dialled when lost.

Real notifications on a real server: the waits here are bounded polls of a live socket, never
assertions about how long anything took — but for one generous bound: a worker the wake rings
starts its job within 15 s, where its own poll would take a minute.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from support.jobs import Item, item_job

from ultimat3.jobs.core import (
    BulkFilter,
    BulkResult,
    Enqueued,
    EnqueueRequest,
    FrozenClock,
    JobState,
    QueueWake,
    job_worker,
    new_id,
)
from ultimat3.jobs.core.wake import on_wake_lost
from ultimat3.jobs.pg import PgQueueWake, PostgresJobDriver, postgres_job_driver, start_queue_wake

pytestmark = pytest.mark.pg

PATIENCE_S = 20.0


class Heard:
    """What a subscriber heard, in order."""

    def __init__(self, wake: PgQueueWake) -> None:
        self.queues: asyncio.Queue[str] = asyncio.Queue()
        wake.subscribe(self.queues.put_nowait)

    async def next(self) -> str:
        return await asyncio.wait_for(self.queues.get(), PATIENCE_S)


async def until_live(wake: PgQueueWake, live: bool = True) -> None:
    async def poll() -> None:
        while wake.live is not live:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), PATIENCE_S)


async def kill_the_listen_session(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity "
            "where datname = current_database() and pid <> pg_backend_pid() "
            "and query like '%listen x_jobs_wake%'"
        )


@pytest.fixture
async def wake(pg_url: str, driver: PostgresJobDriver) -> AsyncIterator[PgQueueWake]:
    started = start_queue_wake(listener=pg_url, executor=driver.executor)
    await until_live(started)
    yield started
    await started.close()


def job(
    clock: FrozenClock, queue: str, *, key: str | None = None, delay: float = 0
) -> EnqueueRequest:
    return EnqueueRequest(
        id=new_id(),
        run_id=new_id(),
        name="n",
        queue=queue,
        input=None,
        idempotency_key=key or new_id(),
        tenant_id=None,
        max_attempts=3,
        run_at=clock.now() + timedelta(seconds=delay),
    )


async def test_the_wake_goes_live_once_its_probe_comes_back(wake: PgQueueWake) -> None:
    assert wake.live


Enqueue = Callable[[PostgresJobDriver, EnqueueRequest], Awaitable[Enqueued]]

COPIED_BATCH = 200
"""A batch this large goes in by COPY (``test_enqueue_many.py`` checks that it does)."""


@pytest.fixture(params=["alone", "in a copied batch"])
def enqueue(request: pytest.FixtureRequest) -> Enqueue:
    """How a test's rows go in: alone (SQL_ENQUEUE_ONE), or first in a batch that is copied
    (SQL_ENQUEUE_ANNOUNCE, then SQL_ENQUEUE_COPY), the rest of which is due too late to be
    announced; a row that meets another sends that batch to SQL_ENQUEUE."""
    if request.param == "alone":
        return lambda driver, row: driver.enqueue(row)

    async def copied(driver: PostgresJobDriver, row: EnqueueRequest) -> Enqueued:
        later = FrozenClock(row.run_at)
        rest = [job(later, "filler", delay=86_400) for _ in range(COPIED_BATCH - 1)]
        return (await driver.enqueue_many([row, *rest]))[0]

    return copied


async def test_an_enqueue_announces_its_queue(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock, enqueue: Enqueue
) -> None:
    heard = Heard(wake)
    await enqueue(driver, job(clock, "emails"))
    assert await heard.next() == "emails"


async def test_a_second_row_in_the_same_slot_is_silent(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock, enqueue: Enqueue
) -> None:
    heard = Heard(wake)
    await enqueue(driver, job(clock, "q"))
    await enqueue(driver, job(clock, "q"))
    await enqueue(driver, job(clock, "marker"))
    assert [await heard.next(), await heard.next()] == ["q", "marker"]


async def test_a_row_finding_nothing_waiting_is_announced_even_inside_a_slot(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock, enqueue: Enqueue
) -> None:
    heard = Heard(wake)
    await enqueue(driver, job(clock, "q"))
    assert await heard.next() == "q"
    assert (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    await enqueue(driver, job(clock, "q"))
    assert await heard.next() == "q"


async def test_the_next_slot_announces_again(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock, enqueue: Enqueue
) -> None:
    heard = Heard(wake)
    await enqueue(driver, job(clock, "q"))
    clock.advance(0.25)
    await enqueue(driver, job(clock, "q"))
    assert [await heard.next(), await heard.next()] == ["q", "q"]


async def test_a_row_of_an_earlier_slot_falling_due_does_not_silence_a_new_one(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock, enqueue: Enqueue
) -> None:
    """Its announcement went out when it was enqueued, before it was due: the worker that heard
    it found nothing to take and is not coming back for it."""
    heard = Heard(wake)
    await enqueue(driver, job(clock, "q", delay=0.9))
    assert await heard.next() == "q"
    clock.advance(0.9)  # the row is due now, and its run_at lies in this new slot
    await enqueue(driver, job(clock, "q"))
    assert await heard.next() == "q"


async def test_an_enqueuer_whose_clock_runs_ahead_does_not_silence_the_others(
    wake: PgQueueWake,
    driver: PostgresJobDriver,
    clock: FrozenClock,
    pg_url: str,
    enqueue: Enqueue,
) -> None:
    heard = Heard(wake)
    ahead = postgres_job_driver(pg_url, clock=FrozenClock(clock.now() + timedelta(minutes=5)))
    try:
        await enqueue(driver, job(clock, "q"))  # a row waits: only a new slot announces
        await enqueue(ahead, job(clock, "q"))
        assert [await heard.next(), await heard.next()] == ["q", "q"]
        clock.advance(0.25)
        await enqueue(driver, job(clock, "q"))
        assert await heard.next() == "q"
    finally:
        await ahead.close()


async def test_a_row_due_later_is_not_announced(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock, enqueue: Enqueue
) -> None:
    heard = Heard(wake)
    await enqueue(driver, job(clock, "q", delay=5))
    await enqueue(driver, job(clock, "marker"))
    assert await heard.next() == "marker"


async def test_a_dedupe_is_silent(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock, enqueue: Enqueue
) -> None:
    heard = Heard(wake)
    await enqueue(driver, job(clock, "q", key="k"))
    clock.advance(1)
    assert (await enqueue(driver, job(clock, "q", key="k"))).deduped
    await enqueue(driver, job(clock, "marker"))
    assert [await heard.next(), await heard.next()] == ["q", "marker"]


async def test_resuming_a_queue_announces_it(wake: PgQueueWake, driver: PostgresJobDriver) -> None:
    heard = Heard(wake)
    await driver.introspect.pause_queue("q")
    await driver.introspect.resume_queue("q")
    assert await heard.next() == "q"


async def test_requeue_and_promote_announce_the_queue(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    later = await driver.enqueue(job(clock, "later", delay=60))
    heard = Heard(wake)
    await driver.introspect.promote(later.id)
    assert await heard.next() == "later"
    assert await driver.introspect.cancel(later.id) is not None
    await driver.introspect.requeue(later.id)
    assert await heard.next() == "later"
    detail = await driver.introspect.get(later.id)
    assert detail is not None
    assert detail.row.state is JobState.READY


async def test_requeue_many_and_promote_many_announce_each_queue_they_moved_rows_of(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    later = [await driver.enqueue(job(clock, queue, delay=60)) for queue in ("a", "a", "b")]
    heard = Heard(wake)

    promoted = await driver.introspect.promote_many(BulkFilter(state=JobState.DELAYED))
    assert promoted == BulkResult(affected=3, remaining=0)
    assert sorted([await heard.next(), await heard.next()]) == ["a", "b"]
    await driver.enqueue(job(clock, "marker-1"))
    assert await heard.next() == "marker-1"  # one announcement per queue, nothing more

    for row in later:
        assert await driver.introspect.cancel(row.id) is not None
    requeued = await driver.introspect.requeue_many(BulkFilter(state=JobState.CANCELLED))
    assert requeued == BulkResult(affected=3, remaining=0)
    assert sorted([await heard.next(), await heard.next()]) == ["a", "b"]
    await driver.enqueue(job(clock, "marker-2"))
    assert await heard.next() == "marker-2"
    for row in later:
        detail = await driver.introspect.get(row.id)
        assert detail is not None
        assert detail.row.state is JobState.READY


async def test_an_enqueue_in_another_process_wakes_an_idle_worker_at_once(pg_url: str) -> None:
    """Its poll would not come back for a minute: only the enqueue's NOTIFY, heard on the wake,
    can start the job within seconds. The enqueue goes straight to a second driver on its own
    pool, as another process's would: no in-process signal rings the worker."""
    first_run, woken_run, hold = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def first(*, input: Item) -> None:
        first_run.set()
        await hold.wait()

    async def woken(*, input: Item) -> None:
        woken_run.set()

    first_job = item_job(first, queue="wake-first")
    woken_job = item_job(woken, queue="wake-woken")
    worker_process = postgres_job_driver(pg_url)
    other_process = postgres_job_driver(pg_url)
    # Committed before anyone listens: no announcement of it reaches the worker.
    await other_process.enqueue_many([first_job.request(Item(0), clock=other_process.clock)])
    wake = start_queue_wake(listener=pg_url, executor=worker_process.executor)
    worker = job_worker(
        driver=worker_process,
        context=lambda: None,
        jobs=[first_job, woken_job],
        concurrency=1,
        poll_interval=60,
        idle_poll_max=60,
        wake=wake,
    )
    try:
        await until_live(wake)
        async with worker:
            try:
                # The first pass took that row; the next comes in a minute, or when rung.
                await asyncio.wait_for(first_run.wait(), PATIENCE_S)
                await other_process.enqueue_many(
                    [woken_job.request(Item(1), clock=other_process.clock)]
                )
                await asyncio.wait_for(woken_run.wait(), 15)
            finally:
                hold.set()  # the worker stops once its jobs end
    finally:
        await wake.close()
        await other_process.close()
        await worker_process.close()


async def test_the_wake_dials_again_after_its_session_is_killed(
    wake: PgQueueWake, driver: PostgresJobDriver, clock: FrozenClock, pg_url: str
) -> None:
    heard = Heard(wake)
    await kill_the_listen_session(pg_url)
    await until_live(wake, live=False)
    await until_live(wake, live=True)
    await driver.enqueue(job(clock, "after"))
    assert await heard.next() == "after"


async def test_a_lost_session_is_signalled_to_the_idle_loops(
    wake: PgQueueWake, pg_url: str
) -> None:
    signalled: list[QueueWake] = []
    remove = on_wake_lost(signalled.append)
    try:
        await kill_the_listen_session(pg_url)
        await until_live(wake, live=False)
        assert signalled == [wake]
    finally:
        remove()


async def test_a_probe_that_fails_after_a_redial_is_sent_again(
    pg_url: str, driver: PostgresJobDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server restart takes the pool's connections with the LISTEN session: the first probe
    # through the pool after the re-dial fails, and the session must not stay unproven for it.
    wake = start_queue_wake(listener=pg_url, executor=driver.executor)
    try:
        await until_live(wake)
        fetch = driver.executor.fetch
        failures = [psycopg.OperationalError("the pool's connection died with the server")]

        async def flaky_fetch(*args: Any, **kwargs: Any) -> Any:
            if failures:
                raise failures.pop()
            return await fetch(*args, **kwargs)

        monkeypatch.setattr(driver.executor, "fetch", flaky_fetch)
        await kill_the_listen_session(pg_url)
        await until_live(wake, live=False)
        await until_live(wake, live=True)
        assert not failures, "the failing probe was never sent"
    finally:
        await wake.close()


async def test_a_probe_that_never_arrives_leaves_the_wake_unverified(
    pg_url: str, postgres_url: str, driver: PostgresJobDriver, caplog: pytest.LogCaptureFixture
) -> None:
    # The session listens on ANOTHER database, so the probe sent to this one never reaches it:
    # the same silence a transaction-pooling proxy produces.
    caplog.set_level(logging.WARNING, logger="ultimat3.jobs")
    wake = start_queue_wake(listener=postgres_url, executor=driver.executor, probe_timeout=0.2)
    try:

        async def logged() -> None:
            while not any(r.message.startswith("jobs.wake.unverified") for r in caplog.records):
                await asyncio.sleep(0.02)

        await asyncio.wait_for(logged(), PATIENCE_S)
        assert not wake.live
    finally:
        await wake.close()
