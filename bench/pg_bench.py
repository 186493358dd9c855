"""Postgres: the driver beside the server's raw limits, measured in one run against one server.

    .venv/bin/python bench/pg_bench.py          # or: python3 dev.py bench pg

Prints one table: the raw limits from Python (single-row commits, a batched INSERT, a bare
``SKIP LOCKED`` claim-100 + update-to-done cycle), then this driver's single and batched enqueue
(each in blocks alternating with the raw insert and with a bare INSERT of the same rows into
x_jobs, the table's own floor; the single one also with the raw insert from an asyncio
connection, which is what the driver's client pays before any statement of its own), the
end-to-end drain of N no-op jobs by ONE worker process (``bench/pg_worker.py``), pickup latency
from another process with the wake, idle claims per minute, and per job the statements (counted
by the client), write transactions (xids) and WAL bytes (``pg_current_wal_lsn``).

The workload is the peer harness's (``BENCH_*`` knobs, same defaults), so its results for other
libraries can be set beside these: point ``BENCH_PEER_RESULTS`` at the directory holding its
``pgqueuer.json`` and the table gains a "vs PgQueuer" column.

Environment: ``BENCH_PG_URL`` (the server, default ``postgresql://postgres@127.0.0.1:5432/postgres``;
the benchmark creates and drops its own database ``ujobs_bench``), ``BENCH_N`` (20000),
``BENCH_BATCH`` (1000), ``BENCH_N_SINGLE`` (2000), ``BENCH_REPS`` (3), ``BENCH_LAT_TRIALS`` (50),
``BENCH_LIMIT_SECONDS`` (4), ``BENCH_CLAIM_PREFILL`` (200000), ``BENCH_CONCURRENCY`` (100),
``BENCH_LAT_CONCURRENCY`` (10), ``BENCH_IDLE_SECONDS`` (60), ``BENCH_ONLY`` (the phases to run, a
comma list of limits, single, batch, drain, latency), ``BENCH_JSON`` (a file to write the
medians to, as JSON).

Every measurement starts from emptied tables and a CHECKPOINT (``reset``), so no checkpoint that
an earlier phase's WAL set off is writing under it.

Figures from a shared machine are noisy: compare ratios taken in one run, never absolute numbers
across runs.
"""

from __future__ import annotations

import asyncio
import json
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ultimat3.jobs.core import set_job_driver
from ultimat3.jobs.core.ids import new_id
from ultimat3.jobs.pg import install, postgres_job_driver
from ultimat3.jobs.pg.executor import PgExecutor

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pg_worker import bench_noop  # noqa: E402

SERVER = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "ujobs_bench"
N = int(os.environ.get("BENCH_N", 20_000))
BATCH = int(os.environ.get("BENCH_BATCH", 1_000))
N_SINGLE = int(os.environ.get("BENCH_N_SINGLE", 2_000))
REPS = int(os.environ.get("BENCH_REPS", 3))
LAT_TRIALS = int(os.environ.get("BENCH_LAT_TRIALS", 50))
LIMIT_S = float(os.environ.get("BENCH_LIMIT_SECONDS", 4))
PREFILL = int(os.environ.get("BENCH_CLAIM_PREFILL", 200_000))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", 100))
LAT_CONCURRENCY = int(os.environ.get("BENCH_LAT_CONCURRENCY", 10))
IDLE_S = float(os.environ.get("BENCH_IDLE_SECONDS", 60))
ONLY = set(os.environ.get("BENCH_ONLY", "limits,single,batch,drain,latency").split(","))
PEERS = os.environ.get("BENCH_PEER_RESULTS")
FIGURES = os.environ.get("BENCH_JSON")

URL = make_conninfo("", **{**conninfo_to_dict(SERVER), "dbname": DATABASE})


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- what the worker process reports ------------------------------------------------------------


