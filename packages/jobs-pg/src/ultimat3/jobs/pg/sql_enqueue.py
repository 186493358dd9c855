"""Enqueue: one statement inserts a batch of requests and announces the queues it filled.

``SQL_ENQUEUE`` takes a batch as one JSON document. ``SQL_ENQUEUE_ONE`` takes a single request
as plain parameters, which a lone enqueue runs faster (no document to parse, a plan made for one
row), and answers only whether it inserted: ``SQL_ENQUEUE_HELD`` then names the row it met. A
large batch whose requests all insert their own rows goes by ``SQL_ENQUEUE_COPY`` after
``SQL_ENQUEUE_ANNOUNCE``, in one transaction, and falls back to ``SQL_ENQUEUE`` when one of them
meets a row. The scheduler's fire (``sql_scheduler.py``) inserts its jobs by the same rules, so
the parts the statements share are kept here once: the request document, the insert, the
announcement's probe and the refusals (``ENQUEUE_REQUEST``, ``ENQUEUE_WRITE``,
``ENQUEUE_FIRST_WAITING``, ``ENQUEUE_WAITING``, ``ENQUEUE_HOLDER``).
"""

from __future__ import annotations

__all__ = [
    "ENQUEUE_COPY_TYPES",
    "ENQUEUE_FIRST_WAITING",
    "ENQUEUE_HOLDER",
    "ENQUEUE_REQUEST",
    "ENQUEUE_WAITING",
    "ENQUEUE_WRITE",
    "SQL_ENQUEUE",
    "SQL_ENQUEUE_ANNOUNCE",
    "SQL_ENQUEUE_COPY",
    "SQL_ENQUEUE_HELD",
    "SQL_ENQUEUE_ONE",
    "WAKE_CHANNEL",
]

WAKE_CHANNEL = "x_jobs_wake"
"""The LISTEN/NOTIFY channel. Its payload is a queue name and nothing else: every session
listening on the channel reads it."""

ENQUEUE_REQUEST = """
    -- One row per element of rows (request i has ord i, counting from 1).
    select r->>0 as id,
           r->>1 as run_id,
           r->>2 as name,
           r->>3 as queue,
           r->>4 as input,
           r->>5 as idempotency_key,
           r->>6 as tenant_id,
           (r->>7)::int as max_attempts,
           (r->>8)::timestamptz as run_at,
           r->>9 as enqueued_by,
           r->>10 as traceparent,
           ord
    from jsonb_array_elements(%(rows)s::jsonb) with ordinality as e (r, ord)"""
"""The ``request`` CTE's query: the ``rows`` document as one row per request."""

ENQUEUE_HOLDER = """
    -- The row a request r meets: the row under its id first, else the LIVE row holding its
    -- (name, tenant, idempotency key).
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
    limit 1"""
"""A lateral subquery over a request ``r``: the row that was there (at most one)."""

ENQUEUE_FIRST_WAITING = """
        -- Over a queue a.queue the enqueue fills: a row of it created in this wake slot, already
        -- due, that still waits. If one does, whoever committed that row announced the queue (or
        -- was silenced, in turn, by an earlier row of the slot that did), so a woken worker is
        -- coming for it, and the queue is not announced again. That covers a burst (its first
        -- row announces, the rest stay silent) and a worker that took everything and may be back
        -- asleep (nothing of the slot waits: announce). The probe must not see the enqueue's own
        -- rows: a statement's snapshot holds none of the rows its own insert writes
        -- (SQL_ENQUEUE, SQL_ENQUEUE_ONE), and SQL_ENQUEUE_ANNOUNCE runs before its COPY. One
        -- probe per queue on the waiting rows' index (x_jobs_claim_idx), bounded to the slot on
        -- both sides of run_at and stopping at the first row. The rows an enqueuer whose clock
        -- runs ahead or behind queues for its own now fall outside another one's slot, so they
        -- never silence it. A row due before its slot began (run_at set in the past) is outside
        -- it too: it silences nothing, so a run of such enqueues announces each time.
        select 1 from x_jobs j
        where j.queue = a.queue
          and j.state in ('ready', 'delayed', 'suspended')
          and j.run_at >= %(slot_start)s and j.run_at <= %(now)s
          and j.created_at >= %(slot_start)s
        order by j.run_at
        limit 1"""
"""The probe of the wake's throttle, over a queue ``a.queue``: its first waiting row of the slot."""

