"""The scheduler's state and leader on Postgres.

``PostgresSchedulerState``: durable per-task watermarks. A fire moves the watermark, inserts the
occurrence's jobs, records the fire and announces the queues it filled in ONE statement
(``SQL_SCHEDULER_FIRE``), so a crash cannot fire an occurrence twice or lose it, and two
schedulers racing for one occurrence fire it once.

``PostgresLeaseLeader``: leadership is a lease row with an expiry, renewed by every ``acquire()``
(which the scheduler calls every third of the leader's ``ttl``: 10 s of the default 30 s). A
leader that dies stops renewing and a standby takes over once ``ttl`` has passed; no connection
affinity is needed, so a pool is fine.

Wiring::

    job_scheduler(
        driver=driver,
        state=postgres_scheduler_state(driver.executor, clock=driver.clock),
        leader=postgres_lease_leader(executor=driver.executor, clock=driver.clock),
    )
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from datetime import timedelta

from ultimat3.jobs.core.clock import SYSTEM_CLOCK, Clock
from ultimat3.jobs.core.durations import Duration
from ultimat3.jobs.core.ids import new_id
from ultimat3.jobs.core.lifecycle import positive_seconds
from ultimat3.jobs.core.model import Enqueued, EnqueueRequest

from .executor import PgTarget, pg_executor
from .rows import enqueue_answers, enqueue_params, enqueue_rows
from .sql_scheduler import (
    SQL_LEADER_ACQUIRE,
    SQL_LEADER_RELEASE,
    SQL_SCHEDULER_ARM,
    SQL_SCHEDULER_FIRE,
    SQL_SCHEDULER_HOLDERS,
    SQL_SCHEDULER_WATERMARKS,
)

__all__ = [
    "DEFAULT_LEADER_TTL_S",
    "PostgresLeaseLeader",
    "PostgresSchedulerState",
    "postgres_lease_leader",
    "postgres_scheduler_state",
]

DEFAULT_LEADER_TTL_S = 30.0
"""The scheduler renews a lease every third of its ``ttl`` (10 s here): a leader that misses two
renewals is still the leader."""


class PostgresSchedulerState:
    """Watermarks in ``x_scheduler_watermarks``; fires insert into ``x_jobs``. Build it with
    ``postgres_scheduler_state()``."""

    records_fires = True
    """The fire statement writes ``x_task_fires`` itself, so the scheduler writes no record."""

    def __init__(self, executor: PgTarget, clock: Clock) -> None:
        self._executor = pg_executor(executor)
        self._owns_executor = isinstance(executor, str)
        self._clock = clock

    def __repr__(self) -> str:
        return f"PostgresSchedulerState({self._executor!r})"

    async def watermarks(self, tasks: Sequence[str]) -> dict[str, int]:
        if not tasks:
            return {}
        rows = await self._executor.fetch(
            SQL_SCHEDULER_WATERMARKS, {"tasks": list(tasks)}, idempotent=True
        )
        return {task: int(mark) for task, mark in rows}

    async def arm(self, task: str, occurrence_ms: int) -> None:
        await self._executor.fetch(
            SQL_SCHEDULER_ARM,
            {"task": task, "occurrence_ms": occurrence_ms, "now": self._clock.now()},
            idempotent=True,  # only ever forward: a repeat changes nothing
        )

    async def fire(
        self,
        task: str,
        occurrence_ms: int,
        requests: Sequence[EnqueueRequest],
        *,
        previous: int | None,
        fired_ms: int | None = None,
    ) -> list[Enqueued] | None:
        """Move ``task``'s watermark from ``previous`` to ``occurrence_ms`` and insert
        ``requests``, in one statement; None when the watermark was no longer ``previous``.
        ``fired_ms`` is the occurrence recorded as fired (``occurrence_ms`` when omitted)."""
        params = enqueue_params(requests, self._clock.now())
        params.update(
            task=task,
            previous=previous,
            occurrence_ms=occurrence_ms,
            fired_ms=occurrence_ms if fired_ms is None else fired_ms,
        )
        rows = await self._executor.fetch(SQL_SCHEDULER_FIRE, params)
        if not rows[0][0]:
            return None
        answers = enqueue_answers(requests, [row[2:] for row in rows if row[2] is not None])
        unanswered = [position for position, answer in enumerate(answers) if answer is None]
        if unanswered:
            await self._read_holders(requests, unanswered, answers)
        return [answer for answer in answers if answer is not None]

    async def _read_holders(
        self,
        requests: Sequence[EnqueueRequest],
        positions: Sequence[int],
        answers: list[Enqueued | None],
    ) -> None:
        """Answer the deduped requests whose holder the fire's snapshot could not see."""
        asked = [requests[position] for position in positions]
        rows = await self._executor.fetch(
            SQL_SCHEDULER_HOLDERS, {"rows": enqueue_rows(asked)}, idempotent=True
        )
        for ord_, job_id, run_id in rows:
            request = asked[ord_ - 1]
            # A holder gone again (finished and removed since) still inserted nothing here.
            answers[positions[ord_ - 1]] = Enqueued(
                job_id or request.id, run_id or request.run_id, deduped=True
            )

    async def close(self) -> None:
        """Close the pool this state opened from a URL; a pool or executor handed in is left
        open."""
        if self._owns_executor:
            await self._executor.close()


