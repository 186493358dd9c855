"""Crashes and races between workers on one queue: what at-least-once does and does not allow."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from support.eventually import run_clock, settle, until
from support.jobs import declared

from ultimat3.jobs.core import (
    FrozenClock,
    JobFilter,
    JobState,
    job_worker,
)
from ultimat3.jobs.core.memory import MemoryJobDriver


@dataclass
class Work:
    n: int
    seconds: float


class Overlap:
    """Bodies that take ``seconds`` of the frozen clock and record any overlap per job."""

    def __init__(self, clock: FrozenClock) -> None:
        self.clock = clock
        self.active: Counter[int] = Counter()
        self.runs: Counter[int] = Counter()
        self.overlaps: list[int] = []

    async def run(self, *, input: Work) -> None:
        self.active[input.n] += 1
        self.runs[input.n] += 1
        if self.active[input.n] > 1:
            self.overlaps.append(input.n)
        try:
            await self.clock.sleep(input.seconds)
        finally:
            self.active[input.n] -= 1


def work_job(body: Any) -> Any:
    return declared(body, input=Work, key=lambda i: f"work:{i.n}")


async def states(driver: MemoryJobDriver) -> Counter[JobState]:
    page = await driver.introspect.list(JobFilter(limit=200))
    return Counter(row.state for row in page.rows)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_two_workers_never_run_one_claimed_row_at_once(
    driver: MemoryJobDriver, clock: FrozenClock, seed: int
) -> None:
    rng = random.Random(seed)
    body = Overlap(clock)
    handle = work_job(body.run)
    workers = [
        job_worker(
            driver=driver,
            context=lambda: None,
            jobs=[handle],
            concurrency=3,
            visibility_timeout=30,
            clock=clock,
            worker_id=f"w{i}",
        )
        for i in range(2)
    ]
    for worker in workers:
        await worker.start()
    for n in range(20):
        # Some run for several visibility timeouts: only the renewals keep them from a second
        # worker.
        await handle.enqueue(Work(n, rng.choice([1, 5, 29, 45, 95])))
    await run_clock(clock, 600)
    for worker in workers:
        await worker.stop()
    assert body.overlaps == []
    assert body.runs == Counter(range(20))
    assert await states(driver) == Counter({JobState.DONE: 20})


async def test_a_job_whose_worker_died_is_redelivered_once_its_lease_lapses(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Overlap(clock)
    handle = work_job(body.run)
    before = asyncio.all_tasks()
    doomed = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], clock=clock, worker_id="doomed"
    )
    await doomed.start()
    queued = await handle.enqueue(Work(1, 3600))
    await until(lambda: body.runs[1] == 1)
    # The worker dies: every task it runs is cancelled; nothing settles, nothing renews.
    for task in asyncio.all_tasks() - before:
        task.cancel()
    await settle()
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.state, detail.row.worker_id) == (JobState.RUNNING, "doomed")

    survivor = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], clock=clock, worker_id="survivor"
    )
    await survivor.start()
    await run_clock(clock, 29)
    assert body.runs[1] == 1  # still inside the dead worker's lease: nobody may take it
    await run_clock(clock, 3)
    assert body.runs[1] == 2
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.worker_id, detail.row.attempt) == ("survivor", 2)
    await run_clock(clock, 3600)
    await survivor.stop()
    await doomed.stop()  # only unsubscribes what is left of it
    assert await states(driver) == Counter({JobState.DONE: 1})


async def test_a_drained_worker_loses_nothing_and_burns_no_attempt(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Overlap(clock)
    handle = work_job(body.run)
    leaving = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], concurrency=3, clock=clock
    )
    await leaving.start()
    for n in range(10):
        await handle.enqueue(Work(n, 60))
    await until(lambda: sum(body.runs.values()) == 3)
    await leaving.drain("SIGTERM")
    assert leaving.stats.interrupted == 3

    replacement = job_worker(
        driver=driver, context=lambda: None, jobs=[handle], concurrency=10, clock=clock
    )
    await replacement.start()
    await run_clock(clock, 120)
    await replacement.stop()
    page = await driver.introspect.list(JobFilter(limit=200))
    assert sorted((row.state, row.attempt) for row in page.rows) == [(JobState.DONE, 1)] * 10
    totals = await driver.introspect.counter_totals(since=clock.now() - timedelta(days=1))
    assert [(t.done, t.retried, t.failed, t.dead) for t in totals] == [(10, 0, 0, 0)]
