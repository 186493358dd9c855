"""Faults against the real server: stale claims, a killed worker, a Redis restart.

The worker tests run ``worker_process.py`` in subprocesses on the real clock (short visibility
timeouts, generous waits). The restart test runs its worker against a server of its own (no
persistence, a free port) and restarts THAT one; without persistence the restart erases the
whole namespace, which the test checks too. The shared server is never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from ultimat3.jobs.core import (
    AckOptions,
    EnqueueRequest,
    FrozenClock,
    NackOptions,
    Progress,
    StepRecord,
    new_id,
)
from ultimat3.jobs.redis import RedisJobDriver, redis_job_driver

RequestBuilder = Callable[..., EnqueueRequest]

WORKER = Path(__file__).with_name("worker_process.py")
# -- a stale claim ---------------------------------------------------------------------------


async def _snapshot(driver: RedisJobDriver, job_id: str) -> object:
    since = driver.clock.now() - timedelta(days=1)
    return (
        await driver.introspect.get(job_id),
        await driver.stats(),
        await driver.introspect.counter_totals(since=since),
    )


async def test_a_stale_claims_late_writes_answer_false_and_change_nothing(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    queued = await driver.enqueue(new_request())
    (stale,) = (await driver.claim(worker_id="w1", slots={"q": 1}, visibility_timeout=30)).jobs
    clock.advance(30)
    (fresh,) = (await driver.claim(worker_id="w2", slots={"q": 1}, visibility_timeout=30)).jobs
    assert fresh.id == stale.id == queued.id
    before = await _snapshot(driver, queued.id)
    ref = stale.claim
    assert not await driver.ack(stale.id, AckOptions(ref.worker_id, ref.claim, 10))
    assert not await driver.nack(stale.id, NackOptions(ref.worker_id, ref.claim, error="late"))
    assert not await driver.heartbeat(stale.id, ref, 300)
    assert not await driver.save_step(stale.id, ref, stale.run_id, StepRecord("s", 0, 1))
    assert not await driver.introspect.record_progress(stale.id, ref, Progress(1))
    assert await _snapshot(driver, queued.id) == before


async def test_a_worker_reclaiming_its_own_row_cannot_settle_with_the_old_claim(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    await driver.enqueue(new_request())
    (first,) = (await driver.claim(worker_id="w1", slots={"q": 1}, visibility_timeout=30)).jobs
    clock.advance(30)
    (second,) = (await driver.claim(worker_id="w1", slots={"q": 1}, visibility_timeout=30)).jobs
    old = first.claim
    assert not await driver.ack(first.id, AckOptions(old.worker_id, old.claim))
    assert await driver.ack(second.id, AckOptions(second.claim.worker_id, second.claim.claim))


# -- worker processes --------------------------------------------------------------------------


class Workers:
    """Worker subprocesses on one namespace, and the log their jobs write."""

    def __init__(self, url: str, prefix: str, log: Path) -> None:
        self.url, self.prefix, self.log = url, prefix, log
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, visibility: float, *, stderr: Path | None = None) -> subprocess.Popen[bytes]:
        """A worker process; its log lines (stderr) go to ``stderr`` when given."""
        with contextlib.ExitStack() as files:
            err = files.enter_context(stderr.open("wb")) if stderr is not None else None
            process = subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    self.url,
                    self.prefix,
                    str(self.log),
                    str(visibility),
                ],
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                stderr=err,
            )
        self.processes.append(process)
        return process

    def starts(self) -> list[tuple[str, int, int]]:
        if not self.log.exists():
            return []
        rows = [line.split() for line in self.log.read_text().splitlines()]
        return [(label, int(attempt), int(pid)) for label, attempt, pid in rows]

    async def started(self, label: str, attempt: int, timeout: float = 30.0) -> int:
        """The pid that started ``label``'s ``attempt``, once one did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for seen, tried, pid in self.starts():
                if (seen, tried) == (label, attempt):
                    return pid
            await asyncio.sleep(0.05)
        raise AssertionError(f"{label!r} attempt {attempt} never started: {self.starts()}")

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def workers(redis_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(redis_url, redis_prefix, tmp_path / "starts.log")
    yield pool
    pool.stop_all()


@pytest.fixture
async def live_driver(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisJobDriver]:
    """A driver on the real clock, on the workers' namespace."""
    built = redis_job_driver(url=redis_url, prefix=redis_prefix)
    yield built
    await built.close()


def _fault(driver: RedisJobDriver, label: str, hang: float = 0.0) -> EnqueueRequest:
    return EnqueueRequest(
        id=new_id(),
        run_id=new_id(),
        name="fault-job",
        queue="faults",
        input={"label": label, "hang": hang},
        idempotency_key=label,
        tenant_id=None,
        max_attempts=3,
        run_at=driver.clock.now(),
    )


async def _eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never came true"
        await asyncio.sleep(0.05)


async def _until_done(driver: RedisJobDriver, job_id: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        detail = await driver.introspect.get(job_id)
        if detail is not None and detail.row.state.value == "done":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {await driver.introspect.get(job_id)}")


@pytest.mark.slow
async def test_a_job_whose_worker_was_killed_is_delivered_again_after_its_lease_lapses(
    workers: Workers, live_driver: RedisJobDriver
) -> None:
    doomed = workers.start(visibility=2.0)
    queued = await live_driver.enqueue(_fault(live_driver, "killed", hang=60))
    assert await workers.started("killed", 1) == doomed.pid
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    rescuer = workers.start(visibility=2.0)
    assert await workers.started("killed", 2) == rescuer.pid
    await _until_done(live_driver, queued.id)


@pytest.mark.slow
async def test_a_worker_survives_a_redis_restart_and_goes_on(
    private_redis_url: str, restart_private_redis: Callable[[], None], tmp_path: Path
) -> None:
    workers = Workers(private_redis_url, "restart", tmp_path / "starts.log")
    driver = redis_job_driver(url=private_redis_url, prefix="restart")
    worker_log = tmp_path / "worker.err"
    try:
        worker = workers.start(visibility=5.0, stderr=worker_log)
        before = await driver.enqueue(_fault(driver, "before"))
        assert await workers.started("before", 1) == worker.pid
        await _until_done(driver, before.id)
        in_flight = await driver.enqueue(_fault(driver, "in-flight", hang=2.0))
        assert await workers.started("in-flight", 1) == worker.pid

        await asyncio.to_thread(restart_private_redis)

        # Without persistence the restart erased the namespace: the done row is gone, and so is
        # the row of the run still in flight, whose settle then lands nowhere.
        assert await driver.introspect.get(before.id) is None
        assert await driver.introspect.get(in_flight.id) is None
        after = await driver.enqueue(_fault(driver, "after"))
        assert await workers.started("after", 1) == worker.pid
        await _until_done(driver, after.id)
        # The run in flight learns it at its next heartbeat, or at its settle if it ends first.
        await _eventually(
            lambda: any(
                event in worker_log.read_text()
                for event in ("jobs.lease.lost", "jobs.settle.unowned")
            )
        )
        assert [label for label, _, _ in workers.starts()] == ["before", "in-flight", "after"]
        assert worker.poll() is None, "the worker process died with the server"
    finally:
        workers.stop_all()
        await driver.close()
