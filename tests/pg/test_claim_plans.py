"""Plans that must not read the whole of x_jobs: the claim's under statistics that mislead
the planner, a remove's, and the metrics' stats read beside many done rows. And the claim and
the settles, run again and again, are planned once: the plan cache settles on one plan for them
instead of planning every call anew."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from pg.plans import as_prepared, plan_of, scans_run

from ultimat3.jobs.core import (
    AckOptions,
    EnqueueRequest,
    FrozenClock,
    NackOptions,
    new_id,
    without_done,
)
from ultimat3.jobs.pg import PostgresJobDriver, postgres_job_driver
from ultimat3.jobs.pg.sql_claim import SQL_CLAIM, SQL_CLAIM_HELD
from ultimat3.jobs.pg.sql_operator import SQL_JOB_REMOVE
from ultimat3.jobs.pg.sql_read import SQL_STATS_WITHOUT_DONE
from ultimat3.jobs.pg.sql_settle import SQL_ACK, SQL_HEARTBEAT, SQL_NACK

pytestmark = pytest.mark.pg


async def test_a_claim_reads_no_table_for_leases_when_none_lapsed(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    """Statistics taken while most rows ran, then those rows finished: the claim must not read
    the whole table looking for lapsed leases (the planner expected thousands and chose a
    sequential scan, on every claim, of a table that keeps its finished rows)."""
    now = clock.now()
    await driver.enqueue_many(
        [
            EnqueueRequest(new_id(), new_id(), "n", "q", None, new_id(), None, 3, now)
            for _ in range(10_000)
        ]
    )
    await driver.claim(worker_id="w1", slots={"q": 9_000}, visibility_timeout=30)
    await driver.executor.fetch("analyze x_jobs", prepare=False)
    await driver.executor.fetch(
        "update x_jobs set state = 'done', lease_until = null where state = 'running'",
        prepare=False,
    )
    clock.advance(60)
    now = clock.now()
    params = {
        "slots": '[{"queue": "q", "free": 10}]',
        "now": now,
        "lease_until": now + timedelta(seconds=30),
        "worker_id": "w2",
        "claim": new_id(),
        "drop": [],
        "bucket": now.replace(second=0, microsecond=0),
        "synchronous_commit": None,
    }
    scans = await scans_run(driver.executor, SQL_CLAIM, params, "x_jobs")
    assert scans
    assert all(node != "Seq Scan" for node, _ in scans), scans
    # The plan every claim runs once the plan cache has settled on it.
    generic = await plan_of(driver.executor, SQL_CLAIM, params, generic=True)
    assert "Seq Scan on x_jobs" not in generic, generic


async def test_taking_back_a_lost_claims_rows_reads_them_through_their_indexes(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    """Run after a claim's answer was lost, beside thousands of rows running and finished: it
    reads the rows under that claim's lease and the rows it buried, not the table."""
    now = clock.now()
    await driver.enqueue_many(
        [
            EnqueueRequest(new_id(), new_id(), "n", "q", None, new_id(), None, 3, now)
            for _ in range(6_000)
        ]
    )
    for _ in range(50):
        batch = await driver.claim(worker_id="w1", slots={"q": 100}, visibility_timeout=30)
        clock.advance(1)
    await driver.executor.fetch(
        "update x_jobs set state = 'done' where state = 'running' and lease_until < %(t)s",
        {"t": clock.now()},
    )
    await driver.executor.fetch("analyze x_jobs", prepare=False)
    held = batch.jobs[0]
    params = {
        "queues": ["q"],
        "worker_id": "w1",
        "claim": held.claim.claim,
        "lease_until": held.lease_until,
    }
    rows = await driver.executor.fetch(SQL_CLAIM_HELD, params)
    assert sorted(row[1] for row in rows) == sorted(job.id for job in batch.jobs)
    scans = await scans_run(driver.executor, SQL_CLAIM_HELD, params, "x_jobs")
    assert scans == [("Index Scan", 100), ("Index Scan", 0)], scans
    generic = await plan_of(driver.executor, SQL_CLAIM_HELD, params, generic=True)
    assert "x_jobs_lapse_idx" in generic, generic
    assert "x_jobs_buried_idx" in generic, generic