ENQUEUE_WAITING = f"""
    -- ENQUEUE_FIRST_WAITING counted, as a lateral subquery: a NOT EXISTS there could be planned
    -- as an anti-join over the whole backlog, and the ORDER BY keeps the planner on the index
    -- rather than reading the table from its start (through every finished row) when its
    -- statistics say many rows wait.
    select count(*) as waiting
    from ({ENQUEUE_FIRST_WAITING}
    ) first_waiting"""
"""A lateral subquery over a queue ``a``: one row, ``waiting`` 0 when the queue is announced."""

ENQUEUE_WRITE = f"""\
inserted as (
    -- Rows go in key order, not request order: two enqueues whose batches share keys then wait
    -- on each other's keys in the same order, and cannot deadlock. (Requests sharing a key are
    -- inserted in request order: the first one wins.)
    insert into x_jobs (
        id, run_id, name, queue, state, attempt, max_attempts, run_at, created_at, updated_at,
        idempotency_key, tenant_id, input, enqueued_by, traceparent
    )
    select id, run_id, name, queue,
           case when run_at > %(now)s then 'delayed' else 'ready' end,
           0, max_attempts, run_at, %(now)s, %(now)s,
           idempotency_key, tenant_id, input::json, enqueued_by, traceparent
    from request
    order by name, coalesce(tenant_id, ''), idempotency_key, ord
    on conflict do nothing
    returning id, run_id, queue, run_at
),
announce as (
    select a.queue
    from (select distinct queue from inserted where run_at <= %(due_by)s) a
    cross join lateral ({ENQUEUE_WAITING}
    ) probe
    where probe.waiting = 0
),
announced as (
    select count(pg_notify('x_jobs_wake', queue)) as queues from announce
),
refused as (
    select r.ord, e.id, e.run_id
    from request r
    left join lateral ({ENQUEUE_HOLDER}
    ) e on true
    where not exists (select 1 from inserted i where i.id = r.id)
)"""
"""The CTEs after ``request``: insert, announce (``announced``), and answer the requests that
inserted nothing (``refused``)."""

SQL_ENQUEUE = f"""
-- Parameters: rows, a JSON array with one array per request:
--   [id, run_id, name, queue, input (its JSON text, as a string), idempotency_key, tenant_id,
--    max_attempts, run_at (ISO 8601), enqueued_by, traceparent];
-- the enqueuer's now, slot_start (the start of now's WAKE_SLOT_S slot) and
-- due_by = now + WAKE_DUE_WITHIN_S.
-- (One document rather than eleven arrays: encoding it costs the client a third as much. It is
-- read as jsonb, parsed once — a json document would be parsed again for every field read, ten
-- times the cost. The input travels as a string holding its own JSON text, so it is stored byte
-- for byte, NUL escapes included.)
--
-- Guarantees, per request, in this one statement:
-- * nothing is inserted when the id already names a row (any state) or a LIVE row holds
--   (name, tenant, idempotency key) — ON CONFLICT DO NOTHING arbitrates the primary key and the
--   partial unique index together, so two racing enqueues cannot both insert;
-- * rows are inserted in key order, so two enqueues sharing keys never deadlock;
-- * the answer lists only the requests that inserted nothing (every other one inserted its own
--   row), each with the row that was there: the row under this id first, else the live holder
--   (NULL ids mean that row committed after this statement's snapshot: ask again). It is never
--   empty — its first column counts the queues announced — so the NOTIFYs always run;
-- * a queue is announced on x_jobs_wake only for rows due within WAKE_DUE_WITHIN_S, never for a
--   dedupe, and not while a due row of it created in the same wake slot still waits: a burst
--   announces once, and its later rows stay silent because the woken worker is coming for the
--   queue anyway, but a row that finds nothing of its slot waiting (the worker took it and may
--   be back asleep) is announced, so a lone job never waits for a poll. The test only reads:
--   an enqueuer never waits on another one's announcement (two that commit at once may both
--   announce). NOTIFY is delivered on commit.
-- The requests of one call never share an id or a live key (the driver splits such a batch).
with request as ({ENQUEUE_REQUEST}
),
{ENQUEUE_WRITE}
select a.queues, f.ord, f.id, f.run_id
from announced a
left join refused f on true
"""

