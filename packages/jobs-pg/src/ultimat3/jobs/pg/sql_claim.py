"""Claim: one statement hands out a batch over every queue a worker has free slots on."""

from __future__ import annotations

__all__ = ["SQL_CLAIM", "SQL_CLAIM_FLUSH", "SQL_CLAIM_HELD"]

_CLAIMED_ROW = """\
select 'running' as state, t.id, t.run_id, t.name, t.queue, t.input::text, t.idempotency_key,
       t.tenant_id, t.attempt, t.max_attempts, t.run_at, t.created_at, t.enqueued_by,
       t.traceparent, t.claim,
       (select json_agg(json_build_array(s.name, s.seq, s.output, s.completed, s.kind))::text
        from x_job_steps s
        where s.run_id = t.run_id) as steps"""
"""A row ``t`` running under a claim, as a claim answers it: its columns and its run's steps."""

_BURIED_ROW = """\
select b.state, b.id, b.run_id, b.name, b.queue, b.input::text, null, b.tenant_id, b.attempt,
       b.max_attempts, b.run_at, null, null, null, null, null"""
"""A row ``b`` a claim buried, as that claim answers it: in the claimed rows' columns, with
nulls where a buried row has nothing to say."""

SQL_CLAIM = f"""
-- Parameters: slots, a JSON array of {{"queue": …, "free": …}} (free slots per queue), the
-- claimant's now and lease_until (now + visibility timeout), worker_id, claim (this call's
-- fresh token, minted by the claimant), drop[] (job names declaring dead_letter=False), bucket
-- (the 1-minute counter bucket of now) and
-- synchronous_commit ('off'; null keeps the session's setting, as the driver passes when the
-- claim runs inside the caller's own transaction).
--
-- Guarantees, in this one statement:
-- * a row goes to exactly one claimant: candidates are locked FOR UPDATE SKIP LOCKED, so two
--   workers claiming at once take disjoint rows and neither waits for the other;
-- * per queue, due rows in (run_at, id) order up to that queue's free slots: waiting rows
--   (ready / delayed / suspended with run_at <= now) and running rows whose lease lapsed (their
--   worker died or stalled). A paused queue (a row in x_queue_pauses) yields nothing;
-- * a lapsed row already on its final attempt is never handed out: it is settled dead (failed
--   when its name is in drop[]) with last_error LEASE_LAPSED_FINAL_ATTEMPT, counted, and
--   returned once (its state names it). It keeps this call's claim token (no worker, no
--   lease), the one trace SQL_CLAIM_HELD finds it by when the answer is lost. Buried rows
--   take no slot: a row is taken or buried when fewer than the queue's limit of taken rows
--   precede it;
-- * each taken row is running under (worker_id, this call's claim token) until
--   lease_until, its attempt raised
--   by one, and comes back with the steps its run already stored (no statement per job),
--   each with its kind so a replay can refuse a record another kind of step wrote.
--
-- Why the CTEs: the candidates must be chosen and locked with a LIMIT before anything is
-- updated, or the planner may update more rows than the limit. The window over the locked
-- candidates decides which of them are taken; rows locked but not taken are released when the
-- statement commits. The updates find the locked rows by their ctid (the row version the lock
-- is on, which nothing can replace while it is held), not through the primary key again, and
-- as an array, which always plans as a TID scan of just those rows: JOINED on ctid, the
-- planner may instead hash the whole table, finished rows included (EXPLAIN showed it do so).
--
-- Why the slots travel as one JSON document, not as two arrays: the planner reads the length of
-- an array handed to it as a value, so the plan made for each call (a custom plan) priced a
-- one-queue claim below the plan made once for any arrays (the generic plan, which guesses
-- three queues), and the plan cache kept making custom plans: the statement was planned again
-- on every claim, about 0.7 ms of server time, most of a claim of 50. A JSON document gets the
-- same estimate whatever it holds, so after its first runs the plan cache keeps one plan.
--
-- Why synchronous_commit is off for this statement alone: a claim lost in a server crash only
-- leaves its rows as they were before it (claimable again), which is what a worker dying after
-- its claim already means under at-least-once delivery. Not waiting for the WAL flush takes the
-- commit's disk wait (about a millisecond, more under load) out of every claim round. Inside a
-- caller's transaction it stays as it was: a local setting outlives the statement there, and
-- would make the caller's own COMMIT skip the flush.
with durability as (
    select set_config(
        'synchronous_commit',
        coalesce(%(synchronous_commit)s::text, current_setting('synchronous_commit')),
        true
    )
),
slot as (
    select q.queue, q.free
    from jsonb_to_recordset(%(slots)s::jsonb) as q (queue text, free int)
    cross join durability
    where q.free > 0
      and not exists (select 1 from x_queue_pauses p where p.queue = q.queue)
),
waiting as (
    select s.queue, s.free, c.tid, c.id, c.run_at, false as exhausted
    from slot s
    cross join lateral (
        select j.ctid as tid, j.id, j.run_at
        from x_jobs j
        where j.queue = s.queue
          and j.state in ('ready', 'delayed', 'suspended')
          and j.run_at <= %(now)s
        order by j.run_at, j.id
        limit s.free
        for update skip locked
    ) c
),
lapsed as (
    -- Asked first whether any lease lapsed at all, through x_jobs_lapse_idx in lease order (the
    -- ORDER BY keeps the probe on it). With statistics taken while most rows ran, the planner
    -- reads the lapsed rows by scanning the whole table, finished rows included; the probe
    -- skips that scan on every claim that finds no lapsed lease, which is nearly all of them.
    select s.queue, s.free, c.tid, c.id, c.run_at, c.exhausted
    from slot s
    cross join lateral (
        select count(*) as lapsing
        from (
            select 1 from x_jobs f
            where f.queue = s.queue
              and f.state = 'running'
              and f.lease_until <= %(now)s
            order by f.lease_until
            limit 1
        ) first_lapsed
    ) probe
    cross join lateral (
        select j.ctid as tid, j.id, j.run_at, j.attempt >= j.max_attempts as exhausted
        from x_jobs j
        where probe.lapsing > 0
          and j.queue = s.queue
          and j.state = 'running'
          and j.lease_until <= %(now)s
        for update skip locked
    ) c
),
candidate as (
    select * from waiting
    union all
    select * from lapsed
),
picked as (
    select tid, exhausted
    from (
        select tid, exhausted, free,
               count(*) filter (where not exhausted) over (
                   partition by queue
                   order by run_at, id
                   rows between unbounded preceding and 1 preceding
               ) as taken_before
        from candidate
    ) ranked
    where taken_before < free
),
taken as (
    update x_jobs j
    set state = 'running',
        attempt = j.attempt + 1,
        worker_id = %(worker_id)s,
        claim = %(claim)s,
        lease_until = %(lease_until)s,
        updated_at = %(now)s
    where j.ctid = any(array(select tid from picked where not exhausted))
    returning j.id, j.run_id, j.name, j.queue, j.input, j.idempotency_key, j.tenant_id,
              j.attempt, j.max_attempts, j.run_at, j.created_at, j.enqueued_by, j.traceparent,
              j.claim
),
buried as (
    update x_jobs j
    set state = case when j.name = any(%(drop)s::text[]) then 'failed' else 'dead' end,
        last_error = 'LEASE_LAPSED_FINAL_ATTEMPT',
        updated_at = %(now)s,
        finished_at = %(now)s,
        worker_id = null,
        claim = %(claim)s,
        lease_until = null
    where j.ctid = any(array(select tid from picked where exhausted))
    returning j.id, j.run_id, j.name, j.queue, j.input, j.tenant_id, j.attempt, j.max_attempts,
              j.run_at, j.state
),
counted as (
    insert into x_job_counters as c (name, bucket_start, width_s, failed, dead)
    select name, %(bucket)s, 60,
           count(*) filter (where state = 'failed'),
           count(*) filter (where state = 'dead')
    from buried
    group by name
    order by name
    on conflict (name, bucket_start, width_s) do update
    set failed = c.failed + excluded.failed,
        dead = c.dead + excluded.dead
)
{_CLAIMED_ROW}
from taken t
union all
{_BURIED_ROW}
from buried b
"""

