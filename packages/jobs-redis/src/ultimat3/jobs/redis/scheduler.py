"""The scheduler's state and leader on Redis, so a deployment on Redis needs no database.

``RedisSchedulerState``: per-task watermarks in one hash; a fire moves the watermark, inserts its
rows and records the fire in one script (``lua/scheduler.lua``), so a crash between them cannot
fire an occurrence twice or leave it unrecorded, and two nodes racing for one occurrence fire it
once.

``redis_lease_leader``: leadership is a one-slot lease in the driver's lease store (core's
``lease_store_leader``), renewed by every ``acquire()`` — which the scheduler calls every third of
``ttl`` — and lapsing ``ttl`` after the last one on the driver's clock: no connection affinity, so
a pooled client cannot make every node a leader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from ultimat3.jobs.core.durations import Duration
from ultimat3.jobs.core.leader import LeaseStoreLeader, lease_store_leader
from ultimat3.jobs.core.model import Enqueued, EnqueueRequest

from .codec import read_enqueued, request_args
from .driver import RedisJobDriver
from .namespace import Namespace
from .unavailable import reports_unavailable

__all__ = [
    "DEFAULT_LEADER_TTL_S",
    "RedisSchedulerState",
    "redis_lease_leader",
    "redis_scheduler_state",
]

DEFAULT_LEADER_TTL_S = 30.0
"""The scheduler renews a lease every third of its ``ttl`` (10 s here): a leader that misses two
renewals is still the leader."""


@reports_unavailable
class RedisSchedulerState:
    records_fires = True
    """The fire script records the fire (``task_fires``) in the call that inserts its rows, so
    a crash between the two cannot leave a fire unrecorded."""

    def __init__(self, ns: Namespace) -> None:
        self._ns = ns

    async def watermarks(self, tasks: Sequence[str]) -> dict[str, int]:
        if not tasks:
            return {}
        held = cast(
            list[str | None], await self._ns.client.hmget(self._ns.key("watermarks"), tasks)
        )
        return {task: int(mark) for task, mark in zip(tasks, held, strict=True) if mark is not None}

    async def arm(self, task: str, occurrence_ms: int) -> None:
        await self._ns.call("scheduler", "arm", task, str(occurrence_ms))

    async def fire(
        self,
        task: str,
        occurrence_ms: int,
        requests: Sequence[EnqueueRequest],
        *,
        previous: int | None,
        fired_ms: int | None = None,
    ) -> list[Enqueued] | None:
        answers = await self._ns.call(
            "scheduler",
            "fire",
            task,
            str(occurrence_ms),
            "" if previous is None else str(previous),
            str(occurrence_ms if fired_ms is None else fired_ms),
            str(len(requests)),
            *request_args(requests),
        )
        return None if answers is None else read_enqueued(answers)


def redis_scheduler_state(driver: RedisJobDriver) -> RedisSchedulerState:
    """Watermarks in ``driver``'s namespace; fires enqueue onto ``driver``."""
    return RedisSchedulerState(driver.namespace)


def redis_lease_leader(
    driver: RedisJobDriver,
    *,
    name: str = "scheduler",
    ttl: Duration = DEFAULT_LEADER_TTL_S,
    holder: str | None = None,
) -> LeaseStoreLeader:
    """One leader among every node naming the same ``name`` in ``driver``'s namespace, its lease
    lapsing ``ttl`` seconds after the last renewal; the scheduler renews it every third of
    ``ttl``."""
    return lease_store_leader(driver.leases, name=name, ttl=ttl, holder=holder)