async def test_removing_a_job_without_steps_reads_no_other_row(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    """Whether another row shares a run is asked of x_jobs without an index: only a run with
    steps to keep or drop asks it, so removing a step-less job reads its own row and no more."""
    now = clock.now()
    requests = [
        EnqueueRequest(new_id(), new_id(), "n", "q", None, new_id(), None, 3, now)
        for _ in range(2_000)
    ]
    await driver.enqueue_many(requests)
    scans = await scans_run(driver.executor, SQL_JOB_REMOVE, {"id": requests[0].id}, "x_jobs")
    assert scans
    assert all(node != "Seq Scan" and rows <= 1 for node, rows in scans), scans


async def test_stats_without_done_reads_only_the_rows_not_done(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    """What a metrics scrape reads: beside 5,000 done rows, only the dozen in other states,
    each through a partial index, whatever the plan cache settles on."""
    now = clock.now()
    await driver.enqueue_many(
        [
            EnqueueRequest(new_id(), new_id(), "n", "q", None, new_id(), None, 3, now)
            for _ in range(5_012)
        ]
    )
    await driver.executor.fetch(
        "update x_jobs set state = 'done', finished_at = run_at"
        " where id in (select id from x_jobs order by id limit 5000)",
        prepare=False,
    )
    batch = await driver.claim(worker_id="w", slots={"q": 6}, visibility_timeout=30)
    dead, failed, buried, *_ = batch.jobs
    assert await driver.nack(dead.id, NackOptions("w", dead.claim.claim, "x", dead_letter=True))
    assert await driver.nack(failed.id, NackOptions("w", failed.claim.claim, "x", fail=True))
    # A lapsed final attempt, as the claim buries it: dead, still under its claim's token.
    await driver.executor.fetch(
        "update x_jobs set state = 'dead', lease_until = null where id = %(id)s",
        {"id": buried.id},
        prepare=False,
    )
    await driver.executor.fetch("vacuum analyze x_jobs", prepare=False)
    params = {"now": clock.now()}
    scans = await scans_run(driver.executor, SQL_STATS_WITHOUT_DONE, params, "x_jobs")
    assert all(node != "Seq Scan" for node, _ in scans), scans
    # The 12 rows not done (and the older versions of those a claim moved), none done.
    assert 12 <= sum(rows for _, rows in scans) <= 24, scans
    generic = await plan_of(driver.executor, SQL_STATS_WITHOUT_DONE, params, generic=True)
    assert "Seq Scan on x_jobs" not in generic, generic
    (entry,) = await driver.stats(include_done=False)
    assert (entry.ready, entry.running, entry.dead, entry.failed) == (6, 3, 2, 1)
    assert [entry] == without_done(await driver.stats())


async def test_the_claim_and_the_settles_are_planned_once_not_on_every_call(
    pg_url: str, clock: FrozenClock
) -> None:
    """Small batches beside a backlog, where a plan made for the call's own values looks
    cheapest: after its first runs each statement still runs the one plan the cache keeps
    (generic), not a plan made again for every call (custom): planning took most of the server
    time of a claim of 50, and a quarter of an ack of five."""
    conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True, prepare_threshold=0)
    driver = postgres_job_driver(conn, clock=clock)
    try:
        for _ in range(20):  # a backlog of 20,000 rows, enqueued over a second
            now = clock.now()
            await driver.enqueue_many(
                [
                    EnqueueRequest(new_id(), new_id(), "n", "q", None, new_id(), None, 3, now)
                    for _ in range(1_000)
                ]
            )
            clock.advance(0.05)
        await conn.execute("vacuum analyze")
        clock.advance(1)
        for turn in range(30):
            batch = await driver.claim(worker_id="w", slots={"q": 5}, visibility_timeout=30)
            refs = [(job.id, job.claim) for job in batch.jobs]
            assert len(refs) == 5
            renewed = [driver.heartbeat(job_id, ref, 30) for job_id, ref in refs]
            assert all(await asyncio.gather(*renewed))
            if turn % 2:
                settles = [driver.ack(i, AckOptions(r.worker_id, r.claim, 1)) for i, r in refs]
            else:
                settles = [driver.nack(i, NackOptions(r.worker_id, r.claim, "x")) for i, r in refs]
            assert all(await asyncio.gather(*settles))
        cursor = await conn.execute(
            "select statement, generic_plans, custom_plans from pg_prepared_statements"
        )
        plans = {text: (generic, custom) for text, generic, custom in await cursor.fetchall()}
        failures = []
        for sql in (SQL_CLAIM, SQL_ACK, SQL_NACK, SQL_HEARTBEAT):
            generic, custom = plans[as_prepared(sql)[0]]
            failures.append((sql.splitlines()[1], generic, custom))
        assert all(custom <= 5 and generic >= 10 for _, generic, custom in failures), failures
    finally:
        await driver.close()
        await conn.close()
