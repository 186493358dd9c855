"""The event bus on Redis, on ONE clock: the server's ``TIME``.

``step.wait_for_event`` stamps "when I asked" with ``now()`` and matches events published at or
after it; both stamps come from the server, so two workers whose clocks disagree still agree on
which answers count. This is the one part of the driver that does not read the driver's clock.
An event is a hash that expires on that same clock (a server key TTL), so payloads never outlive
their events; ``purge_expired()`` drops the small index entries they leave behind — schedule it,
as for any bus (``events_purge_target``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import cast

from ultimat3.jobs.core.constants import DEFAULT_EVENT_TTL_S
from ultimat3.jobs.core.events import event_json, event_name
from ultimat3.jobs.core.ids import new_id
from ultimat3.jobs.core.jsonvalue import json_contains, json_text
from ultimat3.jobs.core.model import EventRecord, JsonValue

from .codec import from_us, to_us
from .namespace import Namespace
from .unavailable import reports_unavailable

__all__ = ["RedisEventBus"]

_PAGE = 100
_PURGE_CHUNK = 1000


@reports_unavailable
class RedisEventBus:
    def __init__(self, ns: Namespace) -> None:
        self._ns = ns

    async def publish(
        self, event: str, payload: JsonValue, *, ttl: float | None = None
    ) -> EventRecord:
        event_name(event)
        stored = event_json(payload, "payload")
        event_id = new_id()
        seconds = DEFAULT_EVENT_TTL_S if ttl is None else ttl
        published, expires = await self._ns.call(
            "events",
            "publish",
            event_id,
            event,
            json_text(stored),
            str(round(seconds * 1_000_000)),
        )
        return EventRecord(
            id=event_id,
            event=event,
            payload=stored,
            published_at=from_us(published),
            expires_at=from_us(expires),
        )

    async def lookup(
        self,
        event: str,
        *,
        since: datetime,
        until: datetime | None = None,
        match: Mapping[str, JsonValue] | None = None,
    ) -> EventRecord | None:
        event_name(event)
        pattern = None if match is None else event_json(match, "match")  # as a payload is stored
        now = await self.now()
        index = self._ns.key(f"evby:{event}")
        last_score = "+inf" if until is None else to_us(until)
        # Paged by position, (score, how many entries at that score were read): a page found by
        # an offset from `since` walks again every entry before it, which made a lookup
        # quadratic in the events published since the wait began.
        score, seen_at_score = int(to_us(since)), 0
        while True:
            page = cast(
                list[tuple[str, float]],
                await self._ns.client.zrangebyscore(
                    index, score, last_score, start=seen_at_score, num=_PAGE, withscores=True
                ),
            )
            ids = [event_id for event_id, _ in page]
            rows = await self._ns.hashes([f"ev:{event_id}" for event_id in ids])
            for event_id, row in zip(ids, rows, strict=True):
                if not row or from_us(row["expires"]) <= now:
                    continue
                payload = json.loads(row["payload"])
                if pattern is None or json_contains(payload, pattern):
                    return EventRecord(
                        id=event_id,
                        event=event,
                        payload=payload,
                        published_at=from_us(row["published"]),
                        expires_at=from_us(row["expires"]),
                    )
            if len(page) < _PAGE:
                return None
            last = int(page[-1][1])
            ties = sum(1 for _, at in page if int(at) == last)
            seen_at_score = ties + (seen_at_score if last == score else 0)
            score = last

    async def now(self) -> datetime:
        return from_us(await self._ns.call("events", "now"))

    async def purge_expired(self) -> int:
        removed = 0
        while True:
            chunk = int(await self._ns.call("events", "purge", str(_PURGE_CHUNK)))
            removed += chunk
            if chunk < _PURGE_CHUNK:
                return removed
