"""Fixtures for the Redis driver's own tests: a driver on a fresh key prefix and a frozen clock,
and a builder of rows to enqueue."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest

from ultimat3.jobs.core import EnqueueRequest, FrozenClock, new_id
from ultimat3.jobs.redis import RedisJobDriver, redis_job_driver


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
async def driver(
    redis_url: str, redis_prefix: str, clock: FrozenClock
) -> AsyncIterator[RedisJobDriver]:
    """A driver on a namespace no other test uses, on the frozen clock; emptied after."""
    built = redis_job_driver(url=redis_url, prefix=redis_prefix, clock=clock)
    yield built
    await built.clear()
    await built.close()


@pytest.fixture
def new_request(clock: FrozenClock) -> Callable[..., EnqueueRequest]:
    """``new_request(queue=, name=, key=, max_attempts=, delay=, input=)``: a row to enqueue,
    with fresh ids and key unless told, due ``delay`` seconds from the clock's now."""

    def build(
        *,
        queue: str = "q",
        name: str = "job",
        key: str | None = None,
        max_attempts: int = 3,
        delay: float = 0.0,
        input: Any = None,
    ) -> EnqueueRequest:
        return EnqueueRequest(
            id=new_id(),
            run_id=new_id(),
            name=name,
            queue=queue,
            input={"n": 1} if input is None else input,
            idempotency_key=key or f"key-{uuid.uuid4().hex}",
            tenant_id=None,
            max_attempts=max_attempts,
            run_at=clock.now() + timedelta(seconds=delay),
        )

    return build
