"""The worker registry: what each live worker last said about itself."""

from __future__ import annotations

__all__ = ["SQL_RECORD_WORKER", "SQL_REMOVE_WORKER", "SQL_WORKERS"]

SQL_RECORD_WORKER = """
-- Parameters: the WorkerInfo fields, expires_at (now + ttl), synchronous_commit (as SQL_CLAIM
-- takes it). One row per worker, replaced whole. Committed without waiting for the WAL flush:
-- the row is a report, renewed every heartbeat.
with durability as (
    select set_config(
        'synchronous_commit',
        coalesce(%(synchronous_commit)s::text, current_setting('synchronous_commit')),
        true
    )
)
insert into x_workers as w (id, host, started_at, queues, slots, in_flight, last_heartbeat,
                            expires_at)
select %(id)s, %(host)s, %(started_at)s, %(queues)s::text[], %(slots)s::jsonb,
       %(in_flight)s::text[], %(last_heartbeat)s, %(expires_at)s
from durability
on conflict (id) do update
set host = excluded.host, started_at = excluded.started_at, queues = excluded.queues,
    slots = excluded.slots, in_flight = excluded.in_flight,
    last_heartbeat = excluded.last_heartbeat, expires_at = excluded.expires_at
"""

SQL_REMOVE_WORKER = """
-- Parameters: id. A worker that stops cleanly takes its row with it.
delete from x_workers where id = %(id)s
"""

SQL_WORKERS = """
-- Parameters: now. Live workers by id; rows past their expiry are swept in the same statement.
with expired as (
    delete from x_workers where expires_at <= %(now)s
)
select id, host, started_at, queues, slots, in_flight, last_heartbeat
from x_workers
where expires_at > %(now)s
order by id
"""
