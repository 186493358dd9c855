"""Fleet-wide concurrency on Postgres: two workers, each on a driver of its own, one database.

The first worker has a single slot, held by a run that waits to be released: until it is, every
later row is claimed by the second worker, which knows nothing of that run but what the lease
store in the database says. Waits are bounded polls; nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from support.concurrency import Accounts, Sync, keyed, rows, sync_job

from ultimat3.jobs.core import JobState, JobWorker, job_worker
from ultimat3.jobs.pg import PostgresJobDriver, postgres_job_driver

pytestmark = pytest.mark.pg

PATIENCE_S = 60.0
LINGER_S = 0.05
"""What each run still takes once released: runs a broken cap let overlap are seen overlapping."""


async def until(predicate: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), PATIENCE_S)


async def until_all_done(driver: PostgresJobDriver, count: int) -> None:
    async def poll() -> None:
        while [row.state for row in await rows(driver)] != [JobState.DONE] * count:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), PATIENCE_S)


@pytest.fixture
async def drivers(pg_url: str) -> AsyncIterator[tuple[PostgresJobDriver, PostgresJobDriver]]:
    """Two processes' drivers: each its own pool and lease store, on one database."""
    first, second = postgres_job_driver(pg_url), postgres_job_driver(pg_url)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


def worker(driver: PostgresJobDriver, handle: Any, slots: int) -> JobWorker:
    return job_worker(driver=driver, context=lambda: None, jobs=[handle], concurrency=slots)


async def enqueue(driver: PostgresJobDriver, handle: Any, *inputs: Sync) -> list[str]:
    queued = await driver.enqueue_many([handle.request(i, clock=driver.clock) for i in inputs])
    return [q.id for q in queued]


@asynccontextmanager
async def running(worker: JobWorker, body: Accounts) -> AsyncIterator[JobWorker]:
    """``worker`` started; on the way out ``body``'s runs are released before it stops, as its
    stop waits for them, whatever the block raised."""
    async with worker:
        try:
            yield worker
        finally:
            body.release.set()


async def test_a_keyed_cap_under_wait_holds_one_run_per_key_across_two_workers(
    drivers: tuple[PostgresJobDriver, PostgresJobDriver],
) -> None:
    one, two = drivers
    body = Accounts(linger=LINGER_S)
    handle = sync_job(body.run, concurrency=keyed("wait"))
    await enqueue(one, handle, Sync("a", 0))
    first, second = worker(one, handle, 1), worker(two, handle, 5)
    async with running(first, body):
        await until(lambda: body.started == [("a", 0)])
        await enqueue(two, handle, Sync("a", 1), Sync("a", 2), Sync("b", 0))
        async with running(second, body):
            # "a" is held on the first worker: the second runs "b" and hands "a" back (or, were
            # the cap not held, runs it: the assertions then say so at once).
            await until(
                lambda: (
                    ("b", 0) in body.started
                    and (second.stats.handed_back >= 2 or len(body.started) > 2)
                )
            )
            assert sorted(body.started) == [("a", 0), ("b", 0)]
            assert body.peak == Counter({"a": 1, "b": 1})
            body.release.set()
            await until_all_done(two, 4)
    assert sorted(body.started) == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert body.peak == Counter({"a": 1, "b": 1})
    assert [row.attempt for row in await rows(one)] == [1] * 4  # a hand-back burns no attempt


async def test_a_keyed_cap_under_fail_refuses_a_run_another_workers_run_holds_the_key_for(
    drivers: tuple[PostgresJobDriver, PostgresJobDriver],
) -> None:
    one, two = drivers
    body = Accounts(linger=LINGER_S)
    told: list[tuple[str, str | None]] = []

    async def on_settled(settled: Any) -> None:
        told.append((settled.outcome, settled.code))

    handle = sync_job(body.run, concurrency=keyed("fail"), on_settled=on_settled)
    await enqueue(one, handle, Sync("a", 0))
    first, second = worker(one, handle, 1), worker(two, handle, 5)
    async with running(first, body):
        await until(lambda: body.started == [("a", 0)])
        [refused_id] = await enqueue(two, handle, Sync("a", 1))
        async with running(second, body):
            await until(lambda: second.stats.refused == 1 or len(body.started) > 1)
            assert body.started == [("a", 0)]
            assert second.stats.refused == 1
    refused = {row.id: row for row in await rows(one)}[refused_id]
    assert (refused.state, refused.attempt) == (JobState.FAILED, 0)
    assert (refused.last_error or "").startswith("X_JOB_KEY_BUSY")
    assert sorted(told) == [("completed", None), ("refused", "X_JOB_KEY_BUSY")]
    assert body.started == [("a", 0)]
    assert (first.stats.completed, first.stats.refused) == (1, 0)


async def test_a_plain_cap_holds_across_two_workers(
    drivers: tuple[PostgresJobDriver, PostgresJobDriver],
) -> None:
    one, two = drivers
    body = Accounts(linger=LINGER_S)
    handle = sync_job(body.run, concurrency=2)
    await enqueue(one, handle, *(Sync("a", n) for n in range(6)))
    first, second = worker(one, handle, 1), worker(two, handle, 5)
    async with running(first, body):
        await until(lambda: len(body.started) == 1)
        async with running(second, body):
            # One slot of the cap is the first worker's: the second runs one more of the three
            # it claims, and hands the others back.
            await until(
                lambda: (
                    len(body.started) >= 2
                    and (second.stats.handed_back >= 2 or len(body.started) > 2)
                )
            )
            assert (len(body.started), body.total_peak) == (2, 2)
            body.release.set()
            await until_all_done(two, 6)
    assert sorted(body.started) == [("a", n) for n in range(6)]
    assert body.total_peak == 2
    assert [row.attempt for row in await rows(one)] == [1] * 6


async def test_a_worker_under_a_per_tenant_limit_drains_that_tenants_backlog(
    pg_url: str,
) -> None:
    """The place under the process limits goes back at the body's end, before the slot's ring
    brings the next claim. Given back after the settle (a round trip later), that claim found
    it held and handed its rows back; when the pass had found every slot busy, the freed slots
    rang nothing and the worker waited for good with the tenant's rows due."""
    from ultimat3.jobs.core import LimitConfig, job

    done: list[int] = []

    @job(
        input=dict,
        idempotency_key=lambda i: f"per-tenant:{i['n']}",
        tenant=lambda i: "acme",
        queue="per-tenant",
        name="fleet-per-tenant-backlog",
    )
    async def quick(*, input: dict[str, int]) -> None:
        done.append(input["n"])

    driver = postgres_job_driver(pg_url)
    try:
        await driver.enqueue_many([quick.request({"n": n}) for n in range(20)])
        limited = job_worker(
            driver=driver,
            context=lambda: None,
            jobs=[quick],
            concurrency=4,
            limits=LimitConfig(per_tenant=1),
            idle_poll_max=3600,  # no poll covers for a lost ring
        )
        async with limited:
            await until(lambda: len(done) == 20)
    finally:
        await driver.close()
    assert sorted(done) == list(range(20))
