"""Batched settles: concurrent acks share a statement, each row still fenced on its own claim."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from pg.plans import plan_of

from ultimat3.jobs.core import (
    AckOptions,
    ClaimedJob,
    EnqueueRequest,
    FrozenClock,
    NackOptions,
    new_id,
)
from ultimat3.jobs.pg import PostgresJobDriver
from ultimat3.jobs.pg.sql_operator import SQL_JOB_CANCEL, SQL_JOB_REQUEUE
from ultimat3.jobs.pg.sql_settle import (
    SQL_ACK,
    SQL_HEARTBEAT,
    SQL_NACK,
    SQL_RECORD_PROGRESS,
    SQL_SAVE_STEP,
)

pytestmark = pytest.mark.pg


async def claimed(driver: PostgresJobDriver, count: int) -> list[ClaimedJob]:
    now = driver.clock.now()
    await driver.enqueue_many(
        [
            EnqueueRequest(new_id(), new_id(), "n", "q", None, new_id(), None, 3, now)
            for _ in range(count)
        ]
    )
    batch = await driver.claim(worker_id="w1", slots={"q": count}, visibility_timeout=30)
    assert len(batch.jobs) == count
    return list(batch.jobs)


def statements_of(
    driver: PostgresJobDriver, monkeypatch: pytest.MonkeyPatch, query: str
) -> list[int]:
    """Rows carried by each run of ``query`` from now on."""
    seen: list[int] = []
    fetch = driver.executor.fetch

    async def counted(text: str, params: Any = None, **options: Any) -> Any:
        if text == query:
            seen.append(len(json.loads(params["rows"])))
        return await fetch(text, params, **options)

    monkeypatch.setattr(driver.executor, "fetch", counted)
    return seen


def ack_of(job: ClaimedJob) -> AckOptions:
    return AckOptions(job.claim.worker_id, job.claim.claim, duration_ms=2)


async def test_concurrent_acks_share_one_statement(
    driver: PostgresJobDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = await claimed(driver, 100)
    statements = statements_of(driver, monkeypatch, SQL_ACK)
    answers = await asyncio.gather(*(driver.ack(job.id, ack_of(job)) for job in jobs))
    assert answers == [True] * 100
    assert statements == [100]


async def test_a_stale_ack_in_a_batch_answers_false_and_the_others_land(
    driver: PostgresJobDriver,
) -> None:
    jobs = await claimed(driver, 3)
    stale = AckOptions("w1", "not-the-claim")
    answers = await asyncio.gather(
        driver.ack(jobs[0].id, ack_of(jobs[0])),
        driver.ack(jobs[1].id, stale),
        driver.ack(jobs[2].id, ack_of(jobs[2])),
    )
    assert answers == [True, False, True]
    [stats] = await driver.stats()
    assert (stats.done, stats.running) == (2, 1)


async def test_a_batched_ack_counts_each_row_once_with_its_duration(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    jobs = await claimed(driver, 10)
    await asyncio.gather(*(driver.ack(job.id, ack_of(job)) for job in jobs))
    since = clock.now() - timedelta(hours=1)
    [totals] = await driver.introspect.counter_totals(since=since)
    assert (totals.done, totals.duration_ms) == (10, 20)


async def test_the_same_row_acked_twice_at_once_lands_once_and_both_hear_it(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    """The two acks go in two statements (a batch never holds one row twice); the second finds
    the row done under its own claim."""
    [job] = await claimed(driver, 1)
    answers = await asyncio.gather(driver.ack(job.id, ack_of(job)), driver.ack(job.id, ack_of(job)))
    assert answers == [True, True]
    [totals] = await driver.introspect.counter_totals(since=clock.now() - timedelta(hours=1))
    assert totals.done == 1


async def test_concurrent_nacks_share_one_statement_each_to_its_own_state(
    driver: PostgresJobDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    retry, dead, parked = await claimed(driver, 3)
    statements = statements_of(driver, monkeypatch, SQL_NACK)
    later = driver.clock.now() + timedelta(minutes=1)
    answers = await asyncio.gather(
        driver.nack(retry.id, NackOptions("w1", retry.claim.claim, error="boom", run_at=later)),
        driver.nack(dead.id, NackOptions("w1", dead.claim.claim, error="bad", dead_letter=True)),
        driver.nack(
            parked.id, NackOptions("w1", parked.claim.claim, park=True, count_attempt=False)
        ),
    )
    assert answers == [True, True, True]
    assert statements == [3]
    states = {job.id: (await driver.introspect.get(job.id)) for job in (retry, dead, parked)}
    assert {job_id: detail.row.state.value for job_id, detail in states.items() if detail} == {
        retry.id: "ready",
        dead.id: "dead",
        parked.id: "suspended",
    }


async def test_concurrent_heartbeats_share_one_statement(
    driver: PostgresJobDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = await claimed(driver, 20)
    statements = statements_of(driver, monkeypatch, SQL_HEARTBEAT)
    answers = await asyncio.gather(*(driver.heartbeat(job.id, job.claim, 60) for job in jobs))
    assert answers == [True] * 20
    assert statements == [20]


async def analyzed_while_nothing_lived(driver: PostgresJobDriver) -> None:
    """The last ANALYZE saw finished rows only: to the planner the live-key index is empty."""
    for job in await claimed(driver, 200):
        await driver.ack(job.id, AckOptions(job.claim.worker_id, job.claim.claim))
    await driver.executor.fetch("analyze x_jobs", prepare=False)


async def analyzed_while_few_ran(driver: PostgresJobDriver) -> None:
    await claimed(driver, 10)
    await driver.executor.fetch("analyze x_jobs", prepare=False)


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
@pytest.mark.parametrize("statistics", [analyzed_while_few_ran, analyzed_while_nothing_lived])
async def test_fenced_writes_find_their_rows_by_primary_key_whatever_the_statistics_say(
    driver: PostgresJobDriver, statistics: Any, generic: bool
) -> None:
    """Statistics taken while few rows ran, or while none lived at all, then thousands of rows
    running: a batch of ten settles (and each fenced or operator write on one row) must still
    look its rows up by id, not read every running row through an index the statistics make
    look small (the lease index took 14 ms
    beside 30,000 running rows; the live-key index, read whole for each batch, ~80 ms an ack
    of 50 beside 8,000 live rows — 0.6 ms by id)."""
    await statistics(driver)
    waiting = await claimed(driver, 10)
    now = driver.clock.now()
    await driver.enqueue_many(
        [
            EnqueueRequest(new_id(), new_id(), "n", "q", None, new_id(), None, 3, now)
            for _ in range(3000)
        ]
    )
    others = await driver.claim(worker_id="w2", slots={"q": 3000}, visibility_timeout=30)
    assert len(others.jobs) == 3000
    refs = [(job.id, job.claim.worker_id, job.claim.claim) for job in waiting]
    bucket = now.replace(second=0, microsecond=0)
    lease_until = (now + timedelta(seconds=30)).isoformat()
    one = waiting[0]
    for query, params in (
        (SQL_ACK, {"rows": [[*ref, 1] for ref in refs], "now": now, "bucket": bucket}),
        (
            SQL_NACK,
            {
                "rows": [[*ref, "ready", "e", None, True, "retried", 1] for ref in refs],
                "now": now,
                "bucket": bucket,
            },
        ),
        (SQL_HEARTBEAT, {"rows": [[*ref, lease_until] for ref in refs]}),
        (
            SQL_RECORD_PROGRESS,
            {"id": one.id, "worker_id": "w1", "claim": one.claim.claim, "progress": "{}"},
        ),
        (
            SQL_SAVE_STEP,
            {
                "job_id": one.id,
                "worker_id": "w1",
                "claim": one.claim.claim,
                "run_id": one.run_id,
                "name": "s",
                "seq": 1,
                "output": "1",
                "completed": True,
                "kind": "run",
                "now": now,
            },
        ),
        (SQL_JOB_CANCEL, {"id": one.id, "error": "e", "now": now}),
        (SQL_JOB_REQUEUE, {"id": one.id, "from_step": None, "now": now}),
    ):
        if "rows" in params:
            params = {**params, "rows": json.dumps(params["rows"]), "count": len(refs)}
        params = {**params, "synchronous_commit": None}
        plan = await plan_of(driver.executor, query, params, generic=generic)
        assert "x_jobs_pkey" in plan, plan
        assert "Seq Scan on x_jobs" not in plan, plan
        # Another index only where the plan searches it (a requeue looks up its key's holder).
        lines = plan.splitlines()
        for at, line in enumerate(lines):
            if re.search(r"x_jobs_\w+_idx", line):
                assert query is SQL_JOB_REQUEUE, plan
                assert "Index Cond" in lines[at + 1], plan
