"""Fleet-wide concurrency slots on Postgres (``LeaseStore`` over ``x_job_leases``)."""

from __future__ import annotations

from datetime import timedelta

from ultimat3.jobs.core.clock import Clock

from .executor import PgExecutor
from .sql_leases import (
    SQL_LEASE_ACQUIRE,
    SQL_LEASE_HOLDERS,
    SQL_LEASE_LOCK,
    SQL_LEASE_RELEASE,
    SQL_LEASE_RENEW,
)

__all__ = ["PostgresLeaseStore"]


class PostgresLeaseStore:
    """At most ``limit`` live holders per key, each expiring ``ttl`` seconds (on the driver's
    clock) after its last acquire or renew."""

    def __init__(self, executor: PgExecutor, clock: Clock) -> None:
        self._executor = executor
        self._clock = clock

    def __repr__(self) -> str:
        return f"PostgresLeaseStore({self._executor!r})"

    async def acquire(self, key: str, holder: str, *, limit: int, ttl: float) -> bool:
        now = self._clock.now()
        params = {
            "key": key,
            "holder": holder,
            "limit": limit,
            "now": now,
            "expires_at": now + timedelta(seconds=ttl),
        }
        # A repeat finds the slot the first run took and renews it: the same answer.
        rows = await self._executor.run(
            [(SQL_LEASE_LOCK, params), (SQL_LEASE_ACQUIRE, params)], idempotent=True
        )
        return bool(rows[0][0])

    async def renew(self, key: str, holder: str, *, ttl: float) -> bool:
        now = self._clock.now()
        params = {
            "key": key,
            "holder": holder,
            "now": now,
            "expires_at": now + timedelta(seconds=ttl),
        }
        # Under the acquirers' lock: an acquire reading while this renewal is on its way would
        # count the slot as lapsed and take one, and both holders would stay.
        rows = await self._executor.run(
            [(SQL_LEASE_LOCK, params), (SQL_LEASE_RENEW, params)],
            idempotent=True,
            relaxed_commit=True,
        )
        return bool(rows)

    async def release(self, key: str, holder: str) -> None:
        await self._executor.fetch(
            SQL_LEASE_RELEASE, {"key": key, "holder": holder}, idempotent=True
        )

    async def holders(self, key: str) -> list[str]:
        rows = await self._executor.fetch(
            SQL_LEASE_HOLDERS, {"key": key, "now": self._clock.now()}, idempotent=True
        )
        return [row[0] for row in rows]
