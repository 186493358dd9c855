"""Drive a memory driver's queue to quiescence under a frozen clock, for core's own tests."""

from __future__ import annotations

from typing import Any

from ultimat3.jobs.core import (
    AnyJobHandle,
    FrozenClock,
    JobExecution,
    JobFilter,
    JobState,
    execute_job,
)
from ultimat3.jobs.core.execute import announce_exhausted
from ultimat3.jobs.core.memory import MemoryJobDriver

_WAITING = (JobState.READY, JobState.DELAYED, JobState.SUSPENDED)


async def drain(
    driver: MemoryJobDriver,
    clock: FrozenClock,
    *jobs: AnyJobHandle,
    services: Any = None,
    max_rounds: int = 500,
) -> list[JobExecution]:
    by_name = {handle.name: handle for handle in jobs}
    queues = {handle.queue: 8 for handle in jobs}
    executions: list[JobExecution] = []
    for _ in range(max_rounds):
        batch = await driver.claim(worker_id="w1", slots=queues, visibility_timeout=30)
        for buried in batch.exhausted:
            await announce_exhausted(buried, handle=by_name.get(buried.name))
        for claimed in batch.jobs:
            executions.append(
                await execute_job(
                    claimed, driver=driver, handle=by_name.get(claimed.name), services=services
                )
            )
        if batch.jobs:
            continue
        page = await driver.introspect.list(JobFilter(limit=200))
        due = [row.run_at for row in page.rows if row.state in _WAITING]
        if not due:
            return executions
        clock.set(min(due))
    raise AssertionError("the queue did not go quiet")