class Signals:
    """Datagrams from the worker process: ``start <i> <t>`` per job, ``claim <t>`` per claim,
    ``stmt`` per statement."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="ujobs-bench-")
        self.path = os.path.join(self.dir, "signal.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.cond = threading.Condition()
        self.reset()
        threading.Thread(target=self._receive, daemon=True).start()

    def reset(self) -> None:
        with self.cond:
            self.started: dict[int, float] = {}
            self.claims: list[float] = []
            self.statements = 0
            self.duplicates = 0

    def _receive(self) -> None:
        while True:
            try:
                data = self.sock.recv(128)
            except OSError:
                return
            kind, *rest = data.split()
            with self.cond:
                if kind == b"stmt":
                    self.statements += 1
                elif kind == b"claim":
                    self.claims.append(float(rest[0]))
                else:
                    job, at = int(rest[0]), float(rest[1])
                    if job in self.started:
                        self.duplicates += 1
                    else:
                        self.started[job] = at
                self.cond.notify_all()

    def wait_started(self, count: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.started) >= count, timeout)

    def wait_for(self, job: int, timeout: float) -> float | None:
        with self.cond:
            self.cond.wait_for(lambda: job in self.started, timeout)
            return self.started.get(job)

    def first_start(self) -> float:
        with self.cond:
            return min(self.started.values())

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


class Worker:
    """ONE worker process (bench/pg_worker.py)."""

    def __init__(self, concurrency: int, signals: Signals) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "pg_worker.py"), URL, str(concurrency), signals.path],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# -- server-side counters -----------------------------------------------------------------------


@dataclass
class Cost:
    """Per job: statements the client sent, write transactions (xids) and WAL bytes."""

    statements: float = 0.0
    write_xacts: float = 0.0
    wal_bytes: float = 0.0

    def cell(self) -> str:
        return (
            f"{self.statements:.3f} stmts, {self.write_xacts:.3f} write-xacts, "
            f"{self.wal_bytes:,.0f} B WAL"
        )


def server_mark(conn: psycopg.Connection[Any]) -> tuple[int, str]:
    row = conn.execute(
        "select pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_current_wal_lsn()::text"
    ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def cost_between(
    conn: psycopg.Connection[Any], a: tuple[int, str], b: tuple[int, str], stmts: int, jobs: int
) -> Cost:
    row = conn.execute("select pg_wal_lsn_diff(%s, %s)", (b[1], a[1])).fetchone()
    assert row is not None
    return Cost(stmts / jobs, (b[0] - a[0]) / jobs, float(row[0]) / jobs)


class StatementCounter:
    """Counts the statements an executor sends: a fetch is one (its own transaction), a COPY one
    more with the statement run first in its transaction."""

    def __init__(self, executor: PgExecutor) -> None:
        self.count = 0
        for method in ("fetch", "fetch_dicts", "copy"):
            original = getattr(executor, method)
            setattr(executor, method, self._counting(original))

    def _counting(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 2 if kwargs.get("first") else 1
            return await original(*args, **kwargs)

        return counted


# -- the raw limits -----------------------------------------------------------------------------


def raw_limits(conn: psycopg.Connection[Any]) -> dict[str, float]:
    conn.execute("drop table if exists raw_insert, raw_jobs")
    conn.execute("create table raw_insert (id bigserial primary key, payload jsonb not null)")
    conn.execute(
        "create table raw_jobs (id bigserial primary key, status smallint not null default 0, "
        "payload jsonb not null, claimed_at timestamptz)"
    )
    conn.execute("create index raw_jobs_todo on raw_jobs (id) where status = 0")
    results: dict[str, float] = {}

    singles = []
    for _ in range(REPS):
        conn.execute("truncate raw_insert")
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < LIMIT_S:
            conn.execute(RAW_INSERT_ONE, RAW_ROW, prepare=True)
            count += 1
        singles.append(count / (time.perf_counter() - began))
    results["single"] = statistics.median(singles)
    log(f"raw single-row commits: {results['single']:,.0f}/s")

    rows = [json.dumps({"i": k}) for k in range(1000)]
    batched = []
    for _ in range(REPS):
        conn.execute("truncate raw_insert")
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < LIMIT_S:
            conn.execute(
                "insert into raw_insert (payload) select unnest(%s::jsonb[])", (rows,), prepare=True
            )
            count += 1000
        batched.append(count / (time.perf_counter() - began))
    results["batch"] = statistics.median(batched)
    log(f"raw batched insert: {results['batch']:,.0f} rows/s")

    cycles = []
    claim = (
        "with c as (select id from raw_jobs where status = 0 order by id limit 100 "
        "for update skip locked) "
        "update raw_jobs j set status = 1, claimed_at = now() from c where j.id = c.id "
        "returning j.id"
    )
    for _ in range(REPS):
        conn.execute("truncate raw_jobs")
        conn.execute(
            "insert into raw_jobs (payload) select jsonb_build_object('i', g) "
            "from generate_series(1, %s) g",
            (PREFILL,),
        )
        conn.execute("vacuum analyze raw_jobs")
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < LIMIT_S:
            ids = [row[0] for row in conn.execute(claim, prepare=True).fetchall()]
            if not ids:
                break
            conn.execute("update raw_jobs set status = 2 where id = any(%s)", (ids,), prepare=True)
            count += len(ids)
        cycles.append(count / (time.perf_counter() - began))
    results["claim"] = statistics.median(cycles)
    log(f"raw claim-100 + done cycle: {results['claim']:,.0f} rows/s")
    conn.execute("drop table raw_insert, raw_jobs")
    return results


# -- this driver --------------------------------------------------------------------------------


@dataclass
class Measured:
    rates: list[float] = field(default_factory=list)
    cost: Cost = field(default_factory=Cost)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    def spread(self) -> str:
        return f"[{min(self.rates):,.0f}–{max(self.rates):,.0f}]"


@dataclass
class Interleaved:
    """Our rate, the raw limit's and a bare insert of the same rows into x_jobs (``BARE_INSERT``),
    measured in alternating blocks so all three see the same load."""

    ours: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    bare: list[float] = field(default_factory=list)
    async_raw: list[float] = field(default_factory=list)
    """Single enqueue only: the raw commits again, from an asyncio connection like the driver's."""
    building_us: float = 0.0
    cost: Cost = field(default_factory=Cost)

    @property
    def ratio(self) -> float:
        return statistics.median(self.ours) / statistics.median(self.raw)

    @property
    def bare_ratio(self) -> float:
        return statistics.median(self.bare) / statistics.median(self.raw)

    @property
    def async_ratio(self) -> float:
        return statistics.median(self.ours) / statistics.median(self.async_raw)


