"""The operator's writes on jobs: remove, requeue, cancel and promote — one row or up to
MAX_BULK_ROWS per call. Each is one statement; every one that makes a row due announces its queue.
"""

from __future__ import annotations

__all__ = [
    "SQL_JOB_CANCEL",
    "SQL_JOB_PROMOTE",
    "SQL_JOB_REMOVE",
    "SQL_JOB_REQUEUE",
    "SQL_PROMOTE_MANY",
    "SQL_REMOVE_MANY",
    "SQL_REQUEUE_MANY",
    "SQL_RUN_STEPS_SWEEP",
]

SQL_JOB_REMOVE = """
-- Parameters: id.
-- Deletes the job unless it is running (a running row is answered, not deleted: cancel it first),
-- and its steps when no other row shares its run. Answers the state the row had (no row: there
-- was none) and, when it left the steps to another row of the run, that run (shared_run): the
-- caller sweeps it with SQL_RUN_STEPS_SWEEP once this has committed.
with target as (
    select id, run_id, state from x_jobs where id = %(id)s for update
),
removed as (
    delete from x_jobs j
    using target t
    where j.id = t.id and t.state <> 'running'
    returning j.id, j.run_id
),
run_rows as (
    -- The removed row's run, when it has steps, with whether another row names it. No index
    -- covers run_id (every row version would pay for one), so "another row" reads the table: it
    -- is asked only of a run that has steps (a one-time filter), never of one that has none.
    select r.run_id, shared.others
    from removed r
    cross join lateral (
        select count(*) as steps
        from (select 1 from x_job_steps s where s.run_id = r.run_id limit 1) first_step
    ) has
    cross join lateral (
        select count(*) as others
        from (
            select 1 from x_jobs o
            where has.steps > 0 and o.run_id = r.run_id and o.id <> r.id
            limit 1
        ) first_other
    ) shared
    where has.steps > 0
),
dropped_steps as (
    delete from x_job_steps s
    using run_rows o
    where s.run_id = o.run_id and o.others = 0
)
select t.state, (select o.run_id from run_rows o where o.others > 0) as shared_run
from target t
"""

SQL_RUN_STEPS_SWEEP = """
-- Parameters: run_ids.
-- The steps of these runs, deleted when no row names the run any more. Run after a remove that
-- left a run's steps to another row of it has committed: that row's own remove, at the same
-- time, decided from a snapshot still holding the first row, and left them too. Whichever of
-- the two commits last sweeps after both have, and finds neither.
delete from x_job_steps s
where s.run_id = any(%(run_ids)s::text[])
  and not exists (select 1 from x_jobs o where o.run_id = s.run_id)
"""

SQL_JOB_REQUEUE = """
-- Parameters: id, from_step (NULL: keep every step), now.
-- Re-queues ONE finished row (done, failed, dead, cancelled) as ready, attempt 0, due now — unless
-- a live row holds its key. from_step drops that step and every step that started after it, in
-- this statement. Answers the diagnosis (the row's state, the live holder's id, whether from_step
-- exists) and the moved row; the caller turns a refusal into its error. A key taken by an enqueue
-- racing this statement fails it with a unique violation (the same refusal).
with target as (
    select * from x_jobs where id = %(id)s for update
),
holder as (
    -- Looked up from the target's key (lateral), so the live-key index is searched by it: a
    -- join let the planner read that index whole when statistics made it look empty.
    select h.id
    from target t
    cross join lateral (
        select j.id
        from x_jobs j
        where j.name = t.name
          and coalesce(j.tenant_id, '') = coalesce(t.tenant_id, '')
          and j.idempotency_key = t.idempotency_key
          and j.state in ('ready', 'delayed', 'running', 'suspended')
          and j.id <> t.id
        limit 1
    ) h
),
cut as (
    select s.seq
    from x_job_steps s, target t
    where s.run_id = t.run_id and s.name = %(from_step)s
),
allowed as (
    select t.id, t.run_id
    from target t
    where t.state in ('done', 'failed', 'dead', 'cancelled')
      and not exists (select 1 from holder)
      and (%(from_step)s::text is null or exists (select 1 from cut))
),
dropped_steps as (
    delete from x_job_steps s
    using allowed a, cut c
    where s.run_id = a.run_id and s.seq >= c.seq
),
moved as (
    update x_jobs j
    -- Due now; a row cancelled while it ran (it kept that run's lease_until), once that run is
    -- over, so the runs never overlap.
    set state = 'ready', attempt = 0, last_error = null, progress = null,
        run_at = greatest(%(now)s, coalesce(j.lease_until, %(now)s)),
        updated_at = %(now)s, finished_at = null, worker_id = null, claim = null,
        lease_until = null
    from allowed a
    where j.id = a.id
    returning j.id, j.run_id, j.name, j.queue, j.state, j.input, j.idempotency_key, j.tenant_id,
              j.attempt, j.max_attempts, j.run_at, j.created_at, j.updated_at, j.finished_at,
              j.last_error, j.progress, j.worker_id, j.lease_until, j.enqueued_by, j.traceparent
)
select (select state from target) as found_state,
       (select id from holder) as holder_id,
       exists (select 1 from cut) as step_found,
       (select count(pg_notify('x_jobs_wake', queue)) from moved) as announced,
       m.*
from (select 1) one
left join moved m on true
"""

