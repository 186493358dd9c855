"""Emptying every table at once: the test suite's cheap reset between examples."""

from __future__ import annotations

__all__ = ["SQL_RESET"]

SQL_RESET = """
-- Removes every row of every table SQL_JOBS_TABLE creates, keeping the tables. For tests and
-- benchmarks: never run it on a database whose jobs you want.
truncate x_jobs, x_job_steps, x_job_leases, x_workers, x_job_counters, x_queue_pauses,
         x_task_pauses, x_task_fires, x_scheduler_watermarks, x_scheduler_leader, x_outbox,
         x_backfills, x_job_events, x_job_wake
"""
