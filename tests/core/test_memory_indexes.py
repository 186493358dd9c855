"""The memory driver's indexes agree with its rows after any sequence of operations.

A claim reads only the live rows of its queue, and a removed row's steps go with the last row of
its run; both rest on indexes every operation keeps. A wrong index would not fail loudly: a row
would silently never be claimed again, or keep steps it no longer owns.
"""

from __future__ import annotations

import asyncio
from collections import Counter

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
from ultimat3.jobs.core.model import LIVE_STATES

OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(
            ["enqueue", "claim", "ack", "nack", "cancel", "requeue", "remove", "lapse", "purge"]
        ),
        st.integers(min_value=0, max_value=5),
    ),
    max_size=40,
)


def check_indexes(driver: MemoryJobDriver) -> None:
    state = driver._state
    live = {(row.queue, row.id) for row in state.rows.values() if row.state in LIVE_STATES}
    indexed = {(queue, row_id) for queue, rows in state.live_in_queue.items() for row_id in rows}
    assert indexed == live
    assert Counter(row.run_id for row in state.rows.values()) == Counter(state.rows_in_run)
    assert set(state.steps) <= set(state.rows_in_run)


async def run(operations: list[tuple[str, int]]) -> None:
    clock = FrozenClock()
    driver = memory_job_driver(clock=clock)
    claimed = []
    for operation, n in operations:
        queue = f"q{n % 2}"
        try:
            if operation == "enqueue":
                run_id = f"run{n}"  # a few rows share a run
                await driver.enqueue(
                    EnqueueRequest(
                        new_id(), run_id, "j", queue, None, f"k{n}", None, 2, clock.now()
                    )
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
            elif operation in ("cancel", "requeue", "remove") and driver._state.rows:
                ids = sorted(driver._state.rows)
                job_id = ids[n % len(ids)]
                if operation == "cancel":
                    await driver.introspect.cancel(job_id)
                elif operation == "requeue":
                    await driver.introspect.requeue(job_id)
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
