"""A statement whose connection died after it committed: run again only when a repeat changes
nothing and answers the same, or (a claim, a nack) when the driver can tell what the first one
did; every other write raises, applied once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pg.faulty import Faults, faulty_pool

from ultimat3.jobs.core import (
    BulkFilter,
    DriverUnavailableError,
    EnqueueRequest,
    FrozenClock,
    JobState,
    new_id,
)
from ultimat3.jobs.core.model import AckOptions, ClaimedJob, ClaimRef, NackOptions
from ultimat3.jobs.pg import (
    PostgresJobDriver,
    jobs_transaction,
    postgres_job_driver,
    postgres_outbox_store,
)
from ultimat3.jobs.pg.sql_claim import SQL_CLAIM_FLUSH, SQL_CLAIM_HELD

pytestmark = pytest.mark.pg


@pytest.fixture
def faults() -> Faults:
    return Faults()


@pytest.fixture
async def lossy(
    pg_url: str, clock: FrozenClock, faults: Faults
) -> AsyncIterator[PostgresJobDriver]:
    """A driver over a pool whose next statements lose their answers on cue."""
    async with faulty_pool(pg_url, faults) as pool:
        built = postgres_job_driver(pool, clock=clock)
        yield built
        await built.close()


def request(clock: FrozenClock, n: int = 0, *, max_attempts: int = 3) -> EnqueueRequest:
    return EnqueueRequest(
        id=new_id(),
        run_id=new_id(),
        name="n",
        queue="q",
        input={"n": n},
        idempotency_key=f"k:{new_id()}",
        tenant_id=None,
        max_attempts=max_attempts,
        run_at=clock.now(),
    )


async def count(driver: PostgresJobDriver, query: str) -> int:
    return int((await driver.executor.fetch(query))[0][0])


async def test_an_enqueue_whose_answer_was_lost_raises_and_is_not_answered_as_a_dedupe(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    job = request(clock)
    faults.lose_answers()
    with pytest.raises(DriverUnavailableError, match="may have been applied"):
        await lossy.enqueue(job)
    assert await count(lossy, "select count(*) from x_jobs") == 1


async def test_a_copied_batch_whose_connection_died_raises_and_applied_all_or_nothing(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """The connection dies under the COPY's transaction (here after its announcement): the
    enqueue raises rather than answering, and enqueued again, every request answers alike."""
    batch = [request(clock, n) for n in range(200)]
    faults.lose_answers()
    with pytest.raises(DriverUnavailableError, match="may have been applied"):
        await lossy.enqueue_many(batch)
    assert await count(lossy, "select count(*) from x_jobs") in (0, len(batch))
    answers = await lossy.enqueue_many(batch)
    assert len({answer.deduped for answer in answers}) == 1
    assert await count(lossy, "select count(*) from x_jobs") == len(batch)


async def test_a_bulk_remove_whose_answer_was_lost_removes_one_batch_only(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    await lossy.enqueue_many([request(clock, n) for n in range(1500)])
    await lossy.executor.fetch("update x_jobs set state = 'done'")
    faults.lose_answers()
    with pytest.raises(DriverUnavailableError):
        await lossy.introspect.remove_many(BulkFilter(state=JobState.DONE))
    assert await count(lossy, "select count(*) from x_jobs") == 500


async def test_a_claim_whose_answer_was_lost_answers_the_rows_it_took_and_no_more(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """Its rows would otherwise run under a claim nobody holds until the lease lapsed: on its
    final attempt (max_attempts=1 here) a row would then be buried dead without having run."""
    await lossy.enqueue_many([request(clock, n, max_attempts=1) for n in range(3)])
    faults.lose_answers()
    batch = await lossy.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    assert [job.input for job in batch.jobs] == [{"n": 0}, {"n": 1}]
    running = "select count(*) from x_jobs where state = 'running'"
    assert await count(lossy, running) == 2
    for job in batch.jobs:
        assert await lossy.ack(job.id, AckOptions("w", job.claim.claim))
    assert await count(lossy, "select count(*) from x_jobs where state = 'done'") == 2


async def test_a_claim_whose_answer_was_lost_answers_the_rows_it_buried(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """A lapsed final attempt the claim buried is in its answer, so on_exhausted is told of it;
    before, the read-back found only the rows it took, and the burial went untold."""
    await lossy.enqueue_many([request(clock, 0, max_attempts=1), request(clock, 1)])
    await lossy.claim(worker_id="gone", slots={"q": 2}, visibility_timeout=30)
    clock.advance(31)
    faults.lose_answers()
    batch = await lossy.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    assert [job.input for job in batch.exhausted] == [{"n": 0}]
    assert batch.exhausted[0].state is JobState.DEAD
    assert [job.input for job in batch.jobs] == [{"n": 1}]
    buried = "select count(*) from x_jobs where state = 'dead'"
    assert await count(lossy, buried) == 1


async def test_a_claim_whose_answer_was_lost_before_it_ran_took_nothing(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    await lossy.enqueue(request(clock))
    faults.fail_before_sending()
    batch = await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert not batch.jobs
    assert await count(lossy, "select count(*) from x_jobs where state = 'ready'") == 1
    # The next claim looks for the lost one's rows once more, finds none, and claims as usual.
    batch = await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert [job.input for job in batch.jobs] == [{"n": 0}]


async def test_a_claim_that_commits_after_its_read_back_is_answered_by_the_next_claim(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock, pg_url: str
) -> None:
    """The connection died on the client's side while the server waited on a lock: the
    read-back ran first and found nothing, then the claim committed. Its row, on its final
    attempt, would have run under a claim nobody held and been buried dead without running."""
    await lossy.enqueue(request(clock, max_attempts=1))

    async def once_blocked() -> None:
        waiting = (
            "select count(*) from pg_stat_activity "
            "where datname = current_database() and wait_event_type = 'Lock'"
        )
        async with (
            asyncio.timeout(30),
            await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as watcher,
        ):
            while not (await (await watcher.execute(waiting)).fetchall())[0][0]:
                await asyncio.sleep(0.01)

    async with await psycopg.AsyncConnection.connect(pg_url) as blocker:
        await blocker.execute("lock table x_jobs in share mode")
        faults.abandon_next(once_blocked)
        batch = await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
        assert not batch.jobs
    running = "select count(*) from x_jobs where state = 'running'"
    async with asyncio.timeout(30):
        while not await count(lossy, running):
            await asyncio.sleep(0.01)

    clock.advance(20)  # the lost claim's lease has 10 s left: the row comes renewed
    batch = await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert [job.input for job in batch.jobs] == [{"n": 0}]
    (job,) = batch.jobs
    assert job.lease_until == clock.now() + timedelta(seconds=30)
    held = await lossy.executor.fetch(
        "select lease_until from x_jobs where id = %(id)s", {"id": job.id}
    )
    assert held[0][0] == job.lease_until
    assert await lossy.ack(job.id, AckOptions("w", job.claim.claim))
    assert await count(lossy, "select count(*) from x_jobs where state = 'done'") == 1


async def test_the_burials_of_a_claim_that_commits_late_are_told_without_waiting_for_room(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock, pg_url: str
) -> None:
    """A lost claim committed after its read-back, taking two rows and burying a third: the
    rows it took wait for two free slots, but its burial takes none and is told by the next
    claim, however busy the worker is."""
    final = request(clock, 9, max_attempts=1)
    await lossy.enqueue(final)
    await lossy.claim(worker_id="died", slots={"q": 1}, visibility_timeout=10)
    clock.advance(11)  # its lease lapsed on its final attempt
    await lossy.enqueue_many([request(clock, 1), request(clock, 2)])

    async def once_blocked() -> None:
        waiting = (
            "select count(*) from pg_stat_activity "
            "where datname = current_database() and wait_event_type = 'Lock'"
        )
        async with (
            asyncio.timeout(30),
            await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as watcher,
        ):
            while not (await (await watcher.execute(waiting)).fetchall())[0][0]:
                await asyncio.sleep(0.01)

    async with await psycopg.AsyncConnection.connect(pg_url) as blocker:
        await blocker.execute("lock table x_jobs in share mode")
        faults.abandon_next(once_blocked)
        batch = await lossy.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
        assert not batch.jobs
    buried = "select count(*) from x_jobs where state = 'dead'"
    async with asyncio.timeout(30):
        while not await count(lossy, buried):
            await asyncio.sleep(0.01)

    batch = await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert [row.id for row in batch.exhausted] == [final.id]
    assert not batch.jobs
    clock.advance(1)
    batch = await lossy.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    assert sorted(job.input["n"] for job in batch.jobs) == [1, 2]
    assert not batch.exhausted  # told once


def fail_once(driver: PostgresJobDriver, statement: str) -> None:
    """The driver's next ``statement`` fails as if the server had gone away."""
    fetch = driver.executor.fetch

    async def failing(query: str, *args: Any, **kwargs: Any) -> Any:
        if query == statement:
            driver.executor.fetch = fetch  # type: ignore[method-assign]
            raise DriverUnavailableError("the server went away")
        return await fetch(query, *args, **kwargs)

    driver.executor.fetch = failing  # type: ignore[method-assign]


