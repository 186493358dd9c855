"""Task fires: per task, the last occurrence that dispatched."""

from __future__ import annotations

__all__ = ["SQL_RECORD_TASK_FIRE", "SQL_TASK_FIRES"]

SQL_RECORD_TASK_FIRE = """
-- Parameters: task, occurrence_ms, now. Never moves a task's record back to an older occurrence.
insert into x_task_fires as f (task, occurrence_ms, fired_at)
values (%(task)s, %(occurrence_ms)s, %(now)s)
on conflict (task) do update
set occurrence_ms = excluded.occurrence_ms, fired_at = excluded.fired_at
where f.occurrence_ms <= excluded.occurrence_ms
"""

SQL_TASK_FIRES = """
-- Parameters: max_rows.
select task, occurrence_ms, fired_at from x_task_fires order by task limit %(max_rows)s
"""
