"""The writes a run makes after its claim: settles, lease renewals, steps and progress.

Every one is fenced on the claim: it matches a row only while that row is ``running`` under exactly
the ``(worker_id, claim)`` the write carries, and answers which rows it matched. A body whose lease
lapsed (and was claimed again, by another worker or by the same one) or whose row was cancelled
changes nothing. One exception, so an ack can be repeated: an ack sent again under the claim that
already finished its row answers that row again, and changes nothing. Ack, nack and heartbeat
take many rows per statement — one statement per batch of concurrent calls — each row still
fenced on its own claim. The batch travels as ONE JSON
document (an array of rows, read as jsonb so it is parsed once): encoding it costs the client a
third of what a dozen arrays do. Its rows are read under ``limit (select count)``, the batch's
length: the planner would guess a JSON document at 100 rows, and judge looking a small batch up
by id dearer than reading the whole table. A limit it cannot read (the subquery) it takes for a
tenth of that, in every plan: a plain ``limit count`` made each call's own plan (a custom plan)
look cheaper than the one made once for any count (the generic plan) whenever the batch was
small, and the plan cache kept planning the statement again on every call: an ack of five took
a quarter longer.

The fence reads ``(state = 'running') is true``, not ``state = 'running'``: the two agree (state
is never null), but only the plain form lets the planner serve the write from the live-key index,
whose predicate it implies. With statistics taken while no row lived, that index looks empty, and
the planner read it whole for every batch: 80 ms an ack of 50 beside 8,000 live rows, against
0.6 ms through the primary key.
"""

from __future__ import annotations

__all__ = [
    "SQL_ACK",
    "SQL_HEARTBEAT",
    "SQL_NACK",
    "SQL_RECORD_PROGRESS",
    "SQL_SAVE_STEP",
    "SQL_UNCLAIMED_STATES",
]

SQL_ACK = """
-- Parameters: rows, a JSON array of [id, worker_id, claim, duration_ms or null]; count (how many
-- rows it holds); now; bucket (the 1-minute counter bucket of now).
-- Guarantees: each row moves running -> done only under its own claim; the 'done' counters and
-- durations move in this same statement, so a count never disagrees with the rows. Answers the
-- ids that landed. A done row keeps the token of the claim whose ack moved it there (the only
-- way in), so an ack sent again under that claim answers its id again and changes nothing: the
-- statement can be repeated when the connection died before its answer arrived.
with settle as (
    select r->>0 as id, r->>1 as worker_id, r->>2 as claim, (r->>3)::bigint as duration_ms
    from jsonb_array_elements(%(rows)s::jsonb) r
    limit (select %(count)s::int)
),
acked as (
    update x_jobs j
    set state = 'done',
        updated_at = %(now)s,
        finished_at = %(now)s,
        worker_id = null,
        lease_until = null
    from settle s
    where j.id = s.id
      and (j.state = 'running') is true
      and j.worker_id = s.worker_id
      and j.claim = s.claim
    returning j.id, j.name, s.duration_ms
),
repeated as (
    -- Acks that landed before, under this same claim. Only the rows this statement did not
    -- move are looked up again (none, on the hot path): the NOT IN filters the batch before the
    -- lookup, and this statement's snapshot would not see its own update anyway.
    select s.id
    from settle s
    where s.id not in (select id from acked)
      and exists (
          select 1 from x_jobs j
          where j.id = s.id and j.state = 'done' and j.claim = s.claim
      )
),
counted as (
    insert into x_job_counters as c (name, bucket_start, width_s, done, duration_ms)
    select name, %(bucket)s, 60, count(*), coalesce(sum(duration_ms), 0)
    from acked
    group by name
    order by name
    on conflict (name, bucket_start, width_s) do update
    set done = c.done + excluded.done,
        duration_ms = c.duration_ms + excluded.duration_ms
)
select id from acked
union all
select id from repeated
"""

