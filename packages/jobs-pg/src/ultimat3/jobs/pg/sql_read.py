"""Reads: queue stats and the operator's view of jobs. None of these write or lock."""

from __future__ import annotations

__all__ = [
    "SQL_JOB_GET",
    "SQL_JOB_LIST",
    "SQL_JOB_LIST_BEFORE",
    "SQL_JOB_STEPS",
    "SQL_STATS",
    "SQL_STATS_WITHOUT_DONE",
]

SQL_STATS = """
-- Parameters: now.
-- Rows per (queue, state), and per queue the run_at of the oldest row that is due and waiting
-- (ready or delayed with run_at <= now): the "oldest ready" age an alert reads.
select queue,
       state,
       count(*) as rows,
       min(run_at) filter (where state in ('ready', 'delayed') and run_at <= %(now)s) as oldest
from x_jobs
group by queue, state
order by queue
"""

SQL_STATS_WITHOUT_DONE = """
-- Parameters: now.
-- SQL_STATS without the done rows, which are most of a table that keeps them: what a metrics
-- scrape or an autoscaler reads. Each branch is answered by a partial index over its states, so
-- the read costs the rows not done, however many done ones the table keeps: the waiting rows by
-- x_jobs_claim_idx, the running ones (each holds a lease) by x_jobs_lapse_idx, the dead, failed
-- and cancelled ones by x_jobs_parked_idx, but for those a claim buried, which keep its token,
-- by x_jobs_buried_idx (a cancelled row never keeps one: the cancel clears it).
select queue, state, count(*) as rows,
       min(run_at) filter (where state in ('ready', 'delayed') and run_at <= %(now)s) as oldest
from x_jobs
where state in ('ready', 'delayed', 'suspended')
group by queue, state
union all
select queue, 'running', count(*), null
from x_jobs
where state = 'running' and lease_until is not null
group by queue
union all
select queue, state, count(*), null
from x_jobs
where state in ('dead', 'failed', 'cancelled') and claim is null
group by queue, state
union all
select queue, state, count(*), null
from x_jobs
where state in ('dead', 'failed') and claim is not null
group by queue, state
order by queue
"""

SQL_JOB_LIST = """
-- Parameters: the filters (NULL = any): queue, name, state, tenant_id, id_prefix, created_from
-- (inclusive), created_to (exclusive); after_at/after_id (a cursor: rows strictly older than it,
-- or NULL for the first page); page (rows to return).
-- One page, newest first by (created_at, id).
select id, run_id, name, queue, state, input, idempotency_key, tenant_id, attempt, max_attempts,
       run_at, created_at, updated_at, finished_at, last_error, progress, worker_id, lease_until,
       enqueued_by, traceparent
from x_jobs
where (%(queue)s::text is null or queue = %(queue)s)
  and (%(name)s::text is null or name = %(name)s)
  and (%(state)s::text is null or state = %(state)s)
  and (%(tenant_id)s::text is null or tenant_id = %(tenant_id)s)
  and (%(id_prefix)s::text is null or starts_with(id, %(id_prefix)s))
  and (%(created_from)s::timestamptz is null or created_at >= %(created_from)s)
  and (%(created_to)s::timestamptz is null or created_at < %(created_to)s)
  and (%(after_at)s::timestamptz is null
       or (created_at, id) < (%(after_at)s::timestamptz, %(after_id)s::text))
order by created_at desc, id desc
limit %(page)s
"""

SQL_JOB_LIST_BEFORE = """
-- Parameters: the filters of SQL_JOB_LIST; before_at/before_id (a cursor); page.
-- The page just NEWER than the cursor: the rows nearest to it, oldest first (the caller reverses
-- them to newest first).
select id, run_id, name, queue, state, input, idempotency_key, tenant_id, attempt, max_attempts,
       run_at, created_at, updated_at, finished_at, last_error, progress, worker_id, lease_until,
       enqueued_by, traceparent
from x_jobs
where (%(queue)s::text is null or queue = %(queue)s)
  and (%(name)s::text is null or name = %(name)s)
  and (%(state)s::text is null or state = %(state)s)
  and (%(tenant_id)s::text is null or tenant_id = %(tenant_id)s)
  and (%(id_prefix)s::text is null or starts_with(id, %(id_prefix)s))
  and (%(created_from)s::timestamptz is null or created_at >= %(created_from)s)
  and (%(created_to)s::timestamptz is null or created_at < %(created_to)s)
  and (created_at, id) > (%(before_at)s::timestamptz, %(before_id)s::text)
order by created_at, id
limit %(page)s
"""

SQL_JOB_GET = """
-- Parameters: id. One job as the operator sees it.
select id, run_id, name, queue, state, input, idempotency_key, tenant_id, attempt, max_attempts,
       run_at, created_at, updated_at, finished_at, last_error, progress, worker_id, lease_until,
       enqueued_by, traceparent
from x_jobs
where id = %(id)s
"""

SQL_JOB_STEPS = """
-- Parameters: run_id. The steps a run stored, in the order they started, each with its kind.
select name, seq, output, completed, kind
from x_job_steps
where run_id = %(run_id)s
order by seq, name
"""