class PostgresLeaseLeader:
    """One leader among every node naming the same ``name``. Build it with
    ``postgres_lease_leader()``."""

    def __init__(
        self, executor: PgTarget, *, name: str, ttl: Duration, holder: str, clock: Clock
    ) -> None:
        ttl = positive_seconds(ttl, "ttl")
        self._executor = pg_executor(executor)
        self._owns_executor = isinstance(executor, str)
        self.name = name
        self.ttl = float(ttl)
        """Seconds the lease row lives after the last ``acquire()``; the scheduler renews it every
        third of that."""
        self.holder = holder
        self._clock = clock

    def __repr__(self) -> str:
        return f"PostgresLeaseLeader(name={self.name!r}, holder={self.holder!r})"

    async def acquire(self) -> bool:
        """Take the lease, or renew it while this node holds it; False while another node's
        lease is live."""
        now = self._clock.now()
        rows = await self._executor.fetch(
            SQL_LEADER_ACQUIRE,
            {
                "name": self.name,
                "holder": self.holder,
                "now": now,
                "expires_at": now + timedelta(seconds=self.ttl),
            },
            idempotent=True,  # a repeat renews what the first took, and answers the same
        )
        return bool(rows)

    async def release(self) -> None:
        await self._executor.fetch(
            SQL_LEADER_RELEASE, {"name": self.name, "holder": self.holder}, idempotent=True
        )

    async def close(self) -> None:
        """Close the pool this leader opened from a URL; a pool or executor handed in is left
        open."""
        if self._owns_executor:
            await self._executor.close()


def postgres_scheduler_state(
    executor: PgTarget, *, clock: Clock = SYSTEM_CLOCK
) -> PostgresSchedulerState:
    """Durable watermarks for ``job_scheduler(state=...)``: the driver's ``executor``, a psycopg
    pool, or a URL (a pool of its own; ``close()`` it). ``clock`` stamps the rows a fire inserts:
    give it the driver's."""
    return PostgresSchedulerState(executor, clock)


def postgres_lease_leader(
    *,
    executor: PgTarget,
    name: str = "scheduler",
    ttl: Duration = DEFAULT_LEADER_TTL_S,
    holder: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> PostgresLeaseLeader:
    """Leader election for ``job_scheduler(leader=...)``: a lease row named ``name`` lapsing
    ``ttl`` seconds after the holder's last ``acquire()``, on ``clock`` (keep the fleet's clocks
    in sync to well under ``ttl``). The scheduler renews it, and a standby asks for it, every third
    of ``ttl``. ``holder`` names this node in ``x_scheduler_leader`` (default: host, pid and a
    random suffix)."""
    return PostgresLeaseLeader(
        executor, name=name, ttl=ttl, holder=holder or _default_holder(), clock=clock
    )


def _default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{new_id()[-12:]}"
