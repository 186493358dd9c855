"""Single enqueue, ours against the nearest peer, in alternating blocks within ONE process.

    VENV/bin/python bench/versus_single.py redis      # against SAQ
    VENV/bin/python bench/versus_single.py pg         # against PgQueuer

A single enqueue is one round trip, so its rate follows the machine's speed from one second to
the next; rounds of whole benchmarks a minute apart (``versus.py``) spread a ratio from 0.7× to
2× on a shared host. Here both libraries enqueue from the same event loop, one block of
``--block`` awaited enqueues each, the order swapped every block, and each block pair gives a
ratio taken within a second. The peer side is the peer harness's own adapter
(``../shared/bench/peers``, or ``--peers DIR``), the code its figures come from; ours is
``handle.enqueue()`` on the job the benchmarks use.

VENV must hold both: the peers' pinned libraries (``pip install -r
../shared/bench/peers/requirements.txt``) and this workspace (``pip install -e
packages/jobs-core -e packages/jobs-pg -e packages/jobs-redis``). The servers are those of the
benchmarks (``BENCH_PG_URL``, ``REDIS_URL``); each side writes only its own database or
namespace, emptied first.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from versus import DEFAULT_PEERS, PEER, server_environment

Enqueue = Callable[[int], Awaitable[object]]


async def ours_on_redis() -> tuple[Enqueue, Callable[[], Awaitable[None]]]:
    import redis_bench

    driver = await redis_bench.fresh_driver()

    async def enqueue(i: int) -> object:
        return await redis_bench.noop.enqueue(redis_bench.Noop(i, "versus"))

    return enqueue, driver.close


async def ours_on_pg() -> tuple[Enqueue, Callable[[], Awaitable[None]]]:
    import pg_bench
    import psycopg

    from ultimat3.jobs.core import set_job_driver
    from ultimat3.jobs.pg import postgres_job_driver

    with psycopg.connect(pg_bench.SERVER, autocommit=True) as conn:
        conn.execute(f"drop database if exists {pg_bench.DATABASE} with (force)")
        conn.execute(f"create database {pg_bench.DATABASE}")
    await pg_bench.install(pg_bench.URL)
    driver = postgres_job_driver(pg_bench.URL)
    set_job_driver(driver)

    async def enqueue(i: int) -> object:
        return await pg_bench.bench_noop.enqueue({"i": i})

    return enqueue, driver.close


async def peer_side(backend: str, peers: Path) -> tuple[Enqueue, Callable[[], Awaitable[None]]]:
    """The harness's adapter, set up as the harness sets it up: its database made afresh."""
    _, script, _, extra = PEER[backend]
    os.environ.update({**server_environment(), **extra})
    sys.path.insert(0, str(peers))
    workload = importlib.import_module("workload")
    adapter = importlib.import_module(script.removesuffix(".py")).Adapter()
    if adapter.backend == "postgres":
        workload.PgAdmin(adapter.database).recreate()
    else:
        workload.RedisAdmin(int(adapter.database)).recreate()
    await adapter.setup()

    async def close() -> None:
        await adapter.close()

    return adapter.enqueue_one, close


async def block(enqueue: Enqueue, start: int, size: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + size):
        await enqueue(i)
    return size / (time.perf_counter() - began)


async def compare(backend: str, peers: Path, blocks: int, size: int) -> None:
    peer_name = PEER[backend][0]
    theirs, close_theirs = await peer_side(backend, peers)
    ours, close_ours = await (ours_on_pg() if backend == "pg" else ours_on_redis())
    try:
        await block(theirs, -size, size)  # connections open, statements prepared, scripts loaded
        await block(ours, -size, size)
        our_rates, their_rates, ratios = [], [], []
        for n in range(blocks):
            start = n * size
            if n % 2:
                mine, peer = await block(ours, start, size), await block(theirs, start, size)
            else:
                peer, mine = await block(theirs, start, size), await block(ours, start, size)
            our_rates.append(mine)
            their_rates.append(peer)
            ratios.append(mine / peer)
            print(
                f"block {n + 1}: ours {mine:,.0f}/s, {peer_name} {peer:,.0f}/s ({mine / peer:.2f}x)"
            )
    finally:
        await close_theirs()
        await close_ours()
    print()
    print(f"| {backend}: single enqueue, {blocks} blocks of {size} | median | min | max |")
    print("|---|---|---|---|")

    def rate(value: float) -> str:
        return f"{value:,.0f}/s"

    def ratio(value: float) -> str:
        return f"{value:.2f}x"

    for label, values, shown in (
        ("ours", our_rates, rate),
        (peer_name, their_rates, rate),
        (f"ours / {peer_name}, per block pair", ratios, ratio),
    ):
        print(
            f"| {label} | {shown(statistics.median(values))} | {shown(min(values))} "
            f"| {shown(max(values))} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backend", choices=sorted(PEER))
    parser.add_argument("--peers", type=Path, default=DEFAULT_PEERS, help="the peer harness")
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--block", type=int, default=250, help="enqueues per block")
    args = parser.parse_args()
    asyncio.run(compare(args.backend, args.peers, args.blocks, args.block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
