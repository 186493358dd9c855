"""The backfill ledger (``x_backfills``): one row per pass, keyed by the run that sweeps."""

from __future__ import annotations

__all__ = [
    "SQL_BACKFILL_BEGIN",
    "SQL_BACKFILL_CHECKPOINT",
    "SQL_BACKFILL_COMPLETE",
    "SQL_BACKFILL_FAIL",
    "SQL_BACKFILL_LATEST",
    "SQL_BACKFILL_LIST",
]

SQL_BACKFILL_BEGIN = """
-- Parameters: name, run_id, checksum, app_version, now.
-- Opens the row for this run, or adopts the one an earlier attempt of the same run opened
-- (started_at stays when the pass began; a row that attempt left failed is running again, its
-- error cleared). Answers the row.
-- The conflict arm is an update rather than DO NOTHING and a second read: a begin racing another
-- for the same run waits for its row and answers it, where a read in this statement's snapshot
-- would find nothing.
insert into x_backfills as b (run_id, name, checksum, status, app_version, rows, started_at)
values (%(run_id)s, %(name)s, %(checksum)s, 'running', %(app_version)s, 0, %(now)s)
on conflict (run_id) do update
set status = case when b.status = 'failed' then 'running' else b.status end,
    error = case when b.status = 'failed' then null else b.error end
returning b.name, b.run_id, b.checksum, b.status, b.app_version, b.rows, b.cursor, b.started_at,
          b.completed_at, b.error
"""

SQL_BACKFILL_CHECKPOINT = """
-- Parameters: run_id, rows, cursor (jsonb text).
update x_backfills set rows = %(rows)s, cursor = %(cursor)s::jsonb where run_id = %(run_id)s
"""

SQL_BACKFILL_COMPLETE = """
-- Parameters: run_id, rows, cursor, now.
update x_backfills
set rows = %(rows)s, cursor = %(cursor)s::jsonb, status = 'completed', completed_at = %(now)s
where run_id = %(run_id)s
"""

SQL_BACKFILL_FAIL = """
-- Parameters: run_id, error.
update x_backfills set status = 'failed', error = %(error)s where run_id = %(run_id)s
"""

SQL_BACKFILL_LATEST = """
-- Parameters: name. The newest pass under the name, in any status: the first row SQL_BACKFILL_LIST
-- answers for the name, by the same total order (begin_order is unique, so no two rows tie).
select name, run_id, checksum, status, app_version, rows, cursor, started_at, completed_at, error
from x_backfills
where name = %(name)s
order by started_at desc, begin_order desc
limit 1
"""

SQL_BACKFILL_LIST = """
-- Parameters: name, status (NULL = any), max_rows. Newest first: by started_at, then the pass
-- begun last (begin_order), so passes that began at one instant come in one order every read.
select name, run_id, checksum, status, app_version, rows, cursor, started_at, completed_at, error
from x_backfills
where (%(name)s::text is null or name = %(name)s)
  and (%(status)s::text is null or status = %(status)s)
order by started_at desc, begin_order desc
limit %(max_rows)s
"""
