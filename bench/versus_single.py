"""Single enqueue, ours against the nearest peer, in alternating blocks within ONE process.

    VENV/bin/python bench/versus_single.py redis      # against SAQ
    VENV/bin/python bench/versus_single.py pg         # against PgQueuer

A single enqueue is one round trip, so its rate follows the machine's speed from one second to
the next; rounds of whole benchmarks a minute apart (``versus.py``) spread a ratio from 0.7× to
2× on a shared host. Here both libraries enqueue from the same event loop, one block of
``--block`` awaited enqueues each, beside the raw round trip of the same server (a one-column
INSERT committed alone, or redis-py's SET), the order rotated every block, and each block gives
ratios taken within a second. The peer side is the peer harness's own adapter
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
Side = tuple[Enqueue, Callable[[], Awaitable[None]]]
"""How one side enqueues job ``i``, and how it closes."""


async def ours_on_redis() -> Side:
    import redis_bench

    driver = await redis_bench.fresh_driver()

    async def enqueue(i: int) -> object:
        return await redis_bench.noop.enqueue(redis_bench.Noop(i, "versus"))

    return enqueue, driver.close


async def raw_on_redis() -> Side:
    """redis-py's own client, one SET a round trip: the floor under any single enqueue."""
    import redis.asyncio
    import redis_bench

    client = redis.asyncio.Redis.from_url(redis_bench.URL)

    async def enqueue(i: int) -> object:
        return await client.set(f"{redis_bench.PREFIX}:raw", i)

    return enqueue, client.aclose


async def ours_on_pg() -> Side:
    import pg_bench
    from pg_worker import bench_noop

    from ultimat3.jobs.core import set_job_driver
    from ultimat3.jobs.pg import install, postgres_job_driver

    pg_bench.fresh_database()
    await install(pg_bench.URL)
    driver = postgres_job_driver(pg_bench.URL)
    set_job_driver(driver)

    async def enqueue(i: int) -> object:
        return await bench_noop.enqueue({"i": i})

    return enqueue, driver.close


async def raw_on_pg() -> Side:
    """A one-column INSERT committed on its own, from an asyncio connection: the raw limit the
    single-enqueue target is set against (``pg_bench.py``'s, in the same loop)."""
    import pg_bench
    import psycopg

    conn = await psycopg.AsyncConnection.connect(pg_bench.URL, autocommit=True)
    await conn.execute(pg_bench.RAW_TABLE)

    async def enqueue(i: int) -> object:
        return await conn.execute(pg_bench.RAW_INSERT_ONE, pg_bench.RAW_ROW, prepare=True)

    return enqueue, conn.close


async def peer_side(backend: str, peers: Path) -> Side:
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
    sides = {
        "ours": await (ours_on_pg() if backend == "pg" else ours_on_redis()),
        peer_name: await peer_side(backend, peers),
        "raw": await (raw_on_pg() if backend == "pg" else raw_on_redis()),
    }
    names = list(sides)
    rates: dict[str, list[float]] = {name: [] for name in names}
    try:
        for name in names:  # connections open, statements prepared, scripts loaded
            await block(sides[name][0], -size, size)
        for n in range(blocks):
            for name in names[n % 3 :] + names[: n % 3]:
                rates[name].append(await block(sides[name][0], n * size, size))
            print(
                f"block {n + 1}: "
                + ", ".join(f"{name} {rates[name][-1]:,.0f}/s" for name in names)
                + f" ({rates['ours'][-1] / rates[peer_name][-1]:.2f}x)",
                flush=True,
            )
    finally:
        for _, close in sides.values():
            await close()

    def per_block(top: str, bottom: str) -> list[float]:
        return [a / b for a, b in zip(rates[top], rates[bottom], strict=True)]

    print()
    print(f"| {backend}: single enqueue, {blocks} blocks of {size} | median | min | max |")
    print("|---|---|---|---|")
    rows: list[tuple[str, list[float], str]] = [(name, rates[name], "/s") for name in names]
    rows += [
        (f"ours / {peer_name}, per block", per_block("ours", peer_name), "x"),
        ("ours / raw, per block", per_block("ours", "raw"), "x"),
        (f"{peer_name} / raw, per block", per_block(peer_name, "raw"), "x"),
    ]
    for label, values, unit in rows:
        cells = [statistics.median(values), min(values), max(values)]
        shown = [f"{v:.2f}x" if unit == "x" else f"{v:,.0f}/s" for v in cells]
        print(f"| {label} | " + " | ".join(shown) + " |")


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