async def test_a_claim_whose_read_back_failed_too_is_answered_by_the_next_claim(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """The claim committed and its answer was lost, then its read-back failed (the server went
    away): the claim fails, and the next one answers the rows it took."""
    await lossy.enqueue(request(clock, max_attempts=1))
    fail_once(lossy, SQL_CLAIM_HELD)
    faults.lose_answers()
    with pytest.raises(DriverUnavailableError, match="went away"):
        await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    batch = await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert [job.input for job in batch.jobs] == [{"n": 0}]


async def test_a_claim_whose_burials_failed_to_flush_is_answered_by_the_next_claim(
    lossy: PostgresJobDriver, clock: FrozenClock
) -> None:
    """The claim committed, taking one row and burying another, then making its burials
    durable failed: the claim fails, and the next one answers both rows, not leaving the one
    it took to lapse unrun nor the burial untold."""
    final, second = request(clock, 0, max_attempts=1), request(clock, 1, max_attempts=2)
    await lossy.enqueue_many([final, second])
    await lossy.claim(worker_id="died", slots={"q": 2}, visibility_timeout=10)
    clock.advance(11)
    fail_once(lossy, SQL_CLAIM_FLUSH)
    with pytest.raises(DriverUnavailableError, match="went away"):
        await lossy.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    batch = await lossy.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    assert [job.id for job in batch.jobs] == [second.id]
    assert [row.id for row in batch.exhausted] == [final.id]


async def test_a_late_answer_that_failed_is_given_again_at_the_next_look(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """A lost claim is found at a later claim, which fails to answer it (its burials could not
    be made durable): the look after that answers the same rows."""
    final, second = request(clock, 0, max_attempts=1), request(clock, 1, max_attempts=2)
    await lossy.enqueue_many([final, second])
    await lossy.claim(worker_id="died", slots={"q": 2}, visibility_timeout=10)
    clock.advance(11)
    fail_once(lossy, SQL_CLAIM_HELD)
    faults.lose_answers()
    with pytest.raises(DriverUnavailableError, match="went away"):
        await lossy.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    fail_once(lossy, SQL_CLAIM_FLUSH)
    with pytest.raises(DriverUnavailableError, match="went away"):
        await lossy.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    clock.advance(1)
    batch = await lossy.claim(worker_id="w", slots={"q": 2}, visibility_timeout=30)
    assert [job.id for job in batch.jobs] == [second.id]
    assert [row.id for row in batch.exhausted] == [final.id]


def count_statements(driver: PostgresJobDriver) -> list[int]:
    """A one-item list the driver's statements are counted in from now on."""
    counted, fetch = [0], driver.executor.fetch

    async def counting(*args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return await fetch(*args, **kwargs)

    driver.executor.fetch = counting  # type: ignore[method-assign]
    return counted


async def test_a_lost_claim_is_looked_for_once_a_second_until_its_lease_lapsed(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    faults.fail_before_sending()
    assert not (await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    statements = count_statements(lossy)
    for expected in (2, 1, 1):  # a look and the claim, then the claim alone within the second
        statements[0] = 0
        await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
        assert statements[0] == expected
    clock.advance(1)
    statements[0] = 0
    await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert statements[0] == 2
    clock.advance(30)
    statements[0] = 0
    await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert statements[0] == 1


async def test_a_claim_run_again_after_a_deadlock_whose_answer_was_lost_is_read_back(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """The claim was a deadlock victim, ran again, and that answer was lost: it is a lost
    answer like any other, and the rows it took are answered."""
    await lossy.enqueue(request(clock))
    faults.deadlock()
    faults.lose_answers()
    batch = await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
    assert [job.input for job in batch.jobs] == [{"n": 0}]


async def test_a_read_whose_connection_died_twice_is_driver_unavailable(
    lossy: PostgresJobDriver, faults: Faults
) -> None:
    faults.fail_before_sending(2)
    with pytest.raises(DriverUnavailableError, match="again when it ran once more"):
        await lossy.stats()


async def test_a_cancel_whose_answer_was_lost_raises_rather_than_answering_not_found(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    job = request(clock)
    await lossy.enqueue(job)
    faults.lose_answers()
    with pytest.raises(DriverUnavailableError):
        await lossy.introspect.cancel(job.id)
    detail = await lossy.introspect.get(job.id)
    assert detail is not None
    assert detail.row.state is JobState.CANCELLED


async def test_a_read_whose_connection_died_is_run_again(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    await lossy.enqueue(request(clock))
    faults.lose_answers()
    [stats] = await lossy.stats()
    assert stats.ready == 1


async def test_a_heartbeat_whose_answer_was_lost_is_run_again_and_still_holds_the_lease(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    await lossy.enqueue(request(clock))
    [job] = (await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    faults.lose_answers()
    assert await lossy.heartbeat(job.id, ClaimRef("w", job.claim.claim), 60)


async def test_an_ack_whose_answer_was_lost_is_run_again_and_counted_once(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """The job ran; only the ack's answer was lost. Raising would leave the row to come back
    when its lease lapsed, as if the run had died: the job would run a second time."""
    await lossy.enqueue(request(clock))
    [job] = (await lossy.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    faults.lose_answers()
    assert await lossy.ack(job.id, AckOptions("w", job.claim.claim, 12))
    assert await count(lossy, "select count(*) from x_jobs where state = 'done'") == 1
    assert await count(lossy, "select coalesce(sum(done), 0) from x_job_counters") == 1


async def claim_one(driver: PostgresJobDriver) -> ClaimedJob:
    [job] = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    return job


@pytest.mark.parametrize("lost", ["the answer", "the statement"])
async def test_a_nack_whose_connection_died_lands_once_and_answers_true(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock, lost: str
) -> None:
    """Whether the first one committed (its answer lost) or never ran: sent again, it lands
    only where it had not, so the retry is counted once either way."""
    await lossy.enqueue(request(clock))
    job = await claim_one(lossy)
    if lost == "the answer":
        faults.lose_answers()
    else:
        faults.fail_before_sending()
    assert await lossy.nack(job.id, NackOptions("w", job.claim.claim, error="boom"))
    ready = "select count(*) from x_jobs where state = 'ready' and last_error = 'boom'"
    assert await count(lossy, ready) == 1
    assert await count(lossy, "select coalesce(sum(retried), 0) from x_job_counters") == 1


async def test_a_final_nack_whose_answer_was_lost_keeps_its_own_error_on_the_dead_row(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """Raising instead left the row to lapse, and the lapse buried it under
    LEASE_LAPSED_FINAL_ATTEMPT in place of the error that ended it."""
    await lossy.enqueue(request(clock, max_attempts=1))
    job = await claim_one(lossy)
    faults.lose_answers()
    assert await lossy.nack(
        job.id, NackOptions("w", job.claim.claim, error="boom", dead_letter=True)
    )
    dead = "select count(*) from x_jobs where state = 'dead' and last_error = 'boom'"
    assert await count(lossy, dead) == 1


async def test_a_final_nack_that_had_not_landed_when_another_claim_buried_the_row_answers_false(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """The row is dead either way, but under the burial's LEASE_LAPSED_FINAL_ATTEMPT, not the
    nack's error: the nack did not land, and says so."""
    await lossy.enqueue(request(clock, max_attempts=1))
    job = await claim_one(lossy)
    clock.advance(31)
    assert (await lossy.claim(worker_id="other", slots={"q": 1}, visibility_timeout=30)).exhausted
    faults.fail_before_sending()
    assert not await lossy.nack(
        job.id, NackOptions("w", job.claim.claim, error="boom", dead_letter=True)
    )
    lapsed = "select count(*) from x_jobs where last_error = 'LEASE_LAPSED_FINAL_ATTEMPT'"
    assert await count(lossy, lapsed) == 1


async def test_a_nack_sent_again_after_an_operator_cancelled_the_row_answers_false(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    await lossy.enqueue(request(clock))
    job = await claim_one(lossy)
    await lossy.introspect.cancel(job.id)
    faults.fail_before_sending()
    assert not await lossy.nack(job.id, NackOptions("w", job.claim.claim, error="boom"))
    assert await count(lossy, "select count(*) from x_jobs where state = 'cancelled'") == 1


async def test_a_stale_nack_sent_again_after_another_run_nacked_the_row_alike_answers_false(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    """This run's lease lapsed, another claim ran the job and dead-lettered it: the row is
    dead and held by no claim, as this nack would have left it, but another run put it there
    (its on_settled was told, and must not be told again for this one)."""
    await lossy.enqueue(request(clock, max_attempts=2))
    stale = await claim_one(lossy)
    clock.advance(31)
    [second] = (await lossy.claim(worker_id="other", slots={"q": 1}, visibility_timeout=30)).jobs
    terminal = NackOptions("other", second.claim.claim, error="second", dead_letter=True)
    assert await lossy.nack(second.id, terminal)
    clock.advance(1)
    faults.fail_before_sending()
    assert not await lossy.nack(
        stale.id, NackOptions("w", stale.claim.claim, error="first", dead_letter=True)
    )
    dead = "select count(*) from x_jobs where state = 'dead' and last_error = 'second'"
    assert await count(lossy, dead) == 1


async def test_a_lease_acquire_whose_answer_was_lost_answers_the_slot_it_took(
    lossy: PostgresJobDriver, faults: Faults
) -> None:
    faults.lose_answers()
    assert await lossy.leases.acquire("key", "h1", limit=1, ttl=30)
    assert await lossy.leases.holders("key") == ["h1"]


async def test_a_backfill_begin_whose_answer_was_lost_answers_the_row_it_opened(
    lossy: PostgresJobDriver, faults: Faults
) -> None:
    faults.lose_answers()
    row = await lossy.backfills.begin(name="bf", run_id="run-1", checksum="c")
    assert (row.run_id, row.status) == ("run-1", "running")
    assert await count(lossy, "select count(*) from x_backfills") == 1


async def test_an_event_publish_whose_answer_was_lost_stores_one_event(
    lossy: PostgresJobDriver, faults: Faults
) -> None:
    faults.lose_answers()
    record = await lossy.events.publish("paid", {"invoice": 1})
    assert record.payload == {"invoice": 1}
    assert await count(lossy, "select count(*) from x_job_events") == 1


async def test_an_outbox_claim_whose_answer_was_lost_answers_the_batch_it_stamped(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock
) -> None:
    store = postgres_outbox_store(executor=lossy.executor, clock=clock)
    staged = []
    async with lossy.executor.connection() as conn, jobs_transaction(conn):
        for n in range(3):
            staged.append(request(clock, n))
            await store.stage(staged[-1])
            clock.advance(0.001)
    faults.lose_answers()
    records = await store.claim(claimant="relay-1", limit=1, lease=30)
    assert [r.request.id for r in records] == [staged[0].id]
    claimed = "select count(*) from x_outbox where claimed_by is not null"
    assert await count(lossy, claimed) == 1


@pytest.mark.parametrize("write", ["release", "mark_published"])
async def test_an_outbox_hand_back_or_retirement_whose_answer_was_lost_is_run_again(
    lossy: PostgresJobDriver, faults: Faults, clock: FrozenClock, write: str
) -> None:
    """A repeat moves nothing the first one did not: the relay is not left with a batch it
    cannot tell the fate of."""
    store = postgres_outbox_store(executor=lossy.executor, clock=clock)
    staged = request(clock)
    async with lossy.executor.connection() as conn, jobs_transaction(conn):
        await store.stage(staged)
    await store.claim(claimant="relay-1", limit=1, lease=30)
    faults.lose_answers()
    await getattr(store, write)([staged.id], claimant="relay-1")
    unclaimed = "select count(*) from x_outbox where claimed_by is null and published_at is null"
    published = "select count(*) from x_outbox where published_at is not null"
    assert await count(lossy, unclaimed if write == "release" else published) == 1