SQL_ENQUEUE_ONE = f"""
-- Parameters: one request as its own parameters — id, run_id, name, queue, input (its JSON
-- text), idempotency_key, tenant_id, max_attempts, run_at, enqueued_by, traceparent — and now,
-- slot_start and due_by as SQL_ENQUEUE takes them.
-- SQL_ENQUEUE's insert and announcement for a lone request, by the same rules, answering one
-- row when it inserted (whether it announced the queue) and none when it did not. A request
-- that inserted nothing is answered by SQL_ENQUEUE_HELD, a statement of its own: a lone enqueue
-- almost always inserts, and the lookup of the row that was there (two index scans, a sort),
-- planned before the test of whether it inserted, cost every call a sixth of its time at the
-- server. The announcement is read off the inserted row itself (RETURNING, the probe an
-- EXISTS evaluated for that one row, which cannot become a join): a CTE, an outer SELECT and
-- the probe's count cost a tenth more at the server (measured with pgbench; a CASE in its
-- place kept only a third of the gain). The server evaluates AND's arms in order and stops at
-- the first false; were it ever not to, the worst is a NOTIFY the throttle would have spared,
-- never a missed one (the NOTIFY's arm is always true, so a row due soon that finds nothing
-- waiting has called it either way).
insert into x_jobs as a (
    id, run_id, name, queue, state, attempt, max_attempts, run_at, created_at, updated_at,
    idempotency_key, tenant_id, input, enqueued_by, traceparent
)
values (
    %(id)s, %(run_id)s, %(name)s, %(queue)s,
    case when %(run_at)s::timestamptz > %(now)s then 'delayed' else 'ready' end,
    0, %(max_attempts)s, %(run_at)s, %(now)s, %(now)s,
    %(idempotency_key)s, %(tenant_id)s, %(input)s::json, %(enqueued_by)s, %(traceparent)s
)
on conflict do nothing
returning a.run_at <= %(due_by)s
      and not exists ({ENQUEUE_FIRST_WAITING}
      )
      and pg_notify('x_jobs_wake', a.queue) is not null as announced
"""

SQL_ENQUEUE_HELD = f"""
-- Parameters: id, name, tenant_id, idempotency_key of a request SQL_ENQUEUE_ONE did not insert.
-- The row it met, as SQL_ENQUEUE answers a refused request: the row under its id first, else the
-- live row holding its key (SQL_ENQUEUE_ONE's ON CONFLICT waited for it to commit). No row:
-- that one finished, or was removed, since; the enqueue asks again.
select e.id, e.run_id
from (
    select %(id)s::text as id,
           %(name)s::text as name,
           %(tenant_id)s::text as tenant_id,
           %(idempotency_key)s::text as idempotency_key
) r
cross join lateral ({ENQUEUE_HOLDER}
) e
"""

SQL_ENQUEUE_COPY = """
-- A batch whose every request inserts its own row — the usual fan-out — written by COPY, which
-- the server inserts while the client still sends: an INSERT of the same rows waits until the
-- client has encoded all of them. Run in one transaction after SQL_ENQUEUE_ANNOUNCE. The rows
-- are those SQL_ENQUEUE would insert (state 'delayed' when run_at is past now, else 'ready';
-- attempt 0; created_at and updated_at now), in the same key order, so a COPY and an enqueue
-- sharing keys cannot deadlock either.
-- A COPY cannot skip a row: a request whose id already names a row, or whose key a LIVE row
-- holds, fails it whole with a unique violation (the same two indexes SQL_ENQUEUE's ON
-- CONFLICT arbitrates, so two racing enqueues still cannot both insert). Nothing of it is then
-- applied, the announcement included, and the batch goes to SQL_ENQUEUE, which answers each
-- request.
copy x_jobs (
    id, run_id, name, queue, state, attempt, max_attempts, run_at, created_at, updated_at,
    idempotency_key, tenant_id, input, enqueued_by, traceparent
) from stdin (format binary)
"""

ENQUEUE_COPY_TYPES = (
    "text", "text", "text", "text", "text", "int4", "int4", "timestamptz", "timestamptz",
    "timestamptz", "text", "text", "text", "text", "text",
)  # fmt: skip
"""How SQL_ENQUEUE_COPY's columns are sent, in its order. The input goes as text: the binary
form of ``json`` is its text, so the JSON text the client made is stored byte for byte (sent as
``json``, psycopg would encode it again, as a JSON string)."""

SQL_ENQUEUE_ANNOUNCE = f"""
-- Parameters: queues, those of the rows SQL_ENQUEUE_COPY is about to write that are due by
-- now + WAKE_DUE_WITHIN_S (distinct); now and slot_start as SQL_ENQUEUE takes them.
-- SQL_ENQUEUE's announcement, run in the COPY's transaction BEFORE the COPY, so that it does
-- not see the rows it announces: the same queues are announced, by the same rule, and the
-- NOTIFYs are delivered on commit (or dropped with the COPY). Answers how many were.
select count(pg_notify('x_jobs_wake', a.queue)) as queues
from unnest(%(queues)s::text[]) as a (queue)
cross join lateral ({ENQUEUE_WAITING}
) probe
where probe.waiting = 0
"""
