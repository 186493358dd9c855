"""The scheduler's state and leader on Redis, so a deployment on Redis needs no database.

``RedisSchedulerState``: per-task watermarks in one hash; a fire moves the watermark AND inserts
its rows in one script (``lua/scheduler.lua``), so a crash between the two cannot fire an
occurrence twice, and two nodes racing for one occurrence fire it once.

``RedisLeaseLeader``: leadership is a one-slot lease in the driver's lease store, renewed by every
``acquire()`` and lapsing ``ttl`` after the last one on the driver's clock — no connection
affinity, so a pooled client cannot make every node a leader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from ultimat3.jobs.core.errors import InvariantError
from ultimat3.jobs.core.ids import new_id
from ultimat3.jobs.core.model import Enqueued, EnqueueRequest

from .codec import read_enqueued, request_args
from .driver import RedisJobDriver
from .namespace import Namespace

__all__ = [
    "DEFAULT_LEADER_TTL_S",
    "RedisLeaseLeader",
    "RedisSchedulerState",
    "redis_lease_leader",
    "redis_scheduler_state",
]

DEFAULT_LEADER_TTL_S = 30.0
"""Three of the scheduler's 10 s renewals: a leader that misses two is still the leader."""


class RedisSchedulerState:
    records_fires = False
    """The fire script keeps no fire record; the scheduler writes it through the operator
    surface (``record_task_fire``), as for any state without one."""

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
    ) -> list[Enqueued] | None:
        answers = await self._ns.call(
            "scheduler",
            "fire",
            task,
            str(occurrence_ms),
            "" if previous is None else str(previous),
            str(len(requests)),
            *request_args(requests),
        )
        return None if answers is None else read_enqueued(answers)


class RedisLeaseLeader:
    def __init__(self, driver: RedisJobDriver, *, name: str, ttl: float, holder: str) -> None:
        if not ttl > 0:
            raise InvariantError(f"ttl={ttl!r} must be positive seconds", meta={"ttl": ttl})
        self._leases = driver.leases
        self._key = f"leader:{name}"
        self._ttl = ttl
        self.holder = holder

    async def acquire(self) -> bool:
        return await self._leases.acquire(self._key, self.holder, limit=1, ttl=self._ttl)

    async def release(self) -> None:
        await self._leases.release(self._key, self.holder)


def redis_scheduler_state(driver: RedisJobDriver) -> RedisSchedulerState:
    """Watermarks in ``driver``'s namespace; fires enqueue onto ``driver``."""
    return RedisSchedulerState(driver.namespace)


def redis_lease_leader(
    driver: RedisJobDriver,
    *,
    name: str = "scheduler",
    ttl: float = DEFAULT_LEADER_TTL_S,
    holder: str | None = None,
) -> RedisLeaseLeader:
    """One leader among every node naming the same ``name`` in ``driver``'s namespace."""
    return RedisLeaseLeader(driver, name=name, ttl=ttl, holder=holder or new_id())
