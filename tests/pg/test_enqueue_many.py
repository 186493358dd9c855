"""enqueue_many: a batch is one write (a COPY, or one statement), answers exactly as enqueueing
one by one would, and never deadlocks with another batch over the same keys."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pg.faulty import Faults, faulty_pool
from pg.plans import plan_of, scans_run
from psycopg.errors import DeadlockDetected, UniqueViolation

from ultimat3.jobs.core import (
    AckOptions,
    Enqueued,
    EnqueueRequest,
    FrozenClock,
    JobState,
    memory_job_driver,
    new_id,
)
from ultimat3.jobs.pg import PostgresJobDriver, postgres_job_driver
from ultimat3.jobs.pg.rows import copy_rows, enqueue_one_params, enqueue_params
from ultimat3.jobs.pg.sql_enqueue import (
    SQL_ENQUEUE,
    SQL_ENQUEUE_COPY,
    SQL_ENQUEUE_HELD,
    SQL_ENQUEUE_ONE,
)

COPIED_BATCH = 200
"""Requests enough for a batch to be tried by COPY first."""

pytestmark = pytest.mark.pg


def request(
    clock: FrozenClock, job_id: str, key: str, *, name: str = "n", tenant: str | None = None
) -> EnqueueRequest:
    return EnqueueRequest(
        id=job_id,
        run_id=f"run-{job_id}",
        name=name,
        queue="q",
        input={"id": job_id},
        idempotency_key=key,
        tenant_id=tenant,
        max_attempts=3,
        run_at=clock.now(),
    )


def count_enqueue_writes(
    driver: PostgresJobDriver, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, int]]:
    """How the driver's batches went in, as they go: ("statement", rows) for each SQL_ENQUEUE,
    ("copy", rows) for each SQL_ENQUEUE_COPY tried."""
    seen: list[tuple[str, int]] = []
    fetch, copy = driver.executor.fetch, driver.executor.copy

    async def counted_fetch(query: str, params: Any = None, **options: Any) -> Any:
        if query == SQL_ENQUEUE:
            seen.append(("statement", len(json.loads(params["rows"]))))
        return await fetch(query, params, **options)

    async def counted_copy(statement: str, rows: Any, **options: Any) -> None:
        if statement == SQL_ENQUEUE_COPY:
            seen.append(("copy", sum(1 for _ in rows)))
        await copy(statement, rows, **options)

    monkeypatch.setattr(driver.executor, "fetch", counted_fetch)
    monkeypatch.setattr(driver.executor, "copy", counted_copy)
    return seen


@pytest.mark.parametrize(
    ("size", "written"),
    [
        pytest.param(COPIED_BATCH, [("copy", COPIED_BATCH)], id="a large batch is copied"),
        pytest.param(5_000, [("copy", 5_000)], id="up to a chunk"),
        pytest.param(50, [("statement", 50)], id="a small one is one statement"),
    ],
)
async def test_a_batch_is_one_write(
    driver: PostgresJobDriver,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
    size: int,
    written: list[tuple[str, int]],
) -> None:
    writes = count_enqueue_writes(driver, monkeypatch)
    batch = [request(clock, f"id-{n:04}", f"k{n}") for n in range(size)]
    answers = await driver.enqueue_many(batch)
    assert answers == [Enqueued(r.id, r.run_id) for r in batch]
    assert writes == written
    [stats] = await driver.stats()
    assert stats.ready == size


@pytest.mark.parametrize(
    "earlier",
    [
        pytest.param(("id-0150", "elsewhere", JobState.DONE), id="an id naming a finished row"),
        pytest.param(("other", "k150", JobState.RUNNING), id="a key a live row holds"),
    ],
)
async def test_a_copied_batch_that_meets_a_row_is_answered_by_the_statement(
    driver: PostgresJobDriver,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
    earlier: tuple[str, str, JobState],
) -> None:
    """A COPY cannot skip a row: it fails whole, applies nothing (its announcement neither), and
    the statement answers every request as enqueueing them one by one would."""
    memory = memory_job_driver(clock=clock)
    job_id, key, state = earlier
    for target in (driver, memory):
        await target.enqueue(request(clock, job_id, key))
        claimed = await target.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)
        if state is JobState.DONE:
            [job] = claimed.jobs
            assert await target.ack(job.id, AckOptions(job.claim.worker_id, job.claim.claim))
    writes = count_enqueue_writes(driver, monkeypatch)
    batch = [request(clock, f"id-{n:04}", f"k{n}") for n in range(COPIED_BATCH)]
    answers = await driver.enqueue_many(batch)
    assert answers == await memory.enqueue_many(batch)
    assert [answer.deduped for answer in answers].count(True) == 1
    assert writes == [("copy", COPIED_BATCH), ("statement", COPIED_BATCH)]
    assert await driver.stats() == await memory.stats()


def test_the_copied_rows_are_in_key_order_and_can_be_read_again(clock: FrozenClock) -> None:
    """A COPY run again (a deadlock victim) reads its rows again: they are no generator."""
    rows = copy_rows([request(clock, "b", "k2"), request(clock, "a", "k1")], clock.now())
    assert [row[0] for row in rows] == ["a", "b"]
    assert list(rows) == list(rows)


async def test_a_copy_that_fails_in_the_callers_transaction_leaves_it_usable(
    pg_url: str, clock: FrozenClock
) -> None:
    """In the caller's transaction the COPY runs in a savepoint: its failure rolls back only
    its own work, and the caller's COMMIT commits the statement's answer with the rest."""
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        driver = postgres_job_driver(conn, clock=clock)
        await driver.enqueue(request(clock, "taken", "k0"))
        await conn.commit()
        async with conn.transaction():
            await conn.execute("create table invoices (n int); insert into invoices values (1)")
            batch = [request(clock, f"id-{n:04}", f"k{n}") for n in range(COPIED_BATCH)]
            answers = await driver.enqueue_many(batch)
        assert answers[0] == Enqueued("taken", "run-taken", deduped=True)
        cursor = await conn.execute("select count(*) from invoices")
        assert await cursor.fetchone() == (1,)
        [stats] = await driver.stats()
        assert stats.ready == COPIED_BATCH
        await conn.execute("drop table invoices")
        await conn.commit()


@pytest.mark.parametrize(
    "specs",
    [
        pytest.param([("a", "k1"), ("b", "k1")], id="a key twice in one batch"),
        pytest.param([("a", "k1"), ("a", "k2")], id="an id twice in one batch"),
        pytest.param([("a", "k1"), ("a", "k1")], id="the same request twice"),
        pytest.param([("a", "k1"), ("b", "k1"), ("c", "k2"), ("b", "k2")], id="a chain"),
        pytest.param([("x", "k9"), ("y", "k1")], id="an id and a key already taken"),
    ],
)
@pytest.mark.parametrize("padding", [0, COPIED_BATCH], ids=["SQL_ENQUEUE", "copied"])
async def test_a_batch_answers_as_one_by_one_enqueues_would(
    driver: PostgresJobDriver, clock: FrozenClock, specs: list[tuple[str, str]], padding: int
) -> None:
    """``padding`` requests of their own keys ride along: the batch's first round is then large
    enough to be tried by COPY."""
    memory = memory_job_driver(clock=clock)
    earlier = [request(clock, "x", "k1"), request(clock, "z", "k9")]
    for target in (driver, memory):
        await target.enqueue_many(earlier)
    batch = [request(clock, job_id, key) for job_id, key in specs]
    batch += [request(clock, f"pad-{n}", f"pad{n}") for n in range(padding)]
    assert await driver.enqueue_many(batch) == await memory.enqueue_many(batch)
    assert await driver.stats() == await memory.stats()


@pytest.mark.parametrize("size", [2, COPIED_BATCH], ids=["SQL_ENQUEUE", "copied"])
async def test_a_batch_of_mixed_due_times_lands_ready_and_delayed(
    driver: PostgresJobDriver, clock: FrozenClock, size: int
) -> None:
    later = timedelta(minutes=5)
    await driver.enqueue_many(
        [
            replace(request(clock, f"id-{n}", f"k{n}"), run_at=clock.now() + later * (n % 2))
            for n in range(size)
        ]
    )
    [stats] = await driver.stats()
    assert (stats.ready, stats.delayed) == (size // 2, size // 2)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"float": 1.0, "huge": 1e308, "tiny": 2.5e-7}, id="floats keep their form"),
        pytest.param("x\u0000y", id="a NUL escape"),
        pytest.param("\ud800", id="a lone surrogate"),
        pytest.param({"é": "ü\u2028😀"}, id="non-ASCII keys and values"),
        pytest.param(12345678901234567890, id="an integer past 64 bits"),
        pytest.param(-0.0, id="negative zero"),
        pytest.param(None, id="null"),
    ],
)
@pytest.mark.parametrize(
    "others",
    [0, 1, COPIED_BATCH],
    ids=["alone (SQL_ENQUEUE_ONE)", "in a batch (SQL_ENQUEUE)", "in a copied batch"],
)
async def test_an_input_reads_back_exactly_as_it_was_enqueued(
    driver: PostgresJobDriver, clock: FrozenClock, value: Any, others: int
) -> None:
    queued = replace(request(clock, "exact", "k"), input=value)
    await driver.enqueue_many(
        [queued, *(request(clock, f"other-{n}", f"k{n}") for n in range(others))]
    )
    claimed = next(
        job
        for job in (
            await driver.claim(worker_id="w", slots={"q": others + 1}, visibility_timeout=30)
        ).jobs
        if job.id == "exact"
    )
    assert claimed.input == value
    assert json.dumps(claimed.input) == json.dumps(value)


@pytest.mark.parametrize("holder_finished", [False, True], ids=["held", "finished meanwhile"])
async def test_a_lone_enqueue_that_met_a_row_names_it_or_asks_again(
    driver: PostgresJobDriver,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
    holder_finished: bool,
) -> None:
    """SQL_ENQUEUE_ONE answers only whether it inserted; SQL_ENQUEUE_HELD then names the live row
    holding the key. When that row finished in between, nothing holds the key any more: the
    enqueue asks again, and inserts."""
    await driver.enqueue(request(clock, "first", "k"))
    [first] = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    fetch = driver.executor.fetch

    async def finishing_first(query: str, params: Any = None, **options: Any) -> Any:
        if query == SQL_ENQUEUE_HELD and holder_finished:
            await driver.ack(first.id, AckOptions(first.claim.worker_id, first.claim.claim))
        return await fetch(query, params, **options)

    monkeypatch.setattr(driver.executor, "fetch", finishing_first)
    second = await driver.enqueue(request(clock, "second", "k"))
    if holder_finished:
        assert second == Enqueued("second", "run-second")
    else:
        assert second == Enqueued("first", "run-first", deduped=True)


async def test_an_empty_batch_answers_nothing(driver: PostgresJobDriver) -> None:
    assert await driver.enqueue_many([]) == []


async def test_batches_racing_on_the_same_keys_never_deadlock(
    pg_url: str, clock: FrozenClock
) -> None:
    faults = Faults()
    async with faulty_pool(pg_url, faults) as one, faulty_pool(pg_url, faults) as other:
        first, second = (
            postgres_job_driver(one, clock=clock),
            postgres_job_driver(other, clock=clock),
        )
        for round_ in range(2):
            keys = [f"{round_}:{n:04}" for n in range(2000)]
            forward = [request(clock, new_id(), key) for key in keys]
            backward = [request(clock, new_id(), key) for key in reversed(keys)]
            answers = await asyncio.gather(
                first.enqueue_many(forward), second.enqueue_many(backward)
            )
            inserted = [a for batch in answers for a in batch if not a.deduped]
            assert len(inserted) == len(keys)
    assert not [e for e in faults.errors if isinstance(e, DeadlockDetected)]
    # Each round raced two COPYs (the loser fell back to the statement), not two statements.
    assert len([e for e in faults.errors if isinstance(e, UniqueViolation)]) == 2


async def enqueue_plan_scans(driver: PostgresJobDriver, clock: FrozenClock) -> list[Any]:
    """The x_jobs scans an enqueue runs now, of one request and of a batch (rolled back)."""
    one = request(clock, "probe", "probe")
    batch = [one, request(clock, "probe2", "probe2")]
    return [
        *await scans_run(
            driver.executor, SQL_ENQUEUE_ONE, enqueue_one_params(one, clock.now()), "x_jobs"
        ),
        *await scans_run(
            driver.executor, SQL_ENQUEUE, enqueue_params(batch, clock.now()), "x_jobs"
        ),
    ]


async def test_an_enqueue_reads_a_row_or_two_however_long_the_backlog(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    """Statistics taken on an empty table, then a backlog: an enqueue's "is anything waiting?"
    probe must stop at the first waiting row (read as an anti-join, it read the whole backlog:
    24 ms an enqueue beside 100,000 rows)."""
    await driver.executor.fetch("analyze x_jobs", prepare=False)
    await driver.enqueue_many([request(clock, f"b{n:05}", f"b{n}") for n in range(3000)])
    clock.advance(1)
    scans = await enqueue_plan_scans(driver, clock)
    assert scans
    assert all(rows <= 1 for _, rows in scans), scans


async def test_an_enqueue_never_reads_the_finished_rows_before_a_waiting_one(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    """Statistics taken while a backlog waited, then the backlog finished and one row waits
    behind it: "is anything waiting?" must go to the waiting rows' index. Asked as a bare LIMIT 1,
    the planner counted on meeting a waiting row at once and read the table from its start,
    every finished row first (O(table) an enqueue, on a table that keeps its done rows)."""
    await driver.enqueue_many([request(clock, f"b{n:05}", f"b{n}") for n in range(3000)])
    await driver.executor.fetch("analyze x_jobs", prepare=False)
    await driver.executor.fetch("update x_jobs set state = 'done'", prepare=False)
    clock.advance(1)
    await driver.enqueue(request(clock, "late", "late"))
    scans = await enqueue_plan_scans(driver, clock)
    assert scans
    assert all(node != "Seq Scan" and rows <= 1 for node, rows in scans), scans
    # The plan a lone enqueue runs once the plan cache has settled on it.
    params = enqueue_one_params(request(clock, "later", "later"), clock.now())
    generic = await plan_of(driver.executor, SQL_ENQUEUE_ONE, params, generic=True)
    assert "Seq Scan on x_jobs" not in generic, generic
