"""Queue and task pauses: a pause is a row, read by the claim (queues) or the scheduler (tasks).

Pausing a million-row queue writes one row, and takes effect at every worker's next claim.
"""

from __future__ import annotations

__all__ = [
    "SQL_PAUSED_QUEUES",
    "SQL_PAUSED_TASKS",
    "SQL_PAUSE_QUEUE",
    "SQL_PAUSE_TASK",
    "SQL_RESUME_QUEUE",
    "SQL_RESUME_TASK",
]

SQL_PAUSE_QUEUE = """
-- Parameters: queue, now. Idempotent: pausing a paused queue keeps its first pause.
insert into x_queue_pauses (queue, paused_at)
values (%(queue)s, %(now)s)
on conflict (queue) do nothing
"""

SQL_RESUME_QUEUE = """
-- Parameters: queue. Announces the queue, so idle workers claim from it at once.
with resumed as (
    delete from x_queue_pauses where queue = %(queue)s returning queue
)
select pg_notify('x_jobs_wake', %(queue)s)
"""

SQL_PAUSED_QUEUES = """
select queue from x_queue_pauses order by queue
"""

SQL_PAUSE_TASK = """
-- Parameters: task, now. Idempotent.
insert into x_task_pauses (task, paused_at)
values (%(task)s, %(now)s)
on conflict (task) do nothing
"""

SQL_RESUME_TASK = """
-- Parameters: task.
delete from x_task_pauses where task = %(task)s
"""

SQL_PAUSED_TASKS = """
select task from x_task_pauses order by task
"""
