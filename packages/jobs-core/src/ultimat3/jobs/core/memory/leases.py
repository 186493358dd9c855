"""Fleet slots in one heap: at most ``limit`` live holders per key, expiring by TTL."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..clock import Clock

__all__ = ["MemoryLeaseStore"]


@dataclass
class _Hold:
    holder: str
    order: int
    expires_at: datetime


class MemoryLeaseStore:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._keys: dict[str, list[_Hold]] = {}
        self._order = itertools.count()

    def _live(self, key: str) -> list[_Hold]:
        now = self._clock.now()
        holds = [hold for hold in self._keys.get(key, []) if hold.expires_at > now]
        if holds:
            self._keys[key] = holds
        else:
            self._keys.pop(key, None)
        return holds

    async def acquire(self, key: str, holder: str, *, limit: int, ttl: float) -> bool:
        holds = self._live(key)
        expires_at = self._clock.now() + timedelta(seconds=ttl)
        for hold in holds:
            if hold.holder == holder:
                hold.expires_at = expires_at
                return True
        if len(holds) >= limit:
            return False
        self._keys.setdefault(key, []).append(_Hold(holder, next(self._order), expires_at))
        return True

    async def renew(self, key: str, holder: str, *, ttl: float) -> bool:
        for hold in self._live(key):
            if hold.holder == holder:
                hold.expires_at = self._clock.now() + timedelta(seconds=ttl)
                return True
        return False

    async def release(self, key: str, holder: str) -> None:
        holds = [hold for hold in self._keys.get(key, []) if hold.holder != holder]
        if holds:
            self._keys[key] = holds
        else:
            self._keys.pop(key, None)

    async def holders(self, key: str) -> list[str]:
        return [hold.holder for hold in sorted(self._live(key), key=lambda h: h.order)]
