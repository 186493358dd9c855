"""run_jobs drives a server driver exactly as it drives the memory one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

from ultimat3.jobs.core import FrozenClock, JobDriver, Retry, Step, job
from ultimat3.jobs.testing import run_jobs


@dataclass
class Parcel:
    parcel_id: str


attempts: list[str] = []


@job(
    input=Parcel,
    idempotency_key=lambda p: p.parcel_id,
    tenant="none",
    name="run-jobs-server-deliver",
    retry=Retry(attempts=3, backoff="fixed", delay="30s", jitter=False),
)
async def deliver(*, input: Parcel, step: Step, attempt: int) -> str:
    attempts.append(f"{input.parcel_id}#{attempt}")
    await step.run("label", lambda: f"label-{input.parcel_id}")
    if attempt == 1:
        raise RuntimeError("the van broke down")
    await step.sleep("1d")
    return "delivered"


@pytest.fixture
def clock() -> FrozenClock:
    attempts.clear()
    return FrozenClock()


@pytest.fixture
async def postgres_driver(pg_database_url: str, clock: FrozenClock) -> AsyncIterator[JobDriver]:
    pg = pytest.importorskip("ultimat3.jobs.pg")
    await pg.install(pg_database_url)
    driver = pg.postgres_job_driver(pg_database_url, clock=clock)
    try:
        yield driver
    finally:
        await driver.close()


@pytest.fixture
async def redis_driver(
    redis_url: str, redis_prefix: str, clock: FrozenClock
) -> AsyncIterator[JobDriver]:
    redis = pytest.importorskip("ultimat3.jobs.redis")
    driver = redis.redis_job_driver(url=redis_url, prefix=redis_prefix, clock=clock)
    try:
        yield driver
    finally:
        await driver.close()


async def _delivered(driver: JobDriver, clock: FrozenClock) -> None:
    start = clock.now()
    await driver.enqueue(deliver.request(Parcel("p-1"), clock=clock))
    executions = await run_jobs(driver, jobs=[deliver])
    assert [(e.attempt, e.outcome) for e in executions] == [
        (1, "retried"),
        (2, "suspended"),
        (2, "completed"),
    ]
    assert executions[-1].result == "delivered"
    assert attempts == ["p-1#1", "p-1#2", "p-1#2"]
    assert clock.now() == start + timedelta(days=1, seconds=30)


@pytest.mark.pg
async def test_run_jobs_drives_the_postgres_driver(
    postgres_driver: JobDriver, clock: FrozenClock
) -> None:
    await _delivered(postgres_driver, clock)


@pytest.mark.redis
async def test_run_jobs_drives_the_redis_driver(
    redis_driver: JobDriver, clock: FrozenClock
) -> None:
    await _delivered(redis_driver, clock)


UNREADABLE = b"\x00\xff".decode("utf-8", "surrogateescape")
"""Bytes decoded leniently, as a message may carry them: neither server stores them as text."""


@job(
    input=Parcel,
    idempotency_key=lambda p: p.parcel_id,
    tenant="none",
    name="run-jobs-server-unreadable-error",
    retry=Retry(attempts=2, backoff="fixed", delay="1s", jitter=False),
)
async def scan(*, input: Parcel, attempt: int) -> str:
    if attempt == 1:
        raise RuntimeError(f"label {UNREADABLE} unreadable")
    return "scanned"


async def _scanned(driver: JobDriver, clock: FrozenClock) -> None:
    """A failure whose message holds a NUL and a lone surrogate still settles (retried), with
    both spelled as escapes in ``last_error``; it used to fail the nack on both servers and
    leave the row to lapse."""
    queued = await driver.enqueue(scan.request(Parcel("p-2"), clock=clock))
    executions = await run_jobs(driver, jobs=[scan])
    assert [(e.attempt, e.outcome) for e in executions] == [(1, "retried"), (2, "completed")]
    assert driver.introspect is not None
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.last_error or "").startswith("RuntimeError: label \\x00\\udcff unreadable")


@pytest.mark.pg
async def test_an_unstorable_error_message_settles_on_postgres(
    postgres_driver: JobDriver, clock: FrozenClock
) -> None:
    await _scanned(postgres_driver, clock)


@pytest.mark.redis
async def test_an_unstorable_error_message_settles_on_redis(
    redis_driver: JobDriver, clock: FrozenClock
) -> None:
    await _scanned(redis_driver, clock)
