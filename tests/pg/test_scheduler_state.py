"""The scheduler's state on Postgres: a fire moves the watermark, inserts its jobs, records itself
and announces its queues in one statement — or does none of it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg import AsyncConnection
from psycopg.errors import NumericValueOutOfRange

from ultimat3.jobs.core import (
    AckOptions,
    Enqueued,
    EnqueueRequest,
    FrozenClock,
    JobState,
    new_id,
)
from ultimat3.jobs.core.model import TaskFire
from ultimat3.jobs.pg import PostgresJobDriver, postgres_job_driver
from ultimat3.jobs.pg.scheduler import PostgresSchedulerState, postgres_scheduler_state
from ultimat3.jobs.pg.sql_enqueue import WAKE_CHANNEL

pytestmark = pytest.mark.pg

MINUTE_MS = 60_000
_MARKER = "marker"


@pytest.fixture
def state(driver: PostgresJobDriver, clock: FrozenClock) -> PostgresSchedulerState:
    return postgres_scheduler_state(driver.executor, clock=clock)


@pytest.fixture
async def other_node(pg_url: str, clock: FrozenClock) -> AsyncIterator[PostgresSchedulerState]:
    """The state as another scheduler process sees it: over a pool of its own."""
    driver = postgres_job_driver(pg_url, clock=clock)
    yield postgres_scheduler_state(driver.executor, clock=clock)
    await driver.close()


@pytest.fixture
async def listener(pg_url: str) -> AsyncIterator[AsyncConnection[Any]]:
    async with await AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(f"listen {WAKE_CHANNEL}")
        yield conn


def request(clock: FrozenClock, **fields: Any) -> EnqueueRequest:
    values: dict[str, Any] = {
        "id": new_id(),
        "run_id": new_id(),
        "name": "nightly-digest",
        "queue": "digests",
        "input": {"day": "2026-03-02"},
        "idempotency_key": f"digest:{new_id()}",
        "tenant_id": None,
        "max_attempts": 3,
        "run_at": clock.now(),
    }
    values.update(fields)
    return EnqueueRequest(**values)


async def job_count(driver: PostgresJobDriver) -> int:
    rows = await driver.executor.fetch("select count(*) from x_jobs")
    return int(rows[0][0])


async def announced(listener: AsyncConnection[Any], pg_url: str) -> list[str]:
    """The queues announced by transactions committed before this call, in order (a marker sent
    now arrives after all of them)."""
    async with await AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("select pg_notify(%s, %s)", (WAKE_CHANNEL, _MARKER))
    queues: list[str] = []
    async for notify in listener.notifies(timeout=10):
        if notify.payload == _MARKER:
            return queues
        queues.append(notify.payload)
    raise AssertionError("the marker notification never arrived")


async def test_of_two_nodes_firing_one_occurrence_exactly_one_inserts_its_jobs(
    state: PostgresSchedulerState,
    other_node: PostgresSchedulerState,
    driver: PostgresJobDriver,
    clock: FrozenClock,
) -> None:
    await state.arm("digest", 0)
    for minute in range(1, 21):
        fires = await asyncio.gather(
            *(
                node.fire(
                    "digest",
                    minute * MINUTE_MS,
                    [request(clock), request(clock)],
                    previous=(minute - 1) * MINUTE_MS,
                )
                for node in (state, other_node)
            )
        )
        assert sum(fired is not None for fired in fires) == 1
    assert await job_count(driver) == 40
    assert await state.watermarks(["digest"]) == {"digest": 20 * MINUTE_MS}


async def test_of_two_nodes_firing_a_first_occurrence_exactly_one_inserts_its_jobs(
    state: PostgresSchedulerState,
    other_node: PostgresSchedulerState,
    driver: PostgresJobDriver,
    clock: FrozenClock,
) -> None:
    for n in range(20):
        fires = await asyncio.gather(
            *(
                node.fire(f"task-{n}", MINUTE_MS, [request(clock)], previous=None)
                for node in (state, other_node)
            )
        )
        assert sum(fired is not None for fired in fires) == 1
    assert await job_count(driver) == 20


async def test_a_fire_that_fails_moves_no_watermark(
    state: PostgresSchedulerState, driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    await state.arm("digest", MINUTE_MS)
    unstorable = request(clock, max_attempts=2**40)  # past x_jobs.max_attempts' integer range
    with pytest.raises(NumericValueOutOfRange):
        await state.fire("digest", 2 * MINUTE_MS, [request(clock), unstorable], previous=MINUTE_MS)
    assert await state.watermarks(["digest"]) == {"digest": MINUTE_MS}
    assert await job_count(driver) == 0
    assert await driver.introspect.task_fires() == []


async def test_a_fire_records_the_occurrence_it_dispatched(
    state: PostgresSchedulerState, driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    await state.arm("digest", MINUTE_MS)
    fired = await state.fire(
        "digest", 5 * MINUTE_MS, [request(clock)], previous=MINUTE_MS, fired_ms=2 * MINUTE_MS
    )
    assert fired is not None
    assert await driver.introspect.task_fires() == [TaskFire("digest", 2 * MINUTE_MS, clock.now())]


async def test_a_refused_fire_records_nothing(
    state: PostgresSchedulerState, driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    await state.arm("digest", 2 * MINUTE_MS)
    assert await state.fire("digest", 3 * MINUTE_MS, [], previous=MINUTE_MS) is None
    assert await driver.introspect.task_fires() == []


async def test_a_fire_announces_each_queue_it_filled_once(
    state: PostgresSchedulerState,
    driver: PostgresJobDriver,
    listener: AsyncConnection[Any],
    pg_url: str,
    clock: FrozenClock,
) -> None:
    await driver.enqueue(request(clock, queue="held", idempotency_key="held"))
    assert await announced(listener, pg_url) == ["held"]
    requests = [
        request(clock, queue="digests"),
        request(clock, queue="digests"),
        request(clock, queue="reports"),
        request(clock, queue="held", idempotency_key="held"),  # deduped: announces nothing
    ]
    assert await state.fire("digest", MINUTE_MS, requests, previous=None)
    assert sorted(await announced(listener, pg_url)) == ["digests", "reports"]


async def test_a_refused_fire_announces_nothing(
    state: PostgresSchedulerState,
    listener: AsyncConnection[Any],
    pg_url: str,
    clock: FrozenClock,
) -> None:
    await state.arm("digest", 2 * MINUTE_MS)
    assert await state.fire("digest", 3 * MINUTE_MS, [request(clock)], previous=MINUTE_MS) is None
    assert await announced(listener, pg_url) == []


async def test_requests_of_one_fire_sharing_a_key_insert_one_row(
    state: PostgresSchedulerState, driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    first, second = request(clock, idempotency_key="k"), request(clock, idempotency_key="k")
    fired = await state.fire("digest", MINUTE_MS, [first, second], previous=None)
    assert fired == [
        Enqueued(first.id, first.run_id),
        Enqueued(first.id, first.run_id, deduped=True),
    ]
    assert await job_count(driver) == 1


async def test_a_fire_under_the_id_of_a_finished_job_inserts_nothing(
    state: PostgresSchedulerState, driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    finished = request(clock)
    await driver.enqueue(finished)
    (claimed,) = (
        await driver.claim(worker_id="w1", slots={"digests": 1}, visibility_timeout=30)
    ).jobs
    assert await driver.ack(claimed.id, AckOptions(claimed.claim.worker_id, claimed.claim.claim))
    again = request(clock, id=finished.id)
    fired = await state.fire("digest", MINUTE_MS, [again], previous=None)
    assert fired == [Enqueued(finished.id, finished.run_id, deduped=True)]
    detail = await driver.introspect.get(finished.id)
    assert detail is not None
    assert detail.row.state == JobState.DONE
