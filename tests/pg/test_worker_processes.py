"""Real worker processes against the real server: killed or stalled mid-job, and two side by
side.

These wait in real time (a killed process's lease has to lapse on the wall clock), with generous
bounds; nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from ultimat3.jobs.core import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    SYSTEM_CLOCK,
    EnqueueRequest,
    JobRow,
    JobState,
    new_id,
)
from ultimat3.jobs.pg import PostgresJobDriver, postgres_job_driver

pytestmark = [pytest.mark.pg, pytest.mark.slow]

WORKER = Path(__file__).with_name("worker_process.py")
PATIENCE_S = 60.0
VISIBILITY_S = 1.5


class Workers:
    """Worker processes this test started; every one is gone when the test ends."""

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, concurrency: int = 4) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                self.url,
                str(self.log),
                str(VISIBILITY_S),
                str(concurrency),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.started.append(process)
        return process

    def lines(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [line.split() for line in self.log.read_text().splitlines() if line]

    async def until_lines(self, predicate: Callable[[list[list[str]]], bool]) -> list[list[str]]:
        async def poll() -> list[list[str]]:
            while True:
                lines = self.lines()
                if predicate(lines):
                    return lines
                await asyncio.sleep(0.05)

        return await asyncio.wait_for(poll(), PATIENCE_S)

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def workers(pg_url: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(pg_url, tmp_path / "runs.log")
    yield started
    started.stop_all()


@pytest.fixture
async def admin(pg_url: str) -> AsyncIterator[PostgresJobDriver]:
    driver = postgres_job_driver(pg_url)
    yield driver
    await driver.close()


def row(name: str, queue: str, n: int, max_attempts: int = 2) -> EnqueueRequest:
    return EnqueueRequest(
        id=new_id(),
        run_id=new_id(),
        name=name,
        queue=queue,
        input={"n": n},
        idempotency_key=f"{name}:{n}",
        tenant_id=None,
        max_attempts=max_attempts,
        run_at=SYSTEM_CLOCK.now(),
    )


async def until_state(admin: PostgresJobDriver, job_id: str, state: JobState) -> JobRow:
    """The row of ``job_id`` once it is in ``state``."""

    async def poll() -> JobRow:
        while True:
            detail = await admin.introspect.get(job_id)
            assert detail is not None
            if detail.row.state is state:
                return detail.row
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(poll(), PATIENCE_S)


def kill(process: subprocess.Popen[bytes]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


async def test_a_job_whose_worker_was_killed_is_delivered_again_then_buried_dead(
    workers: Workers, admin: PostgresJobDriver
) -> None:
    queued = await admin.enqueue(row("pg_proc_sleepy", "proc-sleepy", 1))

    first = workers.start()
    await workers.until_lines(lambda lines: len(lines) >= 1)
    kill(first)

    second = workers.start()
    lines = await workers.until_lines(lambda lines: len(lines) >= 2)
    kill(second)
    assert [(line[0], line[1], line[2]) for line in lines] == [
        ("start", queued.id, "1"),
        ("start", queued.id, "2"),
    ]

    workers.start()

    buried = await until_state(admin, queued.id, JobState.DEAD)
    assert buried.last_error == LEASE_LAPSED_FINAL_ATTEMPT
    assert len(workers.lines()) == 2


async def test_two_worker_processes_never_run_one_row_at_once(
    workers: Workers, admin: PostgresJobDriver
) -> None:
    workers.start(concurrency=8)
    workers.start(concurrency=8)

    async def both_registered() -> None:
        while len(await admin.introspect.workers()) < 2:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(both_registered(), PATIENCE_S)
    await admin.enqueue_many([row("pg_proc_work", "proc-work", n) for n in range(300)])
    lines = await workers.until_lines(
        lambda lines: sum(1 for line in lines if line[0] == "end") >= 300
    )
    starts = Counter(line[1] for line in lines if line[0] == "start")
    assert len(starts) == 300
    assert set(starts.values()) == {1}
    assert len({line[2] for line in lines}) == 2, "both processes took a share"


async def test_a_stalled_worker_that_wakes_after_its_lease_lapsed_changes_nothing(
    workers: Workers, admin: PostgresJobDriver
) -> None:
    """A worker frozen mid-job (SIGSTOP: a long GC pause, a VM migration) past its lease: another
    worker runs the row again and finishes it. The first one, let go, settles nothing — its
    writes are fenced on a claim the row no longer holds — and lives on."""
    since = SYSTEM_CLOCK.now()
    queued = await admin.enqueue(row("pg_proc_slow", "proc-slow", 1))
    stalled = workers.start()
    await workers.until_lines(lambda lines: len(lines) >= 1)
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        workers.start()

        await until_state(admin, queued.id, JobState.DONE)  # run by the other worker
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    lines = workers.lines()
    assert [line[:3] for line in lines if line[0] == "start"] == [
        ["start", queued.id, "1"],
        ["start", queued.id, "2"],
    ]
    await asyncio.sleep(3 * VISIBILITY_S)  # the stalled worker's heartbeat, or its settle, lands
    detail = await admin.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.state, detail.row.attempt) == (JobState.DONE, 2)
    (totals,) = await admin.introspect.counter_totals(since=since)
    assert (totals.done, totals.retried, totals.failed, totals.dead) == (1, 0, 0, 0)
    assert stalled.poll() is None, "the stalled worker died of its lost lease"
