"""The event bus on Postgres (``EventBus`` over ``x_job_events``).

It takes no clock: ``published_at``, expiry and ``now()`` all come from the database's clock
(``sql_events.py``), so a worker whose clock runs ahead of the database still matches an event
published after its wait began, and does not declare a timeout early. Install it where
``step.wait_for_event`` and ``publish_event`` find it::

    set_event_bus(postgres_event_bus(executor=driver.executor))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ultimat3.jobs.core.constants import DEFAULT_EVENT_TTL_S
from ultimat3.jobs.core.events import event_json, event_name
from ultimat3.jobs.core.ids import new_id
from ultimat3.jobs.core.jsonvalue import json_text
from ultimat3.jobs.core.model import EventRecord, JsonValue

from .executor import PgTarget, pg_executor
from .rows import utc
from .sql_events import SQL_EVENT_LOOKUP, SQL_EVENT_NOW, SQL_EVENT_PUBLISH, SQL_EVENT_PURGE_EXPIRED

__all__ = ["PostgresEventBus", "postgres_event_bus"]


class PostgresEventBus:
    """Events in ``x_job_events``, on the database's clock. Build it with
    ``postgres_event_bus()``."""

    def __init__(self, executor: PgTarget) -> None:
        self._executor = pg_executor(executor)
        self._owns_executor = isinstance(executor, str)

    def __repr__(self) -> str:
        return f"PostgresEventBus({self._executor!r})"

    async def publish(
        self, event: str, payload: JsonValue, *, ttl: float | None = None
    ) -> EventRecord:
        rows = await self._executor.fetch(
            SQL_EVENT_PUBLISH,
            {
                "id": new_id(),
                "event": event_name(event),
                "payload": json_text(event_json(payload, "payload")),
                "ttl_s": DEFAULT_EVENT_TTL_S if ttl is None else float(ttl),
            },
            idempotent=True,  # a repeat under the same id answers the row the first one stored
        )
        return _record(rows[0])

    async def lookup(
        self,
        event: str,
        *,
        since: datetime,
        until: datetime | None = None,
        match: Mapping[str, JsonValue] | None = None,
    ) -> EventRecord | None:
        rows = await self._executor.fetch(
            SQL_EVENT_LOOKUP,
            {
                "event": event_name(event),
                "since": since,
                "until": until,
                "match": None if match is None else json_text(event_json(match, "match")),
            },
            idempotent=True,
        )
        return _record(rows[0]) if rows else None

    async def now(self) -> datetime:
        rows = await self._executor.fetch(SQL_EVENT_NOW, idempotent=True)
        return utc(rows[0][0])

    async def purge_expired(self) -> int:
        rows = await self._executor.fetch(SQL_EVENT_PURGE_EXPIRED)
        return int(rows[0][0])

    async def close(self) -> None:
        """Close the pool this bus opened from a URL; a pool or executor handed in is left
        open."""
        if self._owns_executor:
            await self._executor.close()


def postgres_event_bus(*, executor: PgTarget) -> PostgresEventBus:
    """The event bus on Postgres: the driver's ``executor``, a psycopg pool, or a URL (the bus
    then opens a pool of its own; ``close()`` it). It takes no clock — the database's is the
    bus's one clock."""
    return PostgresEventBus(executor)


def _record(row: Sequence[Any]) -> EventRecord:
    event_id, event, payload, published_at, expires_at = row
    return EventRecord(
        id=event_id,
        event=event,
        payload=payload,
        published_at=utc(published_at),
        expires_at=utc(expires_at),
    )
