"""The DDL: every table of ultimat3-jobs on Postgres, in ONE idempotent statement.

``SQL_JOBS_TABLE`` is applied by ``install()`` and by ``ujobs migrate --database-url URL``; running
it again changes nothing. It takes a transaction-scoped advisory lock first, so two processes
installing at once (two pods booting) do not race on the catalog.

Conventions every table keeps:

- identifiers and names compare byte-wise (``collate "C"``), the order Python's ``str`` sorts in,
  so "oldest first, ties by id" and every sorted answer is the same on every server locale;
- times are ``timestamptz`` written from the caller's clock (passed as a parameter), never the
  server's ``now()`` — except ``x_job_events``, whose bus runs on the database's clock by design;
- payloads a job replays (inputs, step outputs) are ``json``, which keeps the text it was given,
  so a value reads back exactly as it was written; payloads matched by containment are ``jsonb``.
"""

from __future__ import annotations

__all__ = ["SQL_JOBS_TABLE"]

SQL_JOBS_TABLE = """
-- Held until the end of this (implicit) transaction: one install at a time. 'ujobs' in hex.
select pg_advisory_xact_lock(504296858227);

-- One row per job. A row is never moved to another table: it walks through its states in place,
-- and finished rows stay until an operator removes them (removeMany / ujobs jobs remove).
create table if not exists x_jobs (
    id              text collate "C" primary key,
    run_id          text collate "C" not null,
    name            text collate "C" not null,
    queue           text collate "C" not null,
    state           text not null check (state in (
                        'ready', 'delayed', 'running', 'suspended',
                        'done', 'failed', 'dead', 'cancelled')),
    attempt         integer not null default 0,
    max_attempts    integer not null,
    run_at          timestamptz not null,
    created_at      timestamptz not null,
    updated_at      timestamptz not null,
    finished_at     timestamptz,
    lease_until     timestamptz,
    worker_id       text,
    claim           text,
    idempotency_key text collate "C" not null,
    tenant_id       text collate "C",
    input           json not null,
    last_error      text,
    progress        json,
    enqueued_by     text,
    traceparent     text
);

-- At most one LIVE row per (job name, tenant, idempotency key): the enqueue dedupe. A NULL tenant
-- is its own tenant ('' stands for it). Finished rows free their key.
create unique index if not exists x_jobs_name_tenant_idempotency_live_idx
    on x_jobs (name, coalesce(tenant_id, ''), idempotency_key)
    where state in ('ready', 'delayed', 'running', 'suspended');

-- The claim's scan: waiting rows of one queue, oldest run_at first, ties by id.
create index if not exists x_jobs_claim_idx
    on x_jobs (queue, run_at, id)
    where state in ('ready', 'delayed', 'suspended');

-- Running rows by lease expiry: the claim re-takes (or buries) the ones whose lease lapsed.
-- Only a statement that bounds lease_until can use it (the claim's `lease_until <= now` does).
-- Indexed on state = 'running' alone, it also served every fenced write (ack, nack,
-- heartbeat), and with statistics taken while few rows ran, the planner read ALL running rows
-- through it for each batch: an ack of ten rows beside 30,000 running ones took 14 ms instead
-- of 0.6 ms. Those writes now always find their rows by primary key. (x_jobs_lease_idx was the
-- first definition, dropped here.)
drop index if exists x_jobs_lease_idx;
create index if not exists x_jobs_lapse_idx
    on x_jobs (queue, lease_until)
    where state = 'running' and lease_until is not null;

-- Rows a claim buried (a lapsed final attempt), by the token of that claim: the only finished
-- rows that keep a claim (a nack, a cancel and a requeue clear it; a done row is not in here).
-- A claim whose answer was lost reads its burials back through it, so on_exhausted is still
-- told of them. It holds the dead letters of lapses alone, so it stays small.
create index if not exists x_jobs_buried_idx
    on x_jobs (claim)
    where state in ('dead', 'failed') and claim is not null;

-- Finished rows other than done ones that hold no claim, by queue: stats(include_done=False),
-- which a metrics scrape reads, counts them here and the ones a claim buried in
-- x_jobs_buried_idx, instead of reading every finished row. Only a row that ends dead, failed or
-- cancelled pays for an entry (a done one does not, and most rows end done). Left to the rows
-- without a claim, it never competes with x_jobs_buried_idx for a claim's burials.
create index if not exists x_jobs_parked_idx
    on x_jobs (queue, state)
    where state in ('dead', 'failed', 'cancelled') and claim is null;

-- No index serves the operator's list() (newest first by created_at, id): every row version
-- would pay for it, on the enqueue, the claim and the settle — about a third more index writes
-- per job. list() reads the table instead; a deployment that keeps millions of finished rows
-- and lists them often can add `create index on x_jobs (created_at, id)` itself.

-- One row per completed step of a run (and per open wait). Keyed by run, so a requeued job
-- replays the steps its run already completed.
create table if not exists x_job_steps (
    run_id    text collate "C" not null,
    name      text collate "C" not null,
    seq       integer not null,
    output    json not null,
    completed boolean not null default true,
    saved_at  timestamptz not null,
    primary key (run_id, name)
);

-- Which call wrote the step, so a replay refuses a record another kind of step wrote under its
-- name. Added after the table, for databases made before it; NULL on the rows stored then, which
-- any kind of step replays.
alter table x_job_steps
    add column if not exists kind text check (kind in ('run', 'sleep', 'wait'));

-- Fleet-wide concurrency slots: one row per holder of a key, expiring unless renewed.
-- slot_order is the order holders acquired in ("slot order").
create table if not exists x_job_leases (
    key         text collate "C" not null,
    holder      text collate "C" not null,
    slot_order  bigserial,
    acquired_at timestamptz not null,
    expires_at  timestamptz not null,
    primary key (key, holder)
);

-- Live workers, as their own heartbeat last described them; a row is stale after expires_at.
create table if not exists x_workers (
    id             text collate "C" primary key,
    host           text not null,
    started_at     timestamptz not null,
    queues         text[] not null,
    slots          jsonb not null,
    in_flight      text[] not null,
    last_heartbeat timestamptz not null,
    expires_at     timestamptz not null
);

-- Per-job history in three tiers of buckets (width_s 60, 300, 3600); moved by the statement that
-- settles a row, folded into coarser tiers by rollup.
create table if not exists x_job_counters (
    name         text collate "C" not null,
    bucket_start timestamptz not null,
    width_s      integer not null,
    done         bigint not null default 0,
    retried      bigint not null default 0,
    failed       bigint not null default 0,
    dead         bigint not null default 0,
    duration_ms  bigint not null default 0,
    primary key (name, bucket_start, width_s)
);

-- The rollup's read: per tier, its oldest buckets up to the tier's cutoff. Written once per new
-- bucket; a settle adding into its bucket changes no key column of it.
create index if not exists x_job_counters_due_idx on x_job_counters (width_s, bucket_start);

-- A paused queue is a row here, read by every claim: no worker claims from it.
create table if not exists x_queue_pauses (
    queue     text collate "C" primary key,
    paused_at timestamptz not null
);

-- A paused task is a row here, read by the scheduler when the task falls due.
create table if not exists x_task_pauses (
    task      text collate "C" primary key,
    paused_at timestamptz not null
);

-- Per task, the last occurrence that dispatched.
create table if not exists x_task_fires (
    task          text collate "C" primary key,
    occurrence_ms bigint not null,
    fired_at      timestamptz not null
);

-- Per task, the scheduler's watermark: the last occurrence dispatched or passed over. A fire moves
-- it and enqueues the occurrence's jobs in one statement.
create table if not exists x_scheduler_watermarks (
    task          text collate "C" primary key,
    occurrence_ms bigint not null,
    updated_at    timestamptz not null
);

-- The scheduler's leader: a lease row with an expiry (not an advisory lock, which a pooled
-- connection would drop the moment it went back to the pool).
create table if not exists x_scheduler_leader (
    name        text collate "C" primary key,
    holder      text collate "C" not null,
    acquired_at timestamptz not null,
    expires_at  timestamptz not null
);

-- The transactional outbox: an enqueue staged in the caller's transaction, published by the relay
-- after commit under its own id (id IS the job id). claimed_at/claimed_by are the relay's lease;
-- published rows are kept with published_at as the audit trail.
create table if not exists x_outbox (
    id              text collate "C" primary key,
    run_id          text collate "C" not null,
    name            text collate "C" not null,
    queue           text collate "C" not null,
    input           json not null,
    idempotency_key text collate "C" not null,
    tenant_id       text collate "C",
    max_attempts    integer not null,
    run_at          timestamptz not null,
    enqueued_by     text,
    traceparent     text,
    staged_at       timestamptz not null,
    claimed_at      timestamptz,
    claimed_by      text,
    published_at    timestamptz
);

-- The relay's claim: unpublished rows in (staged_at, id) order.
create index if not exists x_outbox_pending_idx
    on x_outbox (staged_at, id)
    where published_at is null;

-- The claim's fence: the rows a relay holds and has not published yet, a batch or two. Without
-- it the fence read the whole backlog of unpublished rows on every pass (19 ms a pass beside
-- 100,000 waiting rows, against 6 ms with it).
create index if not exists x_outbox_claimed_idx
    on x_outbox (staged_at, id)
    where published_at is null and claimed_by is not null;

-- The backfill ledger: one row per pass, keyed by the run that swept.
create table if not exists x_backfills (
    run_id       text collate "C" primary key,
    name         text collate "C" not null,
    checksum     text not null,
    status       text not null check (status in ('running', 'completed', 'failed')),
    app_version  text,
    rows         bigint not null default 0,
    cursor       jsonb,
    started_at   timestamptz not null,
    completed_at timestamptz,
    error        text
);

-- The order passes began in: passes that share a started_at (a coarse or frozen clock) are newest
-- by the one begun last, where a run id, which the caller may choose, says nothing. An adopting
-- begin keeps a pass's place. Added after the table, for databases made before it; the rows stored
-- then are numbered in the order the table is read, as their ties were never ordered before. (Not
-- as `add column if not exists ... bigserial`: some releases make its sequence even when the
-- column exists, one more each install.)
create sequence if not exists x_backfills_begin_order_seq;
alter table x_backfills add column if not exists begin_order bigint;
alter table x_backfills
    alter column begin_order set default nextval('x_backfills_begin_order_seq');
update x_backfills set begin_order = nextval('x_backfills_begin_order_seq')
where begin_order is null;
alter table x_backfills alter column begin_order set not null;
alter sequence x_backfills_begin_order_seq owned by x_backfills.begin_order;

-- The newest pass of a name is the first row read (latest, list by name). (x_backfills_name_idx,
-- on (name, started_at desc) alone, was the first definition, dropped here.)
drop index if exists x_backfills_name_idx;
create index if not exists x_backfills_newest_idx
    on x_backfills (name, started_at desc, begin_order desc);

-- Events a step.wait_for_event can match; stamped with the database's clock.
create table if not exists x_job_events (
    id           text collate "C" primary key,
    event        text collate "C" not null,
    payload      jsonb not null,
    published_at timestamptz not null,
    expires_at   timestamptz not null
);

-- The lookup's scan: one name's events in (published_at, id) order, so the earliest is the first
-- row read rather than the top of a sort of all that name's events. (x_job_events_lookup_idx,
-- on (event, published_at) alone, was the first definition, dropped here.)
drop index if exists x_job_events_lookup_idx;
create index if not exists x_job_events_earliest_idx on x_job_events (event, published_at, id);
create index if not exists x_job_events_expiry_idx on x_job_events (expires_at);

-- x_job_wake, where the wake's throttle once kept each queue's last announced slot, is no longer
-- read or written (the enqueue now asks x_jobs itself). It is not dropped here, so processes still
-- running the statement that wrote it keep working through a rolling deploy; once none does,
-- `drop table if exists x_job_wake` is safe.
"""
