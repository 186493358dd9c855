"""Leader election over any ``LeaseStore``: one slot, held by whoever renews it in time.

A lease with an expiry needs no connection affinity, so it works over pooled connections where a
session lock would not. ``acquire()`` is also the renewal, which the scheduler calls every third
of ``ttl`` (the leader states it), and it is how a demoted node finds out. Over the memory
driver's lease store it elects within one process; over a server's it elects across the fleet.
"""

from __future__ import annotations

from .durations import Duration
from .ids import new_id
from .lifecycle import positive_seconds
from .protocol import LeaseStore

__all__ = ["LeaseStoreLeader", "lease_store_leader"]


class LeaseStoreLeader:
    def __init__(self, leases: LeaseStore, *, name: str, ttl: Duration, holder: str) -> None:
        self._ttl = positive_seconds(ttl, "ttl")
        self._leases = leases
        self._key = f"leader:{name}"
        self.holder = holder

    @property
    def ttl(self) -> float:
        """Seconds the lease lives after the last ``acquire()``; the scheduler renews it every
        third of that."""
        return self._ttl

    async def acquire(self) -> bool:
        return await self._leases.acquire(self._key, self.holder, limit=1, ttl=self._ttl)

    async def release(self) -> None:
        await self._leases.release(self._key, self.holder)


def lease_store_leader(
    leases: LeaseStore,
    *,
    name: str = "scheduler",
    ttl: Duration = 30.0,
    holder: str | None = None,
) -> LeaseStoreLeader:
    """A leader for the scheduler named ``name``; ``ttl`` seconds without a renewal free it. The
    scheduler renews it, and a standby asks for it, every third of ``ttl`` (10 s by default)."""
    return LeaseStoreLeader(leases, name=name, ttl=ttl, holder=holder or new_id())
