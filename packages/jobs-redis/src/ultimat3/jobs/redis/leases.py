"""Fleet-wide slots on Redis: at most ``limit`` live holders per key, expiring by TTL.

One hash per key (``lease:<key>``), holder -> "<expires> <order>", and the same holders by
expiry in a sorted set (``leasexp:<key>``), so a call drops the expired ones without reading them
all; both are read and written by ``lua/lease.lua`` only. Expiry is decided on the driver's clock;
the keys also carry a server TTL an hour past their newest holder's expiry (whichever holder
wrote last), so a key every holder abandoned frees itself.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .codec import to_us
from .namespace import Namespace
from .unavailable import reports_unavailable

__all__ = ["RedisLeaseStore"]

_BACKSTOP_S = 3600.0


@reports_unavailable
class RedisLeaseStore:
    def __init__(self, ns: Namespace) -> None:
        self._ns = ns

    async def _call(
        self, action: str, key: str, holder: str = "", limit: int = 0, ttl: float = 0.0
    ) -> Any:
        now = self._ns.clock.now()
        expires = to_us(now + timedelta(seconds=ttl))
        backstop_ms = str(int(_BACKSTOP_S * 1000))
        return await self._ns.call(
            "lease", action, key, holder, str(limit), expires, backstop_ms, now=now
        )

    async def acquire(self, key: str, holder: str, *, limit: int, ttl: float) -> bool:
        return bool(await self._call("acquire", key, holder, limit, ttl))

    async def renew(self, key: str, holder: str, *, ttl: float) -> bool:
        return bool(await self._call("renew", key, holder, ttl=ttl))

    async def release(self, key: str, holder: str) -> None:
        await self._call("release", key, holder)

    async def holders(self, key: str) -> list[str]:
        flat = await self._call("holders", key)
        held = sorted(zip(flat[1::2], flat[::2], strict=True), key=lambda pair: int(pair[0]))
        return [holder for _, holder in held]
