"""The event bus (``x_job_events``): what ``step.wait_for_event`` matches, on ONE clock.

Every time here is the DATABASE's ``now()`` — the one place this package does not take the
caller's clock. A wait is stamped "since" on this clock and an event "published_at" on it too, so
whether an event came after a wait began never depends on which pod's clock ran ahead.
"""

from __future__ import annotations

__all__ = ["SQL_EVENT_LOOKUP", "SQL_EVENT_NOW", "SQL_EVENT_PUBLISH", "SQL_EVENT_PURGE_EXPIRED"]

SQL_EVENT_PUBLISH = """
-- Parameters: id, event, payload (JSON text), ttl_s (seconds the event stays matchable).
-- Stamps published_at and expires_at with the database's now(), never a process's clock.
-- Answers the row as stored (the payload as jsonb reads it back). Publishing an id again stores
-- nothing and answers the row stored under it: a publish repeated after its answer was lost
-- is the same event, not a second one.
insert into x_job_events as e (id, event, payload, published_at, expires_at)
values (%(id)s, %(event)s, %(payload)s::jsonb, now(), now() + make_interval(secs => %(ttl_s)s))
on conflict (id) do update
set id = excluded.id
returning e.id, e.event, e.payload, e.published_at, e.expires_at
"""

SQL_EVENT_LOOKUP = """
-- Parameters: event, since, until (null: no bound), match (JSON text, or null for any payload).
-- The earliest event of that name published at or after since (and at or before until), not
-- yet expired by the database's clock, whose payload contains match (jsonb @>: objects by
-- subset, arrays by element). Earliest is (published_at, id). Served by
-- x_job_events_earliest_idx, in that order: the first row that passes the filters is the
-- answer, with no sort of the name's events. Both bounds are index bounds (a null until reads
-- as infinity), so a scan past until stops there instead of reading every later event.
select id, event, payload, published_at, expires_at
from x_job_events
where event = %(event)s
  and published_at >= %(since)s
  and published_at <= coalesce(%(until)s::timestamptz, 'infinity')
  and expires_at > now()
  and (%(match)s::jsonb is null or payload @> %(match)s::jsonb)
order by published_at, id
limit 1
"""

SQL_EVENT_NOW = """
-- The bus's clock: the instant a wait is stamped with and a timeout is judged by.
select now()
"""

SQL_EVENT_PURGE_EXPIRED = """
-- Deletes every event expired by the database's clock; answers how many. An unexpired event is
-- never touched. Served by x_job_events_expiry_idx.
with purged as (
    delete from x_job_events
    where expires_at <= now()
    returning 1
)
select count(*) from purged
"""