BARE_INSERT = """
insert into x_jobs (id, run_id, name, queue, state, attempt, max_attempts, run_at, created_at,
                    updated_at, idempotency_key, input)
select id, id, %(name)s, %(queue)s, 'ready', 0, 3, now(), now(), now(), id, input::json
from unnest(%(ids)s::text[], %(inputs)s::text[]) as r (id, input)
on conflict do nothing
"""
"""The table's own cost of what an enqueue inserts: the same rows, with the same conflict check
on the primary key and the live-key index, and none of the statement's other work (the answer
for a dedupe, the wake). The floor under our enqueue on this server."""


RAW_TABLE = "create table if not exists raw_insert (id bigserial primary key, payload jsonb)"
RAW_INSERT_ONE = "insert into raw_insert (payload) values (%s::jsonb)"
RAW_ROW = ('{"i": 1}',)
"""The raw limit's single-row commit: one jsonb column, its parameters."""


def fresh_database() -> tuple[Any, ...] | None:
    """Drop and create the benchmark's database; answers the server's version."""
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"drop database if exists {DATABASE} with (force)")
        conn.execute(f"create database {DATABASE}")
        return conn.execute("show server_version").fetchone()


def raw_single_block(conn: psycopg.Connection[Any], count: int) -> float:
    began = time.perf_counter()
    for _ in range(count):
        conn.execute(RAW_INSERT_ONE, RAW_ROW, prepare=True)
    return time.perf_counter() - began


