"""The transactional outbox (``x_outbox``): staged in the caller's transaction, claimed by a relay
under a lease, retired by the relay that holds it.

A row's ``id`` IS the job id the relay publishes it under, and it carries the run id, so the ids
an enqueue answers inside the transaction name the job it becomes. Published rows stay, with
``published_at``, as the audit trail of what was published and when (``SQL_OUTBOX_PURGE`` trims
it).

The writes on rows a relay names read ``(published_at is null) is true``: the same test as
``published_at is null``, but one that does not let the planner serve the write from
x_outbox_pending_idx. With statistics taken while nothing waited, that index looks empty, and
the planner read the whole backlog through it for every batch a relay retired.
"""

from __future__ import annotations

__all__ = [
    "OUTBOX_WAKE_CHANNEL",
    "SQL_OUTBOX_CLAIM",
    "SQL_OUTBOX_CLAIM_TURN",
    "SQL_OUTBOX_MARK_PUBLISHED",
    "SQL_OUTBOX_PURGE",
    "SQL_OUTBOX_RELEASE",
    "SQL_OUTBOX_RETAINED",
    "SQL_OUTBOX_STAGE",
]

OUTBOX_WAKE_CHANNEL = "x_outbox_wake"
"""Notified (with an empty payload) when a staged row commits and no other row waits unclaimed."""

SQL_OUTBOX_STAGE = """
-- Parameters: the EnqueueRequest's fields (id, run_id, name, queue, input as JSON text,
-- idempotency_key, tenant_id, max_attempts, run_at, enqueued_by, traceparent) and staged_at
-- (the stager's now).
--
-- Runs on the CALLER's connection, inside the caller's transaction: the row commits with the
-- business rows written beside it or vanishes with them, and no relay sees it before COMMIT.
-- Guarantees:
-- * the row is the job, ids included: the relay publishes it under this id and run id;
-- * staging an id that is already staged keeps the first row (a repeat is the same job);
-- * x_outbox_wake is notified — delivered on COMMIT, never after a rollback — only when no row
--   already waits unclaimed in this statement's view, and always when the transaction sees an
--   older view than its statement's (REPEATABLE READ, SERIALIZABLE): a row that view shows
--   waiting may have been published since. A waiting row means a relay already has a reason
--   to poll, and a NOTIFY per staged row would queue every committing transaction behind the
--   server's notify lock. (A row published between this statement and the COMMIT leaves the
--   new row to the relay's next poll: its back-off, short right after a pass that published.)
-- That check reads the first unclaimed waiting row through x_outbox_pending_idx, in the relay's
-- order: asked as NOT EXISTS, with statistics taken while rows waited, the planner read the table
-- from its start instead, through every published row the audit trail keeps (6 ms a stage beside
-- 30,000 of them, inside the caller's transaction).
with staged as (
    insert into x_outbox (
        id, run_id, name, queue, input, idempotency_key, tenant_id, max_attempts, run_at,
        enqueued_by, traceparent, staged_at
    )
    values (
        %(id)s, %(run_id)s, %(name)s, %(queue)s, %(input)s::json, %(idempotency_key)s,
        %(tenant_id)s, %(max_attempts)s, %(run_at)s, %(enqueued_by)s, %(traceparent)s,
        %(staged_at)s
    )
    on conflict (id) do nothing
    returning id
)
select pg_notify('x_outbox_wake', '')
where exists (select 1 from staged)
  and (
      current_setting('transaction_isolation') <> 'read committed'
      or (
          select count(*)
          from (
              select 1 from x_outbox
              where published_at is null and claimed_by is null
              order by staged_at, id
              limit 1
          ) first_waiting
      ) = 0
  )
"""

SQL_OUTBOX_CLAIM_TURN = """
-- Run first in the transaction of SQL_OUTBOX_CLAIM: claims take turns, so the claim that follows
-- sees (in its own, later snapshot) every batch claimed before it. Held until that transaction
-- ends, a moment later.
select pg_advisory_xact_lock(hashtext('x_outbox_claim'))
"""

