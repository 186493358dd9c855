"""The memory driver's indexes agree with its rows after any sequence of operations.

A claim reads only the running rows of its queue and the heap of its waiting ones, and a removed
row's steps go with the last row of its run; all rest on indexes every operation keeps. A wrong
index would not fail loudly: a row would silently never be claimed again, or keep steps it no
longer owns.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from ultimat3.jobs.core import (
    AckOptions,
    BulkFilter,
    EnqueueRequest,
    FrozenClock,
    JobState,
    NackOptions,
    memory_job_driver,
    new_id,
)
from ultimat3.jobs.core.errors import JobsError
from ultimat3.jobs.core.memory.driver import MemoryJobDriver
from ultimat3.jobs.core.memory.state import WAITING_STATES

OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "enqueue",
                "enqueue-later",
                "claim",
                "ack",
                "nack",
                "cancel",
                "requeue",
                "promote",
                "remove",
                "lapse",
                "purge",
            ]
        ),
        st.integers(min_value=0, max_value=5),
    ),
    max_size=40,
)


def check_indexes(driver: MemoryJobDriver) -> None:
    state = driver._state
    rows = state.rows.values()
    running = {(row.queue, row.id) for row in rows if row.state is JobState.RUNNING}
    indexed = {(queue, row_id) for queue, held in state.running_in_queue.items() for row_id in held}
    assert indexed == running
    waiting = {(row.queue, row.run_at, row.id) for row in rows if row.state in WAITING_STATES}
    entries = {(queue, *entry) for queue, heap in state.due_in_queue.items() for entry in heap}
    assert waiting <= entries
    assert Counter(queue for queue, _, _ in waiting) == +Counter(state.waiting_in_queue)
    assert Counter(row.run_id for row in state.rows.values()) == Counter(state.rows_in_run)
    assert set(state.steps) <= set(state.rows_in_run)


async def run(operations: list[tuple[str, int]]) -> None:
    clock = FrozenClock()
    driver = memory_job_driver(clock=clock)
    claimed = []
    for operation, n in operations:
        queue = f"q{n % 2}"
        try:
            if operation in ("enqueue", "enqueue-later"):
                run_id = f"run{n}"  # a few rows share a run
                run_at = clock.now() + timedelta(seconds=0 if operation == "enqueue" else n + 1)
                await driver.enqueue(
                    EnqueueRequest(new_id(), run_id, "j", queue, None, f"k{n}", None, 2, run_at)
                )
            elif operation == "claim":
                batch = await driver.claim(
                    worker_id="w", slots={queue: n + 1}, visibility_timeout=5
                )
                claimed += batch.jobs
            elif operation in ("ack", "nack") and claimed:
                job = claimed.pop(n % len(claimed))
                if operation == "ack":
                    await driver.ack(job.id, AckOptions(job.claim.worker_id, job.claim.claim))
                else:
                    await driver.nack(
                        job.id, NackOptions(job.claim.worker_id, job.claim.claim, error="e")
                    )
            elif operation in ("cancel", "requeue", "promote", "remove") and driver._state.rows:
                ids = sorted(driver._state.rows)
                job_id = ids[n % len(ids)]
                if operation == "cancel":
                    await driver.introspect.cancel(job_id)
                elif operation == "requeue":
                    await driver.introspect.requeue(job_id)
                elif operation == "promote":
                    await driver.introspect.promote(job_id)
                else:
                    await driver.introspect.remove(job_id)
            elif operation == "lapse":
                clock.advance(10)
            elif operation == "purge":
                await driver.introspect.remove_many(BulkFilter(state=JobState.DONE))
        except JobsError:
            pass  # a refusal (requeue of a live row, remove of a running one) changes nothing
        check_indexes(driver)


@settings(max_examples=200, deadline=None)
@given(OPERATIONS)
def test_the_indexes_agree_with_the_rows(operations: list[tuple[str, int]]) -> None:
    asyncio.run(run(operations))


def test_the_waiting_heap_sheds_its_stale_entries() -> None:
    """Rows that keep leaving and re-entering the waiting states leave stale entries behind; the
    heap is rebuilt before those outnumber the rows that wait."""

    async def churn() -> None:
        clock = FrozenClock()
        driver = memory_job_driver(clock=clock)
        later = clock.now() + timedelta(hours=1)
        ids = [new_id() for _ in range(10)]
        for job_id in ids:
            await driver.enqueue(
                EnqueueRequest(job_id, job_id, "j", "q", None, job_id, None, 1, later)
            )
        for _ in range(100):
            for job_id in ids:
                await driver.introspect.cancel(job_id)
                await driver.introspect.requeue(job_id)
                clock.advance(0.001)
        state = driver._state
        assert state.waiting_in_queue["q"] == 10
        assert len(state.due_in_queue["q"]) <= 2 * 10 + 64 + 1
        check_indexes(driver)
        batch = await driver.claim(worker_id="w", slots={"q": 20}, visibility_timeout=5)
        assert sorted(job.id for job in batch.jobs) == sorted(ids)

    asyncio.run(churn())