async def raw_single_block_async(conn: psycopg.AsyncConnection[Any], count: int) -> float:
    """``raw_single_block`` on an asyncio connection: what the event loop adds to a round trip."""
    began = time.perf_counter()
    for _ in range(count):
        await conn.execute(RAW_INSERT_ONE, RAW_ROW, prepare=True)
    return time.perf_counter() - began


def raw_batch_block(conn: psycopg.Connection[Any], payloads: list[str]) -> float:
    began = time.perf_counter()
    conn.execute(
        "insert into raw_insert (payload) select unnest(%s::jsonb[])", (payloads,), prepare=True
    )
    return time.perf_counter() - began


def bare_block(conn: psycopg.Connection[Any], statements: int, rows: int) -> float:
    """``statements`` commits of BARE_INSERT, ``rows`` job rows each (built before the clock
    starts)."""
    batches = [
        {
            "name": bench_noop.name,
            "queue": bench_noop.queue,
            "ids": [new_id() for _ in range(rows)],
            "inputs": ['{"i":0}'] * rows,
        }
        for _ in range(statements)
    ]
    began = time.perf_counter()
    for params in batches:
        conn.execute(BARE_INSERT, params, prepare=True)
    return time.perf_counter() - began


async def enqueue_single(admin: psycopg.Connection[Any]) -> Interleaved:
    """One ``handle.enqueue()`` per job, against single-row INSERT commits from one client (and
    the same commits from an asyncio connection)."""
    measured, block = Interleaved(), 100
    admin.execute(RAW_TABLE)
    async_raw = await psycopg.AsyncConnection.connect(URL, autocommit=True)
    with (
        psycopg.connect(URL, autocommit=True) as raw,
        psycopg.connect(URL, autocommit=True) as bare,
    ):
        for _ in range(REPS):
            reset(admin)
            driver = postgres_job_driver(URL)
            counter = StatementCounter(driver.executor)
            set_job_driver(driver)
            await bench_noop.enqueue({"i": -1})  # the pool is open before the clock starts
            counter.count, ours_s, raw_s, bare_s, xacts, wal = 0, 0.0, 0.0, 0.0, 0, 0.0
            async_s = 0.0
            for start in range(0, N_SINGLE, block):
                raw_s += raw_single_block(raw, block)
                async_s += await raw_single_block_async(async_raw, block)
                bare_s += bare_block(bare, block, 1)
                mark = server_mark(admin)
                began = time.perf_counter()
                for i in range(start, start + block):
                    await bench_noop.enqueue({"i": i})
                ours_s += time.perf_counter() - began
                part = cost_between(admin, mark, server_mark(admin), 0, 1)
                xacts, wal = xacts + int(part.write_xacts), wal + part.wal_bytes
            measured.ours.append(N_SINGLE / ours_s)
            measured.raw.append(N_SINGLE / raw_s)
            measured.async_raw.append(N_SINGLE / async_s)
            measured.bare.append(N_SINGLE / bare_s)
            measured.cost = Cost(counter.count / N_SINGLE, xacts / N_SINGLE, wal / N_SINGLE)
            await driver.close()
    await async_raw.close()
    log(
        f"single enqueue: {statistics.median(measured.ours):,.0f}/s, "
        f"{measured.ratio:.0%} of the raw commit rate beside it "
        f"({measured.async_ratio:.0%} of the raw commits from asyncio), a bare insert into x_jobs "
        f"{measured.bare_ratio:.0%} ({measured.cost.cell()})"
    )
    return measured