SQL_CLAIM_HELD = f"""
-- Parameters: queues[] (the queues the lost claim asked), worker_id, claim and lease_until (as
-- that claim was sent).
-- The rows a claim whose answer was lost had taken and buried, as the claim answers them. A
-- claim that committed left each row it took running under its own (worker_id, claim) until
-- exactly its lease_until, which the lapse index finds per queue, and each row it buried dead
-- or failed under its claim token, which x_jobs_buried_idx finds (an operator who requeued
-- such a row since took it out of both answers). A claim that never ran took nothing.
{_CLAIMED_ROW}
from x_jobs t
where t.queue = any(%(queues)s::text[])
  and t.state = 'running'
  and t.lease_until = %(lease_until)s
  and t.worker_id = %(worker_id)s
  and t.claim = %(claim)s
union all
{_BURIED_ROW}
from x_jobs b
where b.state in ('dead', 'failed')
  and b.claim = %(claim)s
"""

SQL_CLAIM_FLUSH = """
-- Parameters: ids[], the rows a claim buried. Run after that claim, before its answer is acted
-- on. SQL_CLAIM commits without waiting for its WAL to reach the disk (synchronous_commit off):
-- what a crash takes back of a claim, the rows it took, only goes back to the queue. A burial is
-- different: it is announced (on_exhausted, the job's on_settled), and a crash that took it back
-- would have the next claim bury and announce it again. This statement writes those rows again,
-- unchanged, and commits with the session's own synchronous_commit: its commit waits for the
-- WAL to be flushed up to its own record, and so through every commit before it, the claim's
-- included. (A transaction that writes nothing commits without a flush, even with an id.) A row
-- an operator has requeued since is not written: its burial no longer matters.
update x_jobs
set updated_at = updated_at
where id = any(%(ids)s::text[])
  and state in ('dead', 'failed')
"""