SQL_JOB_CANCEL = """
-- Parameters: id, error (the last_error to record), now.
-- Stops a LIVE row (ready, delayed, running, suspended); a finished row is left as it ended. A
-- running row's worker finds out at its next heartbeat or settle: both are fenced on state =
-- 'running', so the cancelled run can neither renew nor un-cancel it. A running row keeps its
-- lease_until: the cancelled run stops by then (its worker's heartbeat, or the lease lost), and a
-- requeue makes the row due no earlier, so the run it starts never runs beside the cancelled one.
update x_jobs
set state = 'cancelled', last_error = %(error)s, updated_at = %(now)s, finished_at = %(now)s,
    worker_id = null, claim = null,
    lease_until = case when state = 'running' then lease_until end
where id = %(id)s
  -- `is true`: by primary key, never the live-key index a plain IN would let the planner read
  -- whole (see sql_settle.py)
  and (state in ('ready', 'delayed', 'running', 'suspended')) is true
returning id, run_id, name, queue, state, input, idempotency_key, tenant_id, attempt,
          max_attempts, run_at, created_at, updated_at, finished_at, last_error, progress,
          worker_id, lease_until, enqueued_by, traceparent
"""

SQL_JOB_PROMOTE = """
-- Parameters: id, now.
-- A row waiting on its run time (delayed, or ready but backing off to a later run_at) becomes
-- due now and is announced. Answers the row's state before, and the moved row.
with target as (
    select id, state, run_at from x_jobs where id = %(id)s for update
),
moved as (
    update x_jobs j
    set run_at = %(now)s, state = 'ready', updated_at = %(now)s
    from target t
    where j.id = t.id and t.state in ('delayed', 'ready') and t.run_at > %(now)s
    returning j.id, j.run_id, j.name, j.queue, j.state, j.input, j.idempotency_key, j.tenant_id,
              j.attempt, j.max_attempts, j.run_at, j.created_at, j.updated_at, j.finished_at,
              j.last_error, j.progress, j.worker_id, j.lease_until, j.enqueued_by, j.traceparent
)
select (select state from target) as found_state,
       (select count(pg_notify('x_jobs_wake', queue)) from moved) as announced,
       m.*
from (select 1) one
left join moved m on true
"""

