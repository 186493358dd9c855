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

SQL_SCHEDULER_FIRE = """
-- Parameters: task, previous (the watermark the firing node last read; null: none yet),
-- occurrence_ms (the new watermark), fired_ms (the occurrence that dispatched), now, and one
-- array per EnqueueRequest field (element i of each array is request i), as SQL_ENQUEUE takes
-- them.
--
-- Guarantees, in this one statement:
-- * the watermark moves from previous to occurrence_ms, or nothing happens at all. The move is a
--   compare-and-set on the watermark row: a node that lost the race (its previous is stale)
--   inserts no job, records no fire and notifies no one, and the answer's fired is false. A
--   concurrent fire of the same occurrence waits on the row lock and then re-reads the moved
--   watermark, so exactly one of them fires;
-- * the jobs are inserted under SQL_ENQUEUE's rules: nothing is inserted when the id already names
--   a row (any state) or a LIVE row holds (name, tenant, idempotency key); each answer names the
--   row that was there. A null answer means that row is not in this statement's snapshot (it
--   committed meanwhile, or an earlier request of this same fire holds the key):
--   SQL_SCHEDULER_HOLDERS reads it once this statement committed;
-- * x_task_fires records fired_ms, never moving a task's record back to an older occurrence;
-- * x_jobs_wake is notified once per queue this fire inserted a row in (delivered on commit),
--   never for a dedupe and never for a refused fire.
-- The answer is one row per request (ord, id, run_id, deduped), each carrying fired and the
-- queues announced — or one row of nulls besides fired when there are no requests or the fire
-- was refused.
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
request as (
    select r.*
    from unnest(
        %(ids)s::text[], %(run_ids)s::text[], %(names)s::text[], %(queues)s::text[],
        %(inputs)s::text[], %(keys)s::text[], %(tenants)s::text[], %(max_attempts)s::int[],
        %(run_ats)s::timestamptz[], %(enqueued_bys)s::text[], %(traceparents)s::text[]
    ) with ordinality as r (
        id, run_id, name, queue, input, idempotency_key, tenant_id, max_attempts,
        run_at, enqueued_by, traceparent, ord
    )
    where exists (select 1 from fired)
),
inserted as (
    insert into x_jobs (
        id, run_id, name, queue, state, attempt, max_attempts, run_at, created_at, updated_at,
        idempotency_key, tenant_id, input, enqueued_by, traceparent
    )
    select id, run_id, name, queue,
           case when run_at > %(now)s then 'delayed' else 'ready' end,
           0, max_attempts, run_at, %(now)s, %(now)s,
           idempotency_key, tenant_id, input::json, enqueued_by, traceparent
    from request
    order by ord
    on conflict do nothing
    returning id, run_id, queue
),
recorded as (
    insert into x_task_fires as f (task, occurrence_ms, fired_at)
    select task, %(fired_ms)s, %(now)s from fired
    on conflict (task) do update
    set occurrence_ms = excluded.occurrence_ms, fired_at = excluded.fired_at
    where f.occurrence_ms <= excluded.occurrence_ms
),
answer as (
    select r.ord,
           coalesce(i.id, e.id) as id,
           coalesce(i.run_id, e.run_id) as run_id,
           i.id is null as deduped
    from request r
    left join inserted i on i.id = r.id
    left join lateral (
        (select j.id, j.run_id, 1 as rank
         from x_jobs j
         where i.id is null and j.id = r.id)
        union all
        (select j.id, j.run_id, 2 as rank
         from x_jobs j
         where i.id is null
           and j.name = r.name
           and coalesce(j.tenant_id, '') = coalesce(r.tenant_id, '')
           and j.idempotency_key = r.idempotency_key
           and j.state in ('ready', 'delayed', 'running', 'suspended'))
        order by rank
        limit 1
    ) e on true
)
select outcome.fired, outcome.announced, a.ord, a.id, a.run_id, a.deduped
from (
    select exists (select 1 from fired) as fired,
           (select count(pg_notify('x_jobs_wake', q.queue))
            from (select distinct queue from inserted) q) as announced
) outcome
left join answer a on true
order by a.ord
"""

SQL_SCHEDULER_HOLDERS = """
-- Parameters: ids, names, tenants, keys (element i of each array is request i).
-- Per request of a fire that committed, the row it deduped onto: the row under its id, else the
-- LIVE row holding its (name, tenant, idempotency key) — the same order SQL_ENQUEUE answers in.
-- A null answer means that row is gone again (finished and removed since).
select r.ord, e.id, e.run_id
from unnest(%(ids)s::text[], %(names)s::text[], %(tenants)s::text[], %(keys)s::text[])
     with ordinality as r (id, name, tenant_id, idempotency_key, ord)
left join lateral (
    (select j.id, j.run_id, 1 as rank
     from x_jobs j
     where j.id = r.id)
    union all
    (select j.id, j.run_id, 2 as rank
     from x_jobs j
     where j.name = r.name
       and coalesce(j.tenant_id, '') = coalesce(r.tenant_id, '')
       and j.idempotency_key = r.idempotency_key
       and j.state in ('ready', 'delayed', 'running', 'suspended'))
    order by rank
    limit 1
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
