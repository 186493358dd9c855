"""Instructions the Postgres worker process spends per drained job, counted by callgrind.

    .venv/bin/python bench/worker_instructions.py     # needs valgrind; about a minute

The drain rates of pg_bench.py move by a fifth from one run to the next on a shared machine, more
than most changes to the worker's own code. An instruction count does not: callgrind counts the
same total for the same code, whatever else the machine does (two runs agree within 1%). This runs
``bench/pg_worker.py`` under callgrind twice, draining ``SMALL`` and then ``LARGE`` prefilled
no-op jobs at concurrency 100, and prints the difference divided by the jobs between them: the
cost of one more job, start-up and shut-down cancelled out. Compare it before and after a change
to the worker, the core or the driver's client side; the server's share is not in it.

Environment: ``BENCH_PG_URL`` (the server, as for pg_bench.py; the database ``ujobs_instructions``
is created and dropped).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ultimat3.jobs.core import set_job_driver
from ultimat3.jobs.pg import install, postgres_job_driver

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pg_worker import bench_noop  # noqa: E402

SERVER = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "ujobs_instructions"
URL = make_conninfo("", **{**conninfo_to_dict(SERVER), "dbname": DATABASE})
SMALL, LARGE = 1_000, 5_000


async def fill(jobs: int) -> None:
    driver = postgres_job_driver(URL)
    set_job_driver(driver)
    requests = [bench_noop.request({"i": i}) for i in range(jobs)]
    for start in range(0, jobs, 1_000):
        await driver.enqueue_many(requests[start : start + 1_000])
    await driver.close()


def instructions_draining(jobs: int, out: Path) -> int:
    """Callgrind's total for one worker process that drains ``jobs`` prefilled rows."""
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"drop database if exists {DATABASE} with (force)")
        conn.execute(f"create database {DATABASE}")
    asyncio.run(install(URL))
    asyncio.run(fill(jobs))
    with psycopg.connect(URL, autocommit=True) as admin:
        admin.execute("vacuum analyze x_jobs")
        callgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        worker = subprocess.Popen(
            [*callgrind, sys.executable, str(HERE / "pg_worker.py"), URL, "100", ""],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        query = "select count(*) from x_jobs where state <> 'done'"
        while (row := admin.execute(query).fetchone()) is not None and row[0]:
            time.sleep(0.5)
        time.sleep(1.0)  # the last acks' answers, then an idle worker
        worker.send_signal(signal.SIGTERM)
        worker.wait(120)
    found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"callgrind wrote no total to {out}")
    return int(found[1])


def main() -> int:
    if shutil.which("valgrind") is None:
        print("valgrind is not installed; this count needs it", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="ujobs-instructions-"))
    try:
        small = instructions_draining(SMALL, folder / "small.out")
        large = instructions_draining(LARGE, folder / "large.out")
    finally:
        shutil.rmtree(folder)
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f"drop database if exists {DATABASE} with (force)")
    per_job = (large - small) / (LARGE - SMALL)
    print(f"worker process: {small:,} instructions draining {SMALL:,} jobs, {large:,} draining")
    print(f"{LARGE:,}: {per_job:,.0f} instructions per job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
