"""The worker process pg_bench.py starts: ONE ``job_worker`` on the Postgres driver, with the wake.

    python bench/pg_worker.py DATABASE_URL CONCURRENCY SIGNAL_SOCKET

The job's whole body reports "job i started at t" to the benchmark over a Unix datagram socket
(datagrams on AF_UNIX block rather than drop, so no start is lost). Every claim the driver makes is
reported too (``claim t``), which is how the benchmark counts idle claims, and every statement the
driver sends (``stmt``). Runs until SIGTERM.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Any

from ultimat3.jobs.core import job, job_worker
from ultimat3.jobs.pg import postgres_job_driver, start_queue_wake

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from event_loop import run_worker

QUEUE = "bench"
SIGNAL = sys.argv[3] if len(sys.argv) > 3 else ""
_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)


def report(line: bytes) -> None:
    if SIGNAL:
        _sock.sendto(line, SIGNAL)


@job(input=dict, idempotency_key=lambda i: f"bench:{i['i']}", tenant="none", queue=QUEUE)
async def bench_noop(*, input: dict[str, Any]) -> None:
    report(b"start %d %.6f" % (input["i"], time.time()))


def counted(statement: Any) -> Any:
    """``statement`` reporting ``stmt`` each time it runs: the benchmark counts statements."""

    async def run(*args: Any, **kwargs: Any) -> Any:
        report(b"stmt")
        return await statement(*args, **kwargs)

    return run


async def main(url: str, concurrency: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    driver = postgres_job_driver(url, pool_max=max(4, os.cpu_count() or 2))
    claim = driver.claim

    async def counted_claim(**options: Any) -> Any:
        report(b"claim %.6f" % time.time())
        return await claim(**options)

    driver.claim = counted_claim  # type: ignore[method-assign]
    for method in ("fetch", "fetch_dicts"):
        setattr(driver.executor, method, counted(getattr(driver.executor, method)))
    wake = start_queue_wake(listener=url, executor=driver.executor)
    worker = job_worker(
        driver=driver, context=lambda: None, jobs=[bench_noop], concurrency=concurrency, wake=wake
    )
    try:
        await worker.run()
    finally:
        await wake.close()
        await driver.close()


if __name__ == "__main__":
    run_worker(main(sys.argv[1], int(sys.argv[2])))
