"""ultimat3-jobs measured by the peer harness itself, exactly as it measures PgQueuer and SAQ.

    UJOBS_BACKEND=pg .venv/bin/python bench/peer_ujobs.py        # -> ultimat3-jobs-pg.json
    UJOBS_BACKEND=redis .venv/bin/python bench/peer_ujobs.py     # -> ultimat3-jobs-redis.json

``pg_bench.py`` and ``redis_bench.py`` set our figures beside the raw limits of the server; this
file answers the other question, how we compare with a peer, with no difference of method left:
it is an adapter of the harness in ``../shared/bench/peers`` (``BENCH_PEERS`` names another
copy), whose ``workload.py`` runs the same single enqueue, batched enqueue, drain and pickup
phases, the same no-op body (``workload.job_started``), the same clock and the same result file
format as for every peer, so ``report.py`` there prints us in its tables. Run it with this
workspace's interpreter; the harness's ``PG*``/``REDIS_*``/``BENCH_*`` variables apply (the
servers default to its throwaway ports, 55432 and 56379: point them at yours). The worker
process the harness starts is ``job_worker`` on the driver, with the wake, on uvloop when it is
installed (as the harness runs PgQueuer's).

Databases: Postgres ``peer_ujobs`` (dropped and made again by the harness), Redis database 5
(flushed by it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("BENCH_PEERS", HERE.parent.parent / "shared" / "bench" / "peers"))
sys.path[:0] = [str(PEERS), str(HERE)]

import workload  # noqa: E402  (the harness's module, from PEERS)
from event_loop import run_worker  # noqa: E402

from ultimat3.jobs.core import job, job_worker, set_job_driver  # noqa: E402
from ultimat3.jobs.core.protocol import QueueWake  # noqa: E402

BACKEND = os.environ.get("UJOBS_BACKEND", "pg")
QUEUE = "peer"
PG_DATABASE = "peer_ujobs"
REDIS_DATABASE = 5


@job(input=dict, idempotency_key=lambda i: f"peer:{i['i']}", tenant="none", queue=QUEUE)
async def peer_noop(*, input: dict[str, Any]) -> None:
    workload.job_started(input["i"])


def _driver() -> Any:
    if BACKEND == "redis":
        from ultimat3.jobs.redis import redis_job_driver

        return redis_job_driver(url=workload.redis_url(REDIS_DATABASE))
    from ultimat3.jobs.pg import postgres_job_driver

    return postgres_job_driver(workload.pg_url(PG_DATABASE))


class Adapter:
    name = f"ultimat3-jobs-{BACKEND}"
    package = f"ultimat3-jobs-{BACKEND}"
    backend = "redis" if BACKEND == "redis" else "postgres"
    database = str(REDIS_DATABASE) if BACKEND == "redis" else PG_DATABASE
    concurrencies = ("10", "100")
    latency_worker = "10"
    batch_method = "driver.enqueue_many(): one COPY (pg) or one script call per 500 rows (redis)"
    short_notes = "batch claim and batched fenced settles (1 statement per batch each); wake"
    notes = (
        "LISTEN/NOTIFY wake (pg) or a pub/sub wake (redis) with the poll as the guarantee; "
        "claim = 1 statement (pg) or script (redis) per batch of up to half the free slots; "
        "acks coalesced into 1 statement per batch, each row fenced on its own claim."
    )
    if BACKEND != "redis":
        reset_sql = "TRUNCATE x_jobs, x_job_steps, x_job_counters, x_workers"
        # Unfinished = live: the live-key index holds exactly these rows, so the harness's poll
        # at the end of a drain reads that index, not every done row of the table.
        pending_sql = (
            "SELECT count(*) FROM x_jobs"
            " WHERE state IN ('ready', 'delayed', 'running', 'suspended')"
        )

    async def setup(self) -> None:
        if BACKEND != "redis":
            from ultimat3.jobs.pg import install

            await install(workload.pg_url(PG_DATABASE))
        self.driver = _driver()
        set_job_driver(self.driver)

    async def reset(self) -> None:
        await self.driver.clear()

    async def pending(self) -> int:
        return sum(s.depth + s.running for s in await self.driver.stats(include_done=False))

    async def enqueue_batch(self, idxs: list[int]) -> None:
        await self.driver.enqueue_many([peer_noop.request({"i": i}) for i in idxs])

    async def enqueue_one(self, i: int) -> None:
        await peer_noop.enqueue({"i": i})

    async def close(self) -> None:
        await self.driver.close()


if BACKEND != "redis":  # the harness's own SQL counts and resets the Postgres tables
    del Adapter.reset, Adapter.pending


def worker(label: str) -> None:
    async def main() -> None:
        driver = _driver()
        wake: QueueWake
        if BACKEND == "redis":
            from ultimat3.jobs.redis import start_queue_wake as redis_wake

            wake = redis_wake(driver)
        else:
            from ultimat3.jobs.pg import start_queue_wake as pg_wake

            wake = pg_wake(listener=workload.pg_url(PG_DATABASE), executor=driver.executor)
        running = job_worker(
            driver=driver,
            context=lambda: None,
            jobs=[peer_noop],
            queues=[QUEUE],
            concurrency=int(label),
            wake=wake,
        )
        try:
            await running.run()
        finally:
            await wake.close()
            await driver.close()

    run_worker(main())


if __name__ == "__main__":
    workload.main(Adapter, worker)
