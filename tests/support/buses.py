"""An event bus handing every call to another: the base of the stand-ins tests put in front of a
real bus, overriding only the call they change."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from ultimat3.jobs.core.model import EventRecord, JsonValue
from ultimat3.jobs.core.protocol import EventBus


class ForwardingBus:
    def __init__(self, inner: EventBus) -> None:
        self.inner = inner

    async def publish(
        self, event: str, payload: JsonValue, *, ttl: float | None = None
    ) -> EventRecord:
        return await self.inner.publish(event, payload, ttl=ttl)

    async def lookup(
        self,
        event: str,
        *,
        since: datetime,
        until: datetime | None = None,
        match: Mapping[str, JsonValue] | None = None,
    ) -> EventRecord | None:
        return await self.inner.lookup(event, since=since, until=until, match=match)

    async def now(self) -> datetime:
        return await self.inner.now()

    async def purge_expired(self) -> int:
        return await self.inner.purge_expired()
