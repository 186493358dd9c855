"""Bulk operator actions at scale: a call walks only what its budget moves, and its ``remaining``
stays exact (the memory driver's) however it is counted."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from ultimat3.jobs.core import (
    BulkFilter,
    BulkResult,
    EnqueueRequest,
    FrozenClock,
    JobFilter,
    JobState,
    NackOptions,
    memory_job_driver,
)
from ultimat3.jobs.core.constants import MAX_BULK_ROWS, MAX_JOB_PAGE
from ultimat3.jobs.core.cursor import job_cursor
from ultimat3.jobs.core.memory.driver import MemoryJobDriver
from ultimat3.jobs.redis import RedisJobDriver
from ultimat3.jobs.redis.introspect import _BULK_CHUNK
from ultimat3.jobs.redis.paging import _PAGE

RequestBuilder = Callable[..., EnqueueRequest]
Driver = RedisJobDriver | MemoryJobDriver

WALK_PAGES = MAX_BULK_ROWS // _PAGE + 1
"""The pages a walk reads to hand a whole budget's rows over (and learn it has more)."""


def _count_scripts(driver: RedisJobDriver, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    calls: Counter[str] = Counter()
    original = driver.namespace.call

    async def counted(name: str, *args: Any, **options: Any) -> Any:
        calls[name] += 1
        return await original(name, *args, **options)

    monkeypatch.setattr(driver.namespace, "call", counted)
    return calls


async def _cancelled(driver: Driver, requests: list[EnqueueRequest]) -> None:
    await driver.enqueue_many(requests)
    for start in range(0, len(requests), 500):
        chunk = requests[start : start + 500]
        await asyncio.gather(*(driver.introspect.cancel(r.id) for r in chunk))


Setup = Callable[[RedisJobDriver, RequestBuilder], Awaitable[None]]


async def _cancelled_rows(driver: RedisJobDriver, new_request: RequestBuilder) -> None:
    await _cancelled(driver, [new_request() for _ in range(3 * MAX_BULK_ROWS)])


async def _delayed_rows(driver: RedisJobDriver, new_request: RequestBuilder) -> None:
    rows = [replace(new_request(delay=60), tenant_id="t") for _ in range(3 * MAX_BULK_ROWS)]
    await driver.enqueue_many(rows)


async def _ready_rows(driver: RedisJobDriver, new_request: RequestBuilder) -> None:
    await driver.enqueue_many([new_request() for _ in range(3 * MAX_BULK_ROWS)])


@pytest.mark.parametrize(
    ("setup", "action", "filter"),
    [
        (_cancelled_rows, "requeue_many", BulkFilter(state=JobState.CANCELLED)),
        (_delayed_rows, "promote_many", BulkFilter(state=JobState.DELAYED)),
        (_delayed_rows, "promote_many", BulkFilter(state=JobState.DELAYED, tenant_id="t")),
        (_ready_rows, "remove_many", BulkFilter(state=JobState.READY, name="job")),
    ],
    ids=["requeue", "promote", "promote-by-tenant", "remove-by-name"],
)
async def test_a_bulk_action_stops_walking_once_its_budget_is_spent(
    driver: RedisJobDriver,
    new_request: RequestBuilder,
    monkeypatch: pytest.MonkeyPatch,
    setup: Setup,
    action: str,
    filter: BulkFilter,
) -> None:
    """A call hands over only the rows its budget moves; what is left is counted (exactly) without
    a row going through the walk or ``bulk.lua`` again, so "call until zero" is not quadratic in
    round trips and whole-row reads."""
    await setup(driver, new_request)
    calls = _count_scripts(driver, monkeypatch)
    result = await getattr(driver.introspect, action)(filter)
    assert result == BulkResult(MAX_BULK_ROWS, 2 * MAX_BULK_ROWS)
    assert calls["page"] <= WALK_PAGES
    assert calls["bulk"] == MAX_BULK_ROWS // _BULK_CHUNK


async def test_promoting_the_rows_backing_off_behind_a_due_backlog_reads_only_those(
    driver: RedisJobDriver,
    clock: FrozenClock,
    new_request: RequestBuilder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The due index finds the rows still waiting on their run_at; when one call moves them all,
    the backlog of due rows in front of them is never walked."""
    await driver.enqueue_many([new_request() for _ in range(3)])
    batch = await driver.claim(worker_id="w", slots={"q": 3}, visibility_timeout=30)
    later = clock.now() + timedelta(minutes=10)
    for job in batch.jobs:
        assert await driver.nack(job.id, NackOptions("w", job.claim.claim, "x", run_at=later))
    await driver.enqueue_many([new_request() for _ in range(3 * MAX_BULK_ROWS)])
    calls = _count_scripts(driver, monkeypatch)
    ready = BulkFilter(state=JobState.READY)
    assert await driver.introspect.promote_many(ready) == BulkResult(3, 0)
    assert calls == {"bulk": 1}
    for job in batch.jobs:
        detail = await driver.introspect.get(job.id)
        assert detail is not None
        assert detail.row.run_at == clock.now()


# -- exact, as the memory driver answers ------------------------------------------------------


async def _rows(driver: Driver) -> list[tuple[str, JobState, datetime]]:
    rows: list[tuple[str, JobState, datetime]] = []
    after = None
    while True:
        page = await driver.introspect.list(JobFilter(limit=MAX_JOB_PAGE, after=after))
        rows += [(row.id, row.state, row.run_at) for row in page.rows]
        if page.last:
            return rows
        after = job_cursor(page.rows[-1])


async def _populate(drivers: list[Driver], clock: FrozenClock, new_request: RequestBuilder) -> None:
    """The same rows in every driver, more than a budget of each kind: cancelled rows of two
    names and tenants in two queues, some sharing a key, some whose key a live row holds (past
    the first budget too); delayed rows, some due by now; rows created at shared and distinct
    instants."""

    def row(n: int, **fields: Any) -> EnqueueRequest:
        name = "m" if n % 5 == 0 else "n"
        request = new_request(queue="q" if n % 2 else "r", name=name, **fields)
        return replace(request, tenant_id="a" if n % 3 else None)

    cancelled = [row(n) for n in range(4400)]
    again = [
        replace(row(n), idempotency_key=cancelled[n].idempotency_key) for n in range(0, 4400, 7)
    ]
    held = [replace(r, id=f"held-{r.id}", run_id=f"held-{r.run_id}") for r in cancelled[5::11]]
    delayed = [row(n, delay=30 + n % 90) for n in range(5000)]
    for driver in drivers:
        await _cancelled(driver, cancelled[:2200])
    clock.advance(1)
    for driver in drivers:
        await _cancelled(driver, cancelled[2200:])
        await _cancelled(driver, again)  # a second cancelled row under each of these keys
        await driver.enqueue_many(held)  # live rows holding those keys
        await driver.enqueue_many(delayed)
    clock.advance(60)  # a third of the delayed rows are due: not waiting any more


Action = tuple[str, BulkFilter]

ACTIONS: list[Action] = [
    ("requeue_many", BulkFilter(state=JobState.CANCELLED, queue="q", tenant_id="a")),
    ("requeue_many", BulkFilter(state=JobState.CANCELLED)),
    ("promote_many", BulkFilter(state=JobState.DELAYED, queue="r", name="n")),
    ("promote_many", BulkFilter(state=JobState.DELAYED)),
    ("remove_many", BulkFilter(state=JobState.READY, tenant_id="a")),
    ("remove_many", BulkFilter(state=JobState.DELAYED, name="n")),
    ("remove_many", BulkFilter(state=JobState.READY)),
]


async def test_every_call_until_zero_answers_as_the_memory_driver_does(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    """Past the budget, ``remaining`` is counted (or read from a set's size) rather than walked
    row by row in the action; every answer, and the rows moved, still match the executable
    specification's."""
    memory = memory_job_driver(clock=clock)
    await _populate([driver, memory], clock, new_request)
    for action, filter in ACTIONS:
        answers: list[tuple[BulkResult, BulkResult]] = []
        while not answers or answers[-1][1].remaining:
            ours = await getattr(driver.introspect, action)(filter)
            theirs = await getattr(memory.introspect, action)(filter)
            answers.append((ours, theirs))
            assert ours == theirs, (action, filter, answers)
            assert len(answers) < 10, (action, filter, answers)
            clock.advance(1)
        assert answers[0][0].affected == MAX_BULK_ROWS, (action, filter)  # what is left counted
    assert await _rows(driver) == await _rows(memory)
