"""A real worker process for the process-level fault tests (run, killed, run again).

    python worker_process.py DATABASE_URL LOG_FILE VISIBILITY_S CONCURRENCY

Serves two jobs, each appending what it does to LOG_FILE (one short line per write, O_APPEND, so
lines from several processes never interleave):

- ``pg_proc_sleepy`` (queue ``proc-sleepy``): logs ``start <id> <attempt> <pid>`` and then sleeps
  for a minute — long enough for the test to SIGKILL the process mid-job;
- ``pg_proc_work`` (queue ``proc-work``): logs ``start <id> <pid>``, works a few milliseconds,
  logs ``end <id> <pid>``;
- ``pg_proc_slow`` (queue ``proc-slow``): logs ``start <id> <attempt> <pid>``, works a second,
  logs ``end <id> <attempt> <pid>`` — long enough for the test to SIGSTOP the process mid-job.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from ultimat3.jobs.core import Retry, job, job_worker
from ultimat3.jobs.pg import postgres_job_driver, start_queue_wake

LOG = sys.argv[2] if len(sys.argv) > 2 else os.devnull


def log(line: str) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@job(
    input=dict,
    idempotency_key=lambda i: f"sleepy:{i['n']}",
    tenant="none",
    queue="proc-sleepy",
    retry=Retry(attempts=2),
)
async def pg_proc_sleepy(*, input: dict[str, Any], job_id: str, attempt: int) -> None:
    log(f"start {job_id} {attempt} {os.getpid()}")
    await asyncio.sleep(60)


@job(input=dict, idempotency_key=lambda i: f"work:{i['n']}", tenant="none", queue="proc-work")
async def pg_proc_work(*, job_id: str) -> None:
    log(f"start {job_id} {os.getpid()}")
    await asyncio.sleep(0.003)
    log(f"end {job_id} {os.getpid()}")


@job(
    input=dict,
    idempotency_key=lambda i: f"slow:{i['n']}",
    tenant="none",
    queue="proc-slow",
    retry=Retry(attempts=2),
)
async def pg_proc_slow(*, job_id: str, attempt: int) -> None:
    log(f"start {job_id} {attempt} {os.getpid()}")
    await asyncio.sleep(1.0)
    log(f"end {job_id} {attempt} {os.getpid()}")


async def main(url: str, visibility: float, concurrency: int) -> None:
    driver = postgres_job_driver(url)
    wake = start_queue_wake(listener=url, executor=driver.executor)
    worker = job_worker(
        driver=driver,
        context=lambda: None,
        jobs=[pg_proc_sleepy, pg_proc_work, pg_proc_slow],
        concurrency=concurrency,
        visibility_timeout=visibility,
        wake=wake,
    )
    try:
        await worker.run()
    finally:
        await wake.close()
        await driver.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[3]), int(sys.argv[4])))
