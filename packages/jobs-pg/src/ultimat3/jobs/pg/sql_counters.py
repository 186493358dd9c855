"""Per-job counters: reads, and the rollup that folds old buckets into coarser tiers.

The counters move in the statements that settle rows (SQL_ACK, SQL_NACK, SQL_CLAIM); nothing here
counts a settle.
"""

from __future__ import annotations

__all__ = [
    "SQL_COUNTERS",
    "SQL_COUNTERS_DUE_FOR_ROLLUP",
    "SQL_COUNTERS_FOLD",
    "SQL_COUNTER_TOTALS",
]

SQL_COUNTERS = """
-- Parameters: name, since. The buckets of one job that end after since, oldest first.
select name, bucket_start, width_s, done, retried, failed, dead, duration_ms
from x_job_counters
where name = %(name)s
  and bucket_start + make_interval(secs => width_s) > %(since)s
order by bucket_start, width_s
"""

SQL_COUNTER_TOTALS = """
-- Parameters: since. Per job name, the sums of every bucket ending after since.
select name, sum(done)::bigint as done, sum(retried)::bigint as retried,
       sum(failed)::bigint as failed, sum(dead)::bigint as dead,
       sum(duration_ms)::bigint as duration_ms
from x_job_counters
where bucket_start + make_interval(secs => width_s) > %(since)s
group by name
order by name
"""

SQL_COUNTERS_DUE_FOR_ROLLUP = """
-- Parameters: widths[] and retentions[] (seconds, element-wise: the tiers), now.
-- The buckets that have outlived their tier (ended at or before now - retention), locked until
-- the fold commits: two rollups at once fold each bucket once (the second finds them gone).
-- Reads those rows and no other, per tier, through x_job_counters_due_idx (width_s,
-- bucket_start): "ended by now - retention" is "began by now - retention - width" (it read
-- every row: 54 ms at 185k). The tier is matched by a row comparison, not `c.width_s =
-- t.width_s`: with no equality to hash on, the planner does not join the tiers to a scan of
-- the whole table, as it did with one in generic plans and under statistics taken while one
-- tier existed.
select c.name, c.bucket_start, c.width_s, c.done, c.retried, c.failed, c.dead, c.duration_ms
from x_job_counters c
join unnest(%(widths)s::int[], %(retentions)s::int[]) as t (width_s, retention_s)
  -- c.width_s = t.width_s and c.bucket_start <= the tier's cutoff: one index range
  on c.width_s >= t.width_s
 and (c.width_s, c.bucket_start)
     <= (t.width_s, %(now)s::timestamptz - make_interval(secs => t.retention_s)
                                         - make_interval(secs => t.width_s))
order by c.name, c.bucket_start, c.width_s
for update of c
"""

SQL_COUNTERS_FOLD = """
-- Parameters: the folded-away buckets' keys (gone_names[], gone_starts[], gone_widths[]) and the
-- buckets they fold into (names[], starts[], widths[], done[], retried[], failed[], dead[],
-- durations[]), element-wise. Deletes the old buckets and ADDS the folded sums into the coarser
-- buckets, in one statement (run in the transaction that locked them).
with gone as (
    delete from x_job_counters c
    using unnest(%(gone_names)s::text[], %(gone_starts)s::timestamptz[], %(gone_widths)s::int[])
          as g (name, bucket_start, width_s)
    where c.name = g.name and c.bucket_start = g.bucket_start and c.width_s = g.width_s
)
insert into x_job_counters as c (name, bucket_start, width_s, done, retried, failed, dead,
                                 duration_ms)
select *
from unnest(%(names)s::text[], %(starts)s::timestamptz[], %(widths)s::int[],
            %(done)s::bigint[], %(retried)s::bigint[], %(failed)s::bigint[],
            %(dead)s::bigint[], %(durations)s::bigint[])
order by 1, 2, 3
on conflict (name, bucket_start, width_s) do update
set done = c.done + excluded.done,
    retried = c.retried + excluded.retried,
    failed = c.failed + excluded.failed,
    dead = c.dead + excluded.dead,
    duration_ms = c.duration_ms + excluded.duration_ms
"""