async def enqueue_batched(admin: psycopg.Connection[Any]) -> Interleaved:
    """``enqueue_many`` of BATCH rows built by ``JobHandle.request``, against a raw
    ``INSERT .. unnest`` of as many rows."""
    measured = Interleaved()
    payloads = [json.dumps({"i": k}) for k in range(BATCH)]
    admin.execute(RAW_TABLE)
    building = 0.0
    with (
        psycopg.connect(URL, autocommit=True) as raw,
        psycopg.connect(URL, autocommit=True) as bare,
    ):
        for _ in range(REPS):
            reset(admin)
            driver = postgres_job_driver(URL)
            counter = StatementCounter(driver.executor)
            await driver.stats()
            counter.count, ours_s, raw_s, bare_s, xacts, wal = 0, 0.0, 0.0, 0.0, 0, 0.0
            for start in range(0, N, BATCH):
                raw_s += raw_batch_block(raw, payloads)
                bare_s += bare_block(bare, 1, BATCH)
                mark = server_mark(admin)
                began = time.perf_counter()
                requests = [
                    bench_noop.request({"i": i}, clock=driver.clock)
                    for i in range(start, start + BATCH)
                ]
                built = time.perf_counter()
                await driver.enqueue_many(requests)
                ours_s += time.perf_counter() - began
                building += built - began
                part = cost_between(admin, mark, server_mark(admin), 0, 1)
                xacts, wal = xacts + int(part.write_xacts), wal + part.wal_bytes
            measured.ours.append(N / ours_s)
            measured.raw.append(N / raw_s)
            measured.bare.append(N / bare_s)
            measured.cost = Cost(counter.count / N, xacts / N, wal / N)
            await driver.close()
    measured.building_us = building / (N * REPS) * 1e6
    log(
        f"batched enqueue: {statistics.median(measured.ours):,.0f}/s "
        f"({measured.building_us:.1f} us/job building requests), "
        f"{measured.ratio:.0%} of the raw unnest INSERT beside it, a bare insert into x_jobs "
        f"{statistics.median(measured.bare):,.0f}/s ({measured.cost.cell()})"
    )
    return measured


async def fill(count: int) -> None:
    driver = postgres_job_driver(URL)
    for start in range(0, count, BATCH):
        await driver.enqueue_many(
            [
                bench_noop.request({"i": i}, clock=driver.clock)
                for i in range(start, min(start + BATCH, count))
            ]
        )
    await driver.close()


def reset(admin: psycopg.Connection[Any]) -> None:
    """Empty the tables a run fills, as the peer harness does between repetitions, and write the
    dirty buffers out before the next measurement starts (``checkpoint``)."""
    admin.execute("truncate x_jobs, x_job_steps, x_job_counters, x_workers")
    checkpoint(admin)


def checkpoint(admin: psycopg.Connection[Any]) -> None:
    """A checkpoint now, so none is running under a measurement. The raw claim cycle alone writes
    about 500 MB of WAL; the checkpoint this sets off spreads its writes over the next minutes,
    and a drain measured inside it ran at little more than half its rate. Taken before the
    tables are filled, never between filling and measuring: the first change to a page after a
    checkpoint logs the whole page, which put a quarter more WAL on every drained job. Skipped,
    with a note, for a role that may not run CHECKPOINT."""
    try:
        admin.execute("checkpoint")
    except psycopg.errors.InsufficientPrivilege:
        log("no checkpoint before the measurement (the role may not run CHECKPOINT)")


