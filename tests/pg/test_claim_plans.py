"""Plans that must not read the whole of x_jobs: the claim's under statistics that mislead
the planner, and a remove's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pg.plans import scans_run

from ultimat3.jobs.core import EnqueueRequest, FrozenClock, new_id
from ultimat3.jobs.pg import PostgresJobDriver
from ultimat3.jobs.pg.sql_claim import SQL_CLAIM
from ultimat3.jobs.pg.sql_operator import SQL_JOB_REMOVE

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
        "queues": ["q"],
        "limits": [10],
        "now": now,
        "lease_until": now + timedelta(seconds=30),
        "worker_id": "w2",
        "drop": [],
        "bucket": now.replace(second=0, microsecond=0),
        "synchronous_commit": None,
    }
    scans = await scans_run(driver.executor, SQL_CLAIM, params, "x_jobs")
    assert scans
    assert all(node != "Seq Scan" for node, _ in scans), scans


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