SQL_OUTBOX_CLAIM = """
-- Parameters: claimant, now, lapsed_before (now - the claim lease), limit.
--
-- A claim, not a read. Under autocommit the row locks of FOR UPDATE end with this statement —
-- before the relay has published anything — so the statement that locks the rows also STAMPS
-- them (claimed_by, claimed_at), and that stamp is the lease that keeps a second relay off them.
-- Guarantees:
-- * only unpublished rows nobody else holds are taken: never claimed, handed back, or claimed so
--   long ago that the claim lapsed (the relay died mid-batch) — a row is never held by two relays
--   inside its lease;
-- * rows the same claimant already holds are taken again (and their claim renewed): a claim
--   repeated because its answer was lost answers the batch the first one stamped, instead of
--   stranding it until the lease lapses and handing out later rows ahead of it;
-- * up to limit rows in (staged_at, id) order, a total order: a batch a failed publish handed
--   back is taken again ahead of every row staged after it, so later rows never overtake it;
-- * nothing at or after a row another claimant holds under a live claim (the fence): a batch
--   still being published, or one whose publish failed and whose hand-back failed too, is never
--   overtaken by the rows staged after it — they wait for it to be retired or to lapse. Claims
--   take turns (SQL_OUTBOX_CLAIM_TURN, run first in the same transaction), so each sees every
--   claim made before it: two claims at once would each find no fence in the other;
-- * the answer comes back in (staged_at, id) order, claimant and claim time on every row.
-- The candidates are chosen and locked in a MATERIALIZED CTE before the UPDATE, so the planner
-- cannot fold the LIMIT away and stamp more rows than it hands back; the UPDATE finds them by
-- id as an array, which always plans as a primary-key lookup (a join let a generic plan hash
-- the whole table). The fence reads x_outbox_claimed_idx, the held rows alone (its
-- `claimed_by <> claimant` implies the index's `claimed_by is not null`), and bounds the walk
-- of the pending rows as a row comparison, which the index scan stops at: asked as NOT EXISTS,
-- every row after the fence was read and refused, the whole backlog on every pass while another
-- relay held a batch. The LIMIT reads its value through a subquery: a plain parameter made the
-- plan of each call's own values look cheaper, and the statement was planned again on every pass.
with fence as (
    select staged_at, id
    from x_outbox
    where published_at is null
      and claimed_by <> %(claimant)s
      and claimed_at > %(lapsed_before)s
    order by staged_at, id
    limit 1
),
free as materialized (
    select o.id
    from x_outbox o
    where o.published_at is null
      and (o.claimed_by is null or o.claimed_by = %(claimant)s or o.claimed_at <= %(lapsed_before)s)
      and (o.staged_at, o.id) < (
          coalesce((select staged_at from fence), 'infinity'),
          coalesce((select id from fence), '')
      )
    order by o.staged_at, o.id
    limit (select %(limit)s::int)
    for update
),
claimed as (
    update x_outbox o
    set claimed_by = %(claimant)s, claimed_at = %(now)s
    where o.id = any(array(select id from free))
    returning o.id, o.run_id, o.name, o.queue, o.input, o.idempotency_key, o.tenant_id,
              o.max_attempts, o.run_at, o.enqueued_by, o.traceparent, o.staged_at,
              o.claimed_by, o.claimed_at
)
select * from claimed order by staged_at, id
"""

SQL_OUTBOX_RELEASE = """
-- Parameters: ids, claimant. Hands rows back at once (their publish failed), so the next pass
-- retries them without waiting out the lease.
-- Fenced on the claimant: only rows this claimant still holds move. A relay that stalled past its
-- lease holds nothing any more; its late release must not unclaim rows another relay re-claimed
-- and is publishing right now. Published rows never move. Answers the ids moved.
update x_outbox
set claimed_by = null, claimed_at = null
where id = any(%(ids)s::text[])
  and claimed_by = %(claimant)s
  and (published_at is null) is true
returning id
"""

SQL_OUTBOX_MARK_PUBLISHED = """
-- Parameters: ids, claimant, now. Retires rows the claimant has published; they stay in the table
-- with published_at as the audit trail.
-- Fenced on the claimant: only rows this claimant still holds move. A relay that stalled past its
-- lease must not retire a row another relay re-claimed and has not published yet — that would
-- lose the job outright. A row is retired once. Answers the ids retired.
update x_outbox
set published_at = %(now)s
where id = any(%(ids)s::text[])
  and claimed_by = %(claimant)s
  and (published_at is null) is true
returning id
"""

SQL_OUTBOX_RETAINED = """
-- Parameters: limit. The backlog: rows staged and not yet published, in the order a relay takes
-- them (claimed or not).
select id, run_id, name, queue, input, idempotency_key, tenant_id, max_attempts, run_at,
       enqueued_by, traceparent, staged_at, claimed_by, claimed_at
from x_outbox
where published_at is null
order by staged_at, id
limit %(limit)s
"""

SQL_OUTBOX_PURGE = """
-- Parameters: before. Trims the audit trail: deletes rows published before `before`. A row not
-- yet published is never touched. Answers the rows removed.
with purged as (
    delete from x_outbox
    where published_at < %(before)s
    returning 1
)
select count(*) from purged
"""
