"""The scheduler's state (``x_scheduler_watermarks``, ``x_task_fires``) and its leader
(``x_scheduler_leader``).

A watermark is, per task, the last occurrence dispatched or passed over. A fire moves it AND
inserts the occurrence's jobs in ONE statement (``SQL_SCHEDULER_FIRE``): a crash cannot land one
without the other, and of two schedulers firing one occurrence only the one whose watermark still
read ``previous`` inserts anything.

The leader is a lease ROW with an expiry, renewed by every acquire — not an advisory lock, which
belongs to a session and is dropped the moment a pooled connection goes back to its pool.
"""

from __future__ import annotations

from .sql_enqueue import ENQUEUE_HOLDER, ENQUEUE_REQUEST, ENQUEUE_WRITE

__all__ = [
    "SQL_LEADER_ACQUIRE",
    "SQL_LEADER_RELEASE",
    "SQL_SCHEDULER_ARM",
    "SQL_SCHEDULER_FIRE",
    "SQL_SCHEDULER_HOLDERS",
    "SQL_SCHEDULER_WATERMARKS",
]

SQL_SCHEDULER_WATERMARKS = """
-- Parameters: tasks. The watermark of each named task that has one.
select task, occurrence_ms
from x_scheduler_watermarks
where task = any(%(tasks)s::text[])
"""

SQL_SCHEDULER_ARM = """
-- Parameters: task, occurrence_ms, now. Moves a task's watermark without firing (a task seen for
-- the first time, occurrences passed over). Only ever forward: an arm carrying an older
-- occurrence than the one held changes nothing.
insert into x_scheduler_watermarks as w (task, occurrence_ms, updated_at)
values (%(task)s, %(occurrence_ms)s, %(now)s)
on conflict (task) do update
set occurrence_ms = excluded.occurrence_ms, updated_at = excluded.updated_at
where w.occurrence_ms < excluded.occurrence_ms
"""

SQL_SCHEDULER_FIRE = f"""
-- Parameters: task, previous (the watermark the firing node last read; null: none yet),
-- occurrence_ms (the new watermark), fired_ms (the occurrence that dispatched), and the requests
-- exactly as SQL_ENQUEUE takes them: rows, now, slot_start, due_by.
--
-- Guarantees, in this one statement:
-- * the watermark moves from previous to occurrence_ms, or nothing happens at all. The move is a
--   compare-and-set on the watermark row: a node that lost the race (its previous is stale)
--   inserts no job, records no fire and notifies no one, and the answer's fired is false. A
--   concurrent fire of the same occurrence waits on the row lock and then re-reads the moved
--   watermark, so exactly one of them fires;
-- * the jobs are inserted, announced and answered by SQL_ENQUEUE's own CTEs (see there): a
--   request that inserted nothing is answered with the row that was there, and a null id means
--   that row is not in this statement's snapshot (it committed meanwhile, or an earlier request
--   of this same fire holds the key): SQL_SCHEDULER_HOLDERS reads it once this statement
--   committed;
-- * x_task_fires records fired_ms, never moving a task's record back to an older occurrence.
-- The answer is fired and the queues announced, with one row per refused request (ord, id,
-- run_id) — or one row of nulls besides them when nothing was refused.
with moved as (
    update x_scheduler_watermarks
    set occurrence_ms = %(occurrence_ms)s, updated_at = %(now)s
    where task = %(task)s and occurrence_ms = %(previous)s::bigint
    returning task
),
created as (
    insert into x_scheduler_watermarks (task, occurrence_ms, updated_at)
    select %(task)s, %(occurrence_ms)s, %(now)s
    where %(previous)s::bigint is null
    on conflict (task) do nothing
    returning task
),
fired as (
    select task from moved
    union all
    select task from created
),
request as ({ENQUEUE_REQUEST}
    where exists (select 1 from fired)
),
{ENQUEUE_WRITE},
recorded as (
    insert into x_task_fires as f (task, occurrence_ms, fired_at)
    select task, %(fired_ms)s, %(now)s from fired
    on conflict (task) do update
    set occurrence_ms = excluded.occurrence_ms, fired_at = excluded.fired_at
    where f.occurrence_ms <= excluded.occurrence_ms
)
select exists (select 1 from fired) as fired, a.queues, f.ord, f.id, f.run_id
from announced a
left join refused f on true
"""

SQL_SCHEDULER_HOLDERS = f"""
-- Parameters: rows (SQL_ENQUEUE's document, of the requests asked about).
-- Per request of a fire that committed, the row it deduped onto: the row under its id, else the
-- LIVE row holding its (name, tenant, idempotency key) — the lookup SQL_ENQUEUE answers with.
-- A null answer means that row is gone again (finished and removed since).
with request as ({ENQUEUE_REQUEST}
)
select r.ord, e.id, e.run_id
from request r
left join lateral ({ENQUEUE_HOLDER}
) e on true
order by r.ord
"""

SQL_LEADER_ACQUIRE = """
-- Parameters: name, holder, now, expires_at (now + ttl).
-- Takes the lease when nobody holds it or its holder let it lapse, or renews it for the holder
-- that has it — one statement, so of two nodes racing for a lapsed lease exactly one wins: the
-- second waits on the row lock, re-reads the winner's fresh expiry, and is refused. A renewal
-- keeps acquired_at. Answers a row only when the caller holds the lease now.
insert into x_scheduler_leader as l (name, holder, acquired_at, expires_at)
values (%(name)s, %(holder)s, %(now)s, %(expires_at)s)
on conflict (name) do update
set holder = excluded.holder,
    acquired_at = case when l.holder = excluded.holder and l.expires_at > %(now)s
                       then l.acquired_at else excluded.acquired_at end,
    expires_at = excluded.expires_at
where l.holder = excluded.holder or l.expires_at <= %(now)s
returning holder
"""

SQL_LEADER_RELEASE = """
-- Parameters: name, holder. Hands the lease back so a standby takes it at its next ask instead of
-- waiting out the TTL. Fenced on the holder: a node that already lost the lease removes nothing.
delete from x_scheduler_leader where name = %(name)s and holder = %(holder)s
"""