SQL_REQUEUE_MANY = """
-- Parameters: state (a finished state), queue / name / tenant_id (NULL = any), now, max_rows.
-- Re-queues finished rows, oldest (created_at, id) first, at most max_rows. A row whose key a
-- live row holds stays where it is; of several rows sharing one free key only the oldest moves
-- (the next would collide with it). remaining = free keys left after this call, so a caller
-- looping "until remaining is 0" stops. A key taken by a racing enqueue fails the statement with
-- a unique violation; the caller runs it again.
with candidate as (
    select j.id, j.name, coalesce(j.tenant_id, '') as tenant, j.idempotency_key, j.created_at
    from x_jobs j
    where j.state = %(state)s
      and (%(queue)s::text is null or j.queue = %(queue)s)
      and (%(name)s::text is null or j.name = %(name)s)
      and (%(tenant_id)s::text is null or j.tenant_id = %(tenant_id)s)
      and not exists (
          select 1 from x_jobs l
          where l.name = j.name
            and coalesce(l.tenant_id, '') = coalesce(j.tenant_id, '')
            and l.idempotency_key = j.idempotency_key
            and l.state in ('ready', 'delayed', 'running', 'suspended'))
),
oldest_per_key as (
    select distinct on (name, tenant, idempotency_key) id, created_at
    from candidate
    order by name, tenant, idempotency_key, created_at, id
),
chosen as (
    select j.id
    from x_jobs j
    where j.id in (select id from oldest_per_key order by created_at, id limit %(max_rows)s)
      and j.state = %(state)s
    for update
),
moved as (
    update x_jobs j
    -- Due now; a row cancelled while it ran (it kept that run's lease_until), once that run is
    -- over, so the runs never overlap.
    set state = 'ready', attempt = 0, last_error = null, progress = null,
        run_at = greatest(%(now)s, coalesce(j.lease_until, %(now)s)),
        updated_at = %(now)s, finished_at = null, worker_id = null, claim = null,
        lease_until = null
    from chosen c
    where j.id = c.id
    returning j.queue
)
select (select count(*) from moved) as affected,
       (select count(*) from oldest_per_key) - (select count(*) from moved) as remaining,
       (select count(pg_notify('x_jobs_wake', q.queue))
        from (select distinct queue from moved) q) as announced
"""

SQL_REMOVE_MANY = """
-- Parameters: state (never 'running'), queue / name / tenant_id (NULL = any), max_rows.
-- Deletes up to max_rows matching rows, oldest first, with the steps no remaining row's run
-- shares. remaining = matching rows left; shared_runs = the runs whose steps it left to a row
-- it did not remove, for SQL_RUN_STEPS_SWEEP once this has committed (see there).
with chosen as (
    select id, run_id
    from x_jobs
    where state = %(state)s
      and (%(queue)s::text is null or queue = %(queue)s)
      and (%(name)s::text is null or name = %(name)s)
      and (%(tenant_id)s::text is null or tenant_id = %(tenant_id)s)
    order by created_at, id
    limit %(max_rows)s
    for update
),
removed as (
    delete from x_jobs j
    using chosen c
    where j.id = c.id and j.state = %(state)s
    returning j.id, j.run_id
),
shared as (
    select distinct r.run_id
    from removed r
    where exists (select 1 from x_job_steps s where s.run_id = r.run_id)
      and exists (
          select 1 from x_jobs o
          where o.run_id = r.run_id and o.id not in (select id from removed))
),
dropped_steps as (
    delete from x_job_steps s
    where s.run_id in (select run_id from removed)
      and s.run_id not in (select run_id from shared)
)
select (select count(*) from removed) as affected,
       (select count(*)
        from x_jobs
        where state = %(state)s
          and (%(queue)s::text is null or queue = %(queue)s)
          and (%(name)s::text is null or name = %(name)s)
          and (%(tenant_id)s::text is null or tenant_id = %(tenant_id)s))
       - (select count(*) from removed) as remaining,
       array(select run_id from shared) as shared_runs
"""

SQL_PROMOTE_MANY = """
-- Parameters: state (delayed or ready), queue / name / tenant_id (NULL = any), now, max_rows.
-- Every matching row still waiting on its run_at (run_at > now) becomes due now, oldest first,
-- at most max_rows; their queues are announced. remaining = rows still waiting.
with waiting as (
    select id
    from x_jobs
    where state = %(state)s
      and run_at > %(now)s
      and (%(queue)s::text is null or queue = %(queue)s)
      and (%(name)s::text is null or name = %(name)s)
      and (%(tenant_id)s::text is null or tenant_id = %(tenant_id)s)
),
chosen as (
    select j.id
    from x_jobs j
    where j.id in (select id from waiting)
    order by j.created_at, j.id
    limit %(max_rows)s
    for update
),
moved as (
    update x_jobs j
    set run_at = %(now)s, state = 'ready', updated_at = %(now)s
    from chosen c
    where j.id = c.id and j.state = %(state)s and j.run_at > %(now)s
    returning j.queue
)
select (select count(*) from moved) as affected,
       (select count(*) from waiting) - (select count(*) from moved) as remaining,
       (select count(pg_notify('x_jobs_wake', q.queue))
        from (select distinct queue from moved) q) as announced
"""
