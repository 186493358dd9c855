"""Enqueue: one statement inserts a whole batch and announces the queues it filled."""

from __future__ import annotations

__all__ = ["SQL_ENQUEUE", "WAKE_CHANNEL"]

WAKE_CHANNEL = "x_jobs_wake"
"""The LISTEN/NOTIFY channel. Its payload is a queue name and nothing else: every session
listening on the channel reads it."""

SQL_ENQUEUE = """
-- Parameters: one array per EnqueueRequest field (element i of each array is request i), the
-- enqueuer's now, the wake slot of now (floor(now / WAKE_SLOT_S)) and
-- due_by = now + WAKE_DUE_WITHIN_S.
--
-- Guarantees, per request, in this one statement:
-- * nothing is inserted when the id already names a row (any state) or a LIVE row holds
--   (name, tenant, idempotency key) — ON CONFLICT DO NOTHING arbitrates the primary key and the
--   partial unique index together, so two racing enqueues cannot both insert;
-- * the answer names the row that was there: the row under this id first, else the live holder
--   (a NULL answer means that row committed after this statement's snapshot: ask again);
-- * a queue is announced on x_jobs_wake at most once per wake slot, only for rows due within
--   WAKE_DUE_WITHIN_S, and never for a dedupe. The slot row is taken with SKIP LOCKED: an
--   enqueuer never waits on another one's announcement. NOTIFY is delivered on commit.
-- The requests of one call never share an id or a live key (the driver splits such a batch).
with request as (
    select *
    from unnest(
        %(ids)s::text[], %(run_ids)s::text[], %(names)s::text[], %(queues)s::text[],
        %(inputs)s::text[], %(keys)s::text[], %(tenants)s::text[], %(max_attempts)s::int[],
        %(run_ats)s::timestamptz[], %(enqueued_bys)s::text[], %(traceparents)s::text[]
    ) with ordinality as r (
        id, run_id, name, queue, input, idempotency_key, tenant_id, max_attempts,
        run_at, enqueued_by, traceparent, ord
    )
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
    returning id, run_id, queue, run_at
),
announce as (
    select distinct queue from inserted where run_at <= %(due_by)s
),
woken as (
    update x_job_wake w
    set slot = %(slot)s
    from (
        select queue from x_job_wake
        where queue in (select queue from announce) and slot < %(slot)s
        order by queue
        for update skip locked
    ) held
    where w.queue = held.queue
    returning w.queue
),
born as (
    insert into x_job_wake (queue, slot)
    select a.queue, %(slot)s
    from announce a
    where not exists (select 1 from x_job_wake w where w.queue = a.queue)
    order by a.queue
    on conflict do nothing
    returning queue
)
select r.ord,
       coalesce(i.id, e.id) as id,
       coalesce(i.run_id, e.run_id) as run_id,
       i.id is null as deduped,
       (select count(pg_notify('x_jobs_wake', q.queue))
        from (select queue from woken union all select queue from born) q) as announced
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
order by r.ord
"""
