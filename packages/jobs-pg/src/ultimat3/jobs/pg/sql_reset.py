"""Emptying every table at once: the test suite's cheap reset between examples."""

from __future__ import annotations

__all__ = ["SQL_RESET"]

SQL_RESET = """
-- Removes every row of every table SQL_JOBS_TABLE creates, keeping the tables. For tests and
-- benchmarks: never run it on a database whose jobs you want. DELETE rather than TRUNCATE: on
-- the few rows a test leaves it is a fraction of a millisecond, where TRUNCATE syncs new files.
delete from x_jobs;
delete from x_job_steps;
delete from x_job_leases;
delete from x_workers;
delete from x_job_counters;
delete from x_queue_pauses;
delete from x_task_pauses;
delete from x_task_fires;
delete from x_scheduler_watermarks;
delete from x_scheduler_leader;
delete from x_outbox;
delete from x_backfills;
delete from x_job_events;
"""