def pending(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("select count(*) from x_jobs where state <> 'done'").fetchone()
    assert row is not None
    return int(row[0])


async def drain(admin: psycopg.Connection[Any], signals: Signals) -> Measured:
    """N queued no-op jobs, ONE worker process: from the first job's start until no row is left
    unfinished (the last ack included, the worker's start-up not)."""
    measured = Measured()
    for rep in range(REPS):
        reset(admin)
        await fill(N)
        signals.reset()
        mark = server_mark(admin)
        worker = Worker(CONCURRENCY, signals)
        if not signals.wait_started(N, 120):
            worker.stop()
            raise RuntimeError(f"the drain stalled at {len(signals.started)}/{N} jobs")
        while pending(admin):
            await asyncio.sleep(0.01)
        done = time.time()
        measured.rates.append(N / (done - signals.first_start()))
        worker.stop()
        with signals.cond:
            statements = signals.statements
        measured.cost = cost_between(admin, mark, server_mark(admin), statements, N)
        log(f"drain rep {rep + 1}: {measured.rates[-1]:,.0f} jobs/s ({measured.cost.cell()})")
    return measured


async def latency_and_idle(
    admin: psycopg.Connection[Any], signals: Signals
) -> tuple[list[float], float]:
    reset(admin)
    driver = postgres_job_driver(URL)
    set_job_driver(driver)
    signals.reset()
    worker = Worker(LAT_CONCURRENCY, signals)
    try:
        await bench_noop.enqueue({"i": 10_000_000})
        if signals.wait_for(10_000_000, 60) is None:
            raise RuntimeError("the worker never picked up the warm-up job")
        await asyncio.sleep(3)  # long enough for the wake's probe to prove it live
        trials = []
        for k in range(LAT_TRIALS):
            await asyncio.sleep(random.uniform(0.1, 0.3))
            job = 10_000_001 + k
            began = time.time()
            await bench_noop.enqueue({"i": job})
            started = signals.wait_for(job, 10)
            if started is not None:
                trials.append(started - began)
        log(
            f"pickup: median {statistics.median(trials) * 1e3:.1f} ms, "
            f"max {max(trials) * 1e3:.1f} ms over {len(trials)} trials"
        )
        await asyncio.sleep(15)  # the idle back-off reaches its ceiling
        with signals.cond:
            before = len(signals.claims)
        await asyncio.sleep(IDLE_S)
        with signals.cond:
            idle = (len(signals.claims) - before) * 60 / IDLE_S
        log(f"idle: {idle:.1f} claims a minute")
        return trials, idle
    finally:
        worker.stop()
        await driver.close()


# -- the table ----------------------------------------------------------------------------------


def peer(name: str) -> dict[str, Any] | None:
    if not PEERS:
        return None
    path = Path(PEERS) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def write_figures(
    limits: dict[str, float] | None,
    single: Interleaved | None,
    batched: Interleaved | None,
    drained: Measured | None,
    picked: tuple[list[float], float] | None,
    path: str,
) -> None:
    """The medians of this run as JSON, written to ``path`` (``BENCH_JSON``): bench/versus.py
    reads them."""
    figures: dict[str, Any] = {"limits": limits}
    for key, measured in (("enqueue_single", single), ("enqueue_batch", batched)):
        if measured is not None:
            figures[key] = {
                "rate": statistics.median(measured.ours),
                "raw": statistics.median(measured.raw),
                "bare": statistics.median(measured.bare),
            }
            if measured.async_raw:
                figures[key]["async_raw"] = statistics.median(measured.async_raw)
    if drained is not None:
        figures["drain"] = {str(CONCURRENCY): drained.median}
    if picked is not None:
        trials, idle = picked
        figures["pickup_ms"] = {
            "median": statistics.median(trials) * 1e3,
            "max": max(trials) * 1e3,
        }
        figures["idle_claims_per_minute"] = idle
    Path(path).write_text(json.dumps(figures, indent=2) + "\n")


def main() -> None:
    version = fresh_database()
    asyncio.run(install(URL))
    signals = Signals()
    try:
        with psycopg.connect(URL, autocommit=True) as admin:
            limits = raw_limits(admin) if "limits" in ONLY else None
            single = asyncio.run(enqueue_single(admin)) if "single" in ONLY else None
            batched = asyncio.run(enqueue_batched(admin)) if "batch" in ONLY else None
            drained = asyncio.run(drain(admin, signals)) if "drain" in ONLY else None
            picked = asyncio.run(latency_and_idle(admin, signals)) if "latency" in ONLY else None
    finally:
        signals.close()
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f"drop database if exists {DATABASE} with (force)")

    if FIGURES:
        write_figures(limits, single, batched, drained, picked, FIGURES)
    pgq = peer("pgqueuer")

    def versus(ours: float, *key: str) -> str:
        value: Any = pgq
        for part in key:
            value = None if value is None else value.get(part)
        return f"{ours / value:.2f}x" if value else "-"

    def peer_latency() -> str:
        latency = (pgq or {}).get("latency") or {}
        median, worst = (latency.get("p50_s") or {}).get("median"), (latency.get("max_s") or {})
        if median is None:
            return "-"
        return f"PgQueuer: median {median * 1e3:.1f} ms, max {worst.get('max', 0) * 1e3:.1f} ms"

    rows: list[tuple[str, str, str, str]] = []
    if limits is not None:
        rows += [
            ("raw: single-row INSERT commits, 1 client", f"{limits['single']:,.0f}/s", "", "-"),
            ("raw: INSERT .. unnest, 1000 rows/stmt", f"{limits['batch']:,.0f} rows/s", "", "-"),
            ("raw: SKIP LOCKED claim 100 + update done", f"{limits['claim']:,.0f} rows/s", "", "-"),
        ]
    if single is not None:
        ours = statistics.median(single.ours)
        rows.append(
            (
                "enqueue, one handle.enqueue() per job",
                f"{ours:,.0f}/s",
                f"{single.ratio:.0%} of {statistics.median(single.raw):,.0f} raw commits/s "
                f"measured beside it (a bare INSERT of the row into x_jobs: "
                f"{single.bare_ratio:.0%}); {single.async_ratio:.0%} of the same raw commits "
                f"from an asyncio connection ({statistics.median(single.async_raw):,.0f}/s); "
                f"{single.cost.cell()}",
                versus(ours, "enqueue_single", "rate", "median"),
            )
        )
    if batched is not None:
        ours, bare = statistics.median(batched.ours), statistics.median(batched.bare)
        rows.append(
            (
                f"enqueue_many, {BATCH} per call",
                f"{ours:,.0f}/s",
                f"{batched.building_us:.1f} us/job of it building the rows (JobHandle.request); "
                f"{batched.ratio:.0%} of {statistics.median(batched.raw):,.0f} raw rows/s "
                f"beside it (a bare INSERT of the rows into x_jobs: {bare:,.0f} rows/s, "
                f"{versus(bare, 'enqueue_batch', 'rate', 'median')} PgQueuer); "
                f"{batched.cost.cell()}",
                versus(ours, "enqueue_batch", "rate", "median"),
            )
        )
    if drained is not None:
        rows.append(
            (
                f"drain {N:,} no-op jobs, 1 worker, c={CONCURRENCY}",
                f"{drained.median:,.0f}/s {drained.spread()}",
                drained.cost.cell(),
                versus(drained.median, "drain", str(CONCURRENCY), "rate", "median"),
            )
        )
    if picked is not None:
        trials, idle = picked
        median, worst = statistics.median(trials) * 1e3, max(trials) * 1e3
        rows += [
            (
                f"pickup from another process, c={LAT_CONCURRENCY}",
                f"median {median:.1f} ms, max {worst:.1f} ms",
                f"{len(trials)} trials",
                peer_latency(),
            ),
            ("idle claims a minute (one worker)", f"{idle:.1f}", f"over {IDLE_S:.0f} s", "-"),
        ]
    print()
    print(f"Postgres {version[0] if version else '?'}; N={N:,}, reps={REPS}")
    print()
    print("| measurement | result | detail | vs PgQueuer (rate ratio; >1 is faster) |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
