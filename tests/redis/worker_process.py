"""A worker process for the fault tests: ``python worker_process.py URL PREFIX LOG VISIBILITY``.

Runs ``job_worker`` with the blocking wake over queue ``faults`` until SIGTERM. Its one job,
``fault-job``, appends "<label> <attempt> <pid>" to LOG when it starts, then sleeps for
``input["hang"]`` seconds on its first attempt (0: returns at once).
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass

from ultimat3.jobs.core import job, job_worker
from ultimat3.jobs.redis import redis_job_driver, start_queue_wake

URL, PREFIX, LOG, VISIBILITY = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])


@dataclass
class Fault:
    label: str
    hang: float = 0.0


def _log_start(label: str, attempt: int) -> None:
    with open(LOG, "a") as log:
        log.write(f"{label} {attempt} {os.getpid()}\n")


@job(
    name="fault-job",
    input=Fault,
    idempotency_key=lambda f: f.label,
    tenant="none",
    queue="faults",
)
async def fault_job(*, input: Fault, attempt: int) -> None:
    _log_start(input.label, attempt)
    if attempt == 1 and input.hang:
        await asyncio.sleep(input.hang)


async def main() -> None:
    driver = redis_job_driver(url=URL, prefix=PREFIX)
    wake = start_queue_wake(driver)
    worker = job_worker(
        driver=driver,
        context=lambda: None,
        jobs=[fault_job],
        queues=["faults"],
        concurrency=4,
        wake=wake,
        visibility_timeout=VISIBILITY,
        drain_deadline=1.0,
    )
    try:
        await worker.run()
    finally:
        await wake.close()
        await driver.close()


if __name__ == "__main__":
    asyncio.run(main())
