"""The Redis driver against the raw limits of the same server, measured in one run.

    .venv/bin/python bench/redis_bench.py          # REDIS_URL, else redis://127.0.0.1:6379/0

Prints one table:

- raw limits of this server from redis-py: SET one round trip at a time, and 100 per pipeline;
- enqueue: one ``handle.enqueue()`` at a time, and ``driver.enqueue_many`` 1,000 rows a call;
- drain: 20,000 queued no-op jobs run by ONE worker process (``job_worker`` in a subprocess, at
  concurrency 10 and 100), from the first job's start until no row is unfinished;
- pickup: 50 single enqueues from this process into an idle worker process (woken by the
  blocking wake), enqueue call to the body's first line;
- Redis commands per job: the server's ``total_commands_processed`` over each phase, which counts
  the commands scripts run as well as the calls (as the peer harness counts).

When a peer result is found (``BENCH_PEER_RESULTS``, default ``/tmp/peer-results-redis``, the
``results`` folder of the peer harness), the table adds its figures and the ratios: how many
times better ours is (a rate divided by theirs; a time or a command count, theirs divided by
ours). Every figure is a median over ``BENCH_REPS`` runs (default 3) unless it says otherwise.
The server is shared with whatever else runs on it, and the client, the worker and the server
share this machine's cores: compare ratios, not absolutes. The namespace ``ujobs-bench`` is
emptied before each phase.

Knobs: ``BENCH_N`` (20000), ``BENCH_N_SINGLE`` (2000), ``BENCH_REPS`` (3), ``BENCH_LAT_TRIALS``
(50), ``BENCH_CONCURRENCY`` ("10,100"), ``BENCH_LIMIT_SECONDS`` (2), ``BENCH_ONLY`` (the phases
to run, a comma list of limits, single, batch, drain, pickup), ``BENCH_JSON`` (a file to write
the medians to, as JSON).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from ultimat3.jobs.core import job, job_worker, set_job_driver
from ultimat3.jobs.redis import RedisJobDriver, redis_job_driver, start_queue_wake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from event_loop import run_worker

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = "ujobs-bench"
QUEUE = "bench"
N = int(os.environ.get("BENCH_N", "20000"))
N_SINGLE = int(os.environ.get("BENCH_N_SINGLE", "2000"))
REPS = int(os.environ.get("BENCH_REPS", "3"))
LAT_TRIALS = int(os.environ.get("BENCH_LAT_TRIALS", "50"))
CONCURRENCIES = [int(c) for c in os.environ.get("BENCH_CONCURRENCY", "10,100").split(",")]
LIMIT_SECONDS = float(os.environ.get("BENCH_LIMIT_SECONDS", "2"))
PEER_RESULTS = Path(os.environ.get("BENCH_PEER_RESULTS", "/tmp/peer-results-redis"))
ONLY = set(os.environ.get("BENCH_ONLY", "limits,single,batch,drain,pickup").split(","))
FIGURES = os.environ.get("BENCH_JSON")
SIGNAL_ENV = "UJOBS_BENCH_SIGNAL"
DRAIN_CAP_S = 60.0


# -- the job: its whole body tells the harness it started -------------------------------------


def Noop(i: int, tag: str = "") -> dict[str, Any]:  # noqa: N802 - reads as the input it builds
    """The no-op job's input: a plain JSON object, the lightest input a job declares (the peers
    pass keyword arguments)."""
    return {"i": i, "tag": tag}


_signal_socket: socket.socket | None = None


def _started(i: int) -> None:
    global _signal_socket
    if _signal_socket is None:
        _signal_socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        _signal_socket.connect(os.environ[SIGNAL_ENV])
    _signal_socket.send(f"{i} {time.monotonic()}".encode())


@job(input=dict, idempotency_key=lambda n: f"noop:{n['tag']}:{n['i']}", tenant="none", queue=QUEUE)
async def noop(*, input: dict[str, Any]) -> None:
    _started(input["i"])


class Starts:
    """Receives "job i started at t" datagrams from the worker process (CLOCK_MONOTONIC is one
    clock for every process of the machine)."""

    def __init__(self) -> None:
        self.path = os.path.join(tempfile.mkdtemp(prefix="ujobs-bench-"), "starts.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(self.path)
        self.times: dict[int, float] = {}
        self.changed = threading.Condition()
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self) -> None:
        while True:
            raw = self.sock.recv(256)
            i, at = raw.decode().split()
            with self.changed:
                self.times.setdefault(int(i), float(at))
                self.changed.notify_all()

    def reset(self) -> None:
        with self.changed:
            self.times.clear()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout)

    def wait_for_start(self, i: int, timeout: float) -> bool:
        """Whether job ``i`` started within ``timeout`` seconds."""
        return self.wait_for(lambda: i in self.times, timeout)


# -- measuring ---------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def raw_set_rate(pipeline: int) -> float:
    client = redis.Redis.from_url(URL)
    done, end = 0, time.perf_counter() + LIMIT_SECONDS
    while time.perf_counter() < end:
        if pipeline <= 1:
            client.set(f"{PREFIX}-raw:{done % 1000}", "v")
            done += 1
        else:
            pipe = client.pipeline(transaction=False)
            for k in range(pipeline):
                pipe.set(f"{PREFIX}-raw:{k}", "v")
            pipe.execute()
            done += pipeline
    client.delete(*[f"{PREFIX}-raw:{k}" for k in range(1000)])
    client.close()
    return done / LIMIT_SECONDS


class ServerCounters:
    """The server's ``total_commands_processed``: every command, the ones scripts run included
    (as the peer harness counts). Anything else using the server meanwhile is counted too."""

    def __init__(self) -> None:
        self.client = redis.Redis.from_url(URL)

    def read(self) -> int:
        return int(self.client.info("stats")["total_commands_processed"])


@dataclass
class Figures:
    raw_single: list[float]
    raw_pipelined: list[float]
    enqueue_single: list[float]
    enqueue_driver_single: list[float]
    enqueue_batch: list[float]
    drain: dict[int, list[float]]
    pickup_ms: list[float]
    enqueue_commands: float = 0.0
    drain_commands: dict[int, list[float]] = field(default_factory=dict)


async def fresh_driver() -> RedisJobDriver:
    driver = redis_job_driver(url=URL, prefix=PREFIX)
    await driver.clear()
    set_job_driver(driver)
    return driver


async def enqueue_single(tag: str) -> float:
    driver = await fresh_driver()
    await noop.enqueue(Noop(-1, tag))
    started = time.perf_counter()
    for i in range(N_SINGLE):
        await noop.enqueue(Noop(i, tag))
    rate = N_SINGLE / (time.perf_counter() - started)
    await driver.close()
    return rate


async def enqueue_driver_single(tag: str) -> float:
    driver = await fresh_driver()
    requests = [noop.request(Noop(i, tag)) for i in range(N_SINGLE)]
    await driver.enqueue(noop.request(Noop(-1, tag)))
    started = time.perf_counter()
    for request in requests:
        await driver.enqueue(request)
    rate = N_SINGLE / (time.perf_counter() - started)
    await driver.close()
    return rate


async def enqueue_batch(driver: RedisJobDriver, tag: str) -> float:
    requests = [noop.request(Noop(i, tag)) for i in range(N)]
    started = time.perf_counter()
    for start in range(0, N, 1000):
        await driver.enqueue_many(requests[start : start + 1000])
    return N / (time.perf_counter() - started)


def start_worker(starts: Starts, concurrency: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, SIGNAL_ENV: starts.path, "REDIS_URL": URL}
    return subprocess.Popen(
        [sys.executable, __file__, "worker", str(concurrency)],
        env=env,
        stdout=subprocess.DEVNULL,
    )


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def unfinished(driver: RedisJobDriver) -> int:
    stats = {s.queue: s for s in await driver.stats()}
    row = stats.get(QUEUE)
    return 0 if row is None else row.ready + row.delayed + row.running + row.suspended


async def drain(starts: Starts, concurrency: int, tag: str) -> tuple[float, float]:
    """(jobs/s, Redis commands per job) for one drain of N jobs."""
    driver = await fresh_driver()
    counters = ServerCounters()
    await enqueue_batch(driver, tag)
    starts.reset()
    before = counters.read()
    process = start_worker(starts, concurrency)
    try:
        if not starts.wait_for(lambda: len(starts.times) >= N, DRAIN_CAP_S):
            raise RuntimeError(f"the worker started {len(starts.times)} of {N} jobs")
        while await unfinished(driver):
            await asyncio.sleep(0.002)
        ended = time.monotonic()
        after = counters.read()
        first = min(starts.times.values())
    finally:
        stop_worker(process)
        await driver.close()
    return N / (ended - first), (after - before) / N


async def pickup(starts: Starts, tag: str) -> list[float]:
    driver = await fresh_driver()
    starts.reset()
    process = start_worker(starts, 10)
    latencies: list[float] = []
    try:
        await noop.enqueue(Noop(-1, tag))
        if not starts.wait_for_start(-1, 30):
            raise RuntimeError("the worker never ran the warm-up job")
        await asyncio.sleep(1.0)  # the wake proves itself live
        for i in range(LAT_TRIALS):
            await asyncio.sleep(random.uniform(0.1, 0.3))
            sent = time.monotonic()
            await noop.enqueue(Noop(i, tag))
            if not starts.wait_for_start(i, 10):
                raise RuntimeError(f"trial {i} never started")
            latencies.append((starts.times[i] - sent) * 1000)
    finally:
        stop_worker(process)
        await driver.close()
    return latencies


async def enqueue_commands(tag: str) -> float:
    driver = await fresh_driver()
    counters = ServerCounters()
    before = counters.read()
    for i in range(500):
        await noop.enqueue(Noop(i, tag))
    after = counters.read()
    await driver.close()
    return (after - before) / 500


async def measure() -> Figures:
    starts = Starts()
    figures = Figures([], [], [], [], [], {c: [] for c in CONCURRENCIES}, [])
    for rep in range(REPS):
        tag = f"r{rep}-{random.randrange(1 << 30)}"
        if "limits" in ONLY:
            figures.raw_single.append(raw_set_rate(1))
            figures.raw_pipelined.append(raw_set_rate(100))
        if "single" in ONLY:
            figures.enqueue_single.append(await enqueue_single(tag + "s"))
            figures.enqueue_driver_single.append(await enqueue_driver_single(tag + "d"))
        if "batch" in ONLY:
            driver = await fresh_driver()
            figures.enqueue_batch.append(await enqueue_batch(driver, tag + "b"))
            await driver.close()
        for concurrency in CONCURRENCIES if "drain" in ONLY else ():
            rate, commands = await drain(starts, concurrency, f"{tag}c{concurrency}")
            figures.drain[concurrency].append(rate)
            figures.drain_commands.setdefault(concurrency, []).append(commands)
    if "pickup" in ONLY:
        figures.pickup_ms = await pickup(starts, "pickup")
    if "single" in ONLY:
        figures.enqueue_commands = await enqueue_commands("commands")
    driver = await fresh_driver()
    await driver.close()
    return figures


# -- reporting ---------------------------------------------------------------------------------


def peer(name: str) -> dict[str, Any] | None:
    path = PEER_RESULTS / f"{name}.json"
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def peer_figure(result: dict[str, Any] | None, *path: str) -> float | None:
    node: Any = result
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, int | float) else None


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def write_figures(figures: Figures, path: str) -> None:
    """The medians of this run as JSON, written to ``path`` (``BENCH_JSON``): bench/versus.py
    reads them."""
    out: dict[str, Any] = {}
    if figures.raw_single:
        out["limits"] = {
            "single": median(figures.raw_single),
            "pipelined": median(figures.raw_pipelined),
        }
    if figures.enqueue_single:
        out["enqueue_single"] = {
            "rate": median(figures.enqueue_single),
            "driver_rate": median(figures.enqueue_driver_single),
            "commands_per_job": figures.enqueue_commands,
        }
    if figures.enqueue_batch:
        out["enqueue_batch"] = {"rate": median(figures.enqueue_batch)}
    if figures.drain_commands:
        out["drain"] = {str(c): median(rates) for c, rates in figures.drain.items()}
        out["drain_commands_per_job"] = {
            str(c): median(counts) for c, counts in figures.drain_commands.items()
        }
    if figures.pickup_ms:
        out["pickup_ms"] = {"median": median(figures.pickup_ms), "max": max(figures.pickup_ms)}
    Path(path).write_text(json.dumps(out, indent=2) + "\n")


def report(figures: Figures) -> None:
    saq = peer("saq-redis")
    best_drain = max(median(v) for v in figures.drain.values())
    rows: list[tuple[str, float, str, float | None, str]] = [
        ("raw redis-py SET, one per round trip", median(figures.raw_single), "ops/s", None, ""),
        ("raw redis-py SET, 100 per pipeline", median(figures.raw_pipelined), "ops/s", None, ""),
        (
            "enqueue, one handle.enqueue() at a time",
            median(figures.enqueue_single),
            "jobs/s",
            peer_figure(saq, "enqueue_single", "rate", "median"),
            ">= 1.5x",
        ),
        (
            "enqueue, one driver.enqueue() at a time",
            median(figures.enqueue_driver_single),
            "jobs/s",
            None,
            "",
        ),
        (
            "enqueue, driver.enqueue_many 1,000 a call",
            median(figures.enqueue_batch),
            "jobs/s",
            peer_figure(saq, "enqueue_batch", "rate", "median"),
            "",
        ),
    ]
    for concurrency, rates in figures.drain.items():
        rows.append(
            (
                f"drain {N:,} no-op jobs, 1 worker process, concurrency {concurrency}",
                median(rates),
                "jobs/s",
                peer_figure(saq, "drain", str(concurrency), "rate", "median"),
                ">= 5x (goal 10x)" if median(rates) == best_drain else "",
            )
        )
    rows += [
        (
            f"pickup, median of {len(figures.pickup_ms)} (another process)",
            median(figures.pickup_ms),
            "ms",
            ms(peer_figure(saq, "latency", "p50_s", "median")),
            "<= 3 ms",
        ),
        (
            "pickup, max",
            max(figures.pickup_ms, default=math.nan),
            "ms",
            ms(peer_figure(saq, "latency", "max_s", "max")),
            "",
        ),
        (
            "Redis commands per enqueue (server INFO)",
            figures.enqueue_commands,
            "cmds",
            peer_figure(saq, "enqueue_single", "counters", "redis_cmds_per_job"),
            "",
        ),
    ]
    for concurrency, commands in figures.drain_commands.items():
        rows.append(
            (
                f"Redis commands per job, drain at concurrency {concurrency}",
                median(commands),
                "cmds",
                peer_figure(saq, "drain", str(concurrency), "counters", "redis_cmds_per_job"),
                "",
            )
        )
    rows = [row for row in rows if not math.isnan(row[1])]  # the phases BENCH_ONLY left out
    width = max(len(r[0]) for r in rows)
    print(f"\nRedis driver, {URL}, median of {REPS} runs; preliminary (shared machine and server)")
    print(f"{'measurement':<{width}}  {'ours':>12}  {'unit':<6}  {'SAQ':>10}  {'ratio':>7}  target")
    for name, ours, unit, theirs, target in rows:
        ratio = ""  # how many times better ours is: a rate divided, a time or a cost inverted
        if theirs:
            ratio = f"{theirs / ours:.2f}x" if unit in ("ms", "cmds") else f"{ours / theirs:.2f}x"
        theirs_text = "" if theirs is None else f"{theirs:,.1f}"
        print(
            f"{name:<{width}}  {ours:>12,.1f}  {unit:<6}  {theirs_text:>10}  {ratio:>7}  {target}"
        )
    if saq is None:
        print(f"(no SAQ result in {PEER_RESULTS}: run the peer harness to fill the ratios)")


# -- the worker process ------------------------------------------------------------------------


def worker_process(concurrency: int) -> None:
    async def main() -> None:
        driver = redis_job_driver(url=URL, prefix=PREFIX)
        wake = start_queue_wake(driver)
        worker = job_worker(
            driver=driver,
            context=lambda: None,
            jobs=[noop],
            queues=[QUEUE],
            concurrency=concurrency,
            wake=wake,
        )
        try:
            await worker.run()
        finally:
            await wake.close()
            await driver.close()

    run_worker(main())


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_process(int(sys.argv[2]))
    else:
        measured = asyncio.run(measure())
        if FIGURES:
            write_figures(measured, FIGURES)
        report(measured)
