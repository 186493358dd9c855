"""One queue namespace on one Redis: the client, the key base, the clock, and the script call.

The driver and its optional parts (introspection, leases, backfills, events) share one of these,
so every script of a namespace is called the same way: ``KEYS[1]`` the key base and ARGV led by
the header every script reads (now on the driver's clock, the done TTL, the counter bucket).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeAlias, cast

from redis.asyncio import Redis, RedisCluster
from ultimat3.jobs.core.clock import Clock
from ultimat3.jobs.core.constants import COUNTER_TIERS
from ultimat3.jobs.core.counters import bucket_start_s

from .codec import to_us
from .scripts import ScriptRunner

__all__ = ["Namespace", "RedisClient"]

RedisClient: TypeAlias = Redis | RedisCluster
"""A plain client (one server, or a Sentinel-managed one) or a Cluster client."""

_MINUTE = COUNTER_TIERS[0][0]


class Namespace:
    def __init__(
        self,
        client: RedisClient,
        *,
        base: str,
        clock: Clock,
        done_ttl_s: float,
        command_timeout: float,
    ) -> None:
        self.client = client
        self.base = base
        self.clock = clock
        self._done_ttl_us = str(round(done_ttl_s * 1_000_000))
        self._run = ScriptRunner(client, command_timeout=command_timeout)

    def key(self, suffix: str) -> str:
        return self.base + suffix

    def state_key(self, queue: str, state: str) -> str:
        """The sorted set of a queue's rows in one state (as ``k_state`` in the prelude)."""
        return f"{self.base}q:{queue}:s:{state}"

    def due_key(self, queue: str) -> str:
        """The sorted set of a queue's ready, delayed and suspended rows by run_at (``k_due``)."""
        return f"{self.base}q:{queue}:due"

    # Typed reads: the client decodes responses (the driver checks), so every value is a str.

    async def members(self, suffix: str) -> list[str]:
        """A set of the namespace, sorted."""
        return sorted(cast(set[str], await self.client.smembers(self.key(suffix))))

    async def hash(self, suffix: str) -> dict[str, str]:
        return cast(dict[str, str], await self.client.hgetall(self.key(suffix)))

    async def hashes(self, suffixes: Sequence[str]) -> list[dict[str, str]]:
        """Many hashes in one round trip, in order ({} for a missing one)."""
        pipe = self.client.pipeline(transaction=False)
        for suffix in suffixes:
            pipe.hgetall(self.key(suffix))
        return cast(list[dict[str, str]], await pipe.execute())

    async def sizes(self, keys: Sequence[str]) -> int:
        """How many members the sorted sets named (full keys) hold together, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.zcard(key)
        return sum(cast(list[int], await pipe.execute()))

    async def call(
        self,
        name: str,
        *args: Any,
        now: datetime | None = None,
        keys: Sequence[str] = (),
    ) -> Any:
        """Run script ``name`` with the header for ``now`` (default: the clock's now)."""
        at = self.clock.now() if now is None else now
        header = (to_us(at), self._done_ttl_us, f"{_MINUTE}:{bucket_start_s(at, _MINUTE)}")
        return await self._run(name, [self.base, *keys], [*header, *args])

    async def close(self) -> None:
        await self._run.close()