SQL_NACK = """
-- Parameters: rows, a JSON array of [id, worker_id, claim, state (the target nack_state()
-- decided: ready, suspended, dead or failed), error (null keeps last_error), run_at (ISO 8601;
-- null: now; read for ready and suspended only), count_attempt (false hands the attempt back),
-- counter (retried / failed / dead, or null for an uncounted attempt), duration_ms]; count;
-- now; bucket.
-- Guarantees: each row moves only under its own claim; its counter moves in this statement.
-- Answers the ids that landed.
with settle as (
    select r->>0 as id,
           r->>1 as worker_id,
           r->>2 as claim,
           r->>3 as state,
           r->>4 as error,
           (r->>5)::timestamptz as run_at,
           (r->>6)::boolean as count_attempt,
           r->>7 as counter,
           (r->>8)::bigint as duration_ms
    from jsonb_array_elements(%(rows)s::jsonb) r
    limit (select %(count)s::int)
),
nacked as (
    update x_jobs j
    set state = s.state,
        attempt = case when s.count_attempt then j.attempt else j.attempt - 1 end,
        last_error = coalesce(s.error, j.last_error),
        run_at = case when s.state in ('ready', 'suspended')
                      then coalesce(s.run_at, %(now)s) else j.run_at end,
        updated_at = %(now)s,
        finished_at = case when s.state in ('dead', 'failed') then %(now)s else j.finished_at end,
        worker_id = null,
        claim = null,
        lease_until = null
    from settle s
    where j.id = s.id
      and (j.state = 'running') is true
      and j.worker_id = s.worker_id
      and j.claim = s.claim
    returning j.id, j.name, s.counter, s.duration_ms
),
counted as (
    insert into x_job_counters as c (
        name, bucket_start, width_s, retried, failed, dead, duration_ms
    )
    select name, %(bucket)s, 60,
           count(*) filter (where counter = 'retried'),
           count(*) filter (where counter = 'failed'),
           count(*) filter (where counter = 'dead'),
           coalesce(sum(duration_ms), 0)
    from nacked
    where counter is not null
    group by name
    order by name
    on conflict (name, bucket_start, width_s) do update
    set retried = c.retried + excluded.retried,
        failed = c.failed + excluded.failed,
        dead = c.dead + excluded.dead,
        duration_ms = c.duration_ms + excluded.duration_ms
)
select id from nacked
"""

SQL_UNCLAIMED_STATES = """
-- Parameters: ids[], now (the instant the nack batch stamped).
-- The state of each of these rows that no claim holds (a nack and an operator's action leave
-- none; a burial leaves the burying claim's token) and that was last changed at ``now``: how a
-- nack batch whose answer was lost learns which of its nacks had landed. A row another run
-- settled since (claimed again after this run's lease lapsed, and nacked to the same state)
-- was stamped at that run's instant, and reads as not landed.
select id, state
from x_jobs
where id = any(%(ids)s::text[])
  and claim is null
  and updated_at = %(now)s
"""

SQL_HEARTBEAT = """
-- Parameters: rows, a JSON array of [id, worker_id, claim, lease_until (ISO 8601: now + that
-- run's visibility timeout)]; count; synchronous_commit (as SQL_CLAIM takes it).
-- Guarantees: a lease is extended only under its own claim; a cancelled row, or one whose lease
-- lapsed and was claimed again, is not renewed — which is how the run learns it lost the row.
-- Committed without waiting for the WAL flush: a renewal lost in a server crash only shortens
-- a lease, which the next renewal (or a redelivery) covers.
update x_jobs j
set lease_until = s.lease_until
from (
    select r->>0 as id, r->>1 as worker_id, r->>2 as claim, (r->>3)::timestamptz as lease_until
    from jsonb_array_elements(%(rows)s::jsonb) r
    limit (select %(count)s::int)
) s,
(select set_config(
     'synchronous_commit',
     coalesce(%(synchronous_commit)s::text, current_setting('synchronous_commit')),
     true
 )) as durability
where j.id = s.id
  and (j.state = 'running') is true
  and j.worker_id = s.worker_id
  and j.claim = s.claim
returning j.id
"""

SQL_SAVE_STEP = """
-- Parameters: job_id, worker_id, claim (the fence), run_id, name, seq, output (JSON text),
-- completed, kind ('run' | 'sleep' | 'wait'), now.
-- kind is stored with the step (and replaced with it) so a replay can refuse a record that
-- another kind of step wrote under the same name.
-- Guarantees: the step is written only while the job is running under this claim. The job row
-- is share-locked while the step is written, so a cancel or a settle either happened before
-- (and nothing is written) or waits until the step is in.
with owner as (
    select id
    from x_jobs
    where id = %(job_id)s
      and (state = 'running') is true
      and worker_id = %(worker_id)s
      and claim = %(claim)s
    for share
)
insert into x_job_steps as s (run_id, name, seq, output, completed, kind, saved_at)
select %(run_id)s, %(name)s, %(seq)s, %(output)s::json, %(completed)s, %(kind)s, %(now)s
from owner
on conflict (run_id, name) do update
set seq = excluded.seq,
    output = excluded.output,
    completed = excluded.completed,
    kind = excluded.kind,
    saved_at = excluded.saved_at
returning 1
"""

SQL_RECORD_PROGRESS = """
-- Parameters: id, worker_id, claim (the fence), progress (JSON text: {done, total, note}),
-- synchronous_commit (as SQL_CLAIM takes it).
-- Guarantees: only the run holding the claim reports on the row. Committed without waiting for
-- the WAL flush: a progress report is a hint, and the next one replaces it.
update x_jobs
set progress = %(progress)s::json
from (
    select set_config(
        'synchronous_commit',
        coalesce(%(synchronous_commit)s::text, current_setting('synchronous_commit')),
        true
    )
) as durability
where id = %(id)s
  and (state = 'running') is true
  and worker_id = %(worker_id)s
  and claim = %(claim)s
returning id
"""
