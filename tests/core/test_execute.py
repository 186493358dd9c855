"""One attempt from claim to settle: every outcome, with its counting rule."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest
from support.drive import drain
from support.jobs import declared
from support.outage import AckOutage

from ultimat3.jobs.core import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    AbortController,
    AbortSignal,
    ClaimedJob,
    DriverUnavailableError,
    FrozenClock,
    InvariantError,
    JobAbortedError,
    JobContext,
    JobDrainedError,
    JobKeyBusyError,
    JobsError,
    JobState,
    LeaseLostError,
    Progress,
    Retry,
    Settled,
    Step,
    current_actor,
    execute_job,
    job,
)
from ultimat3.jobs.core.execute import announce_exhausted, refuse_job
from ultimat3.jobs.core.memory import MemoryJobDriver
from ultimat3.jobs.core.retry import MAX_RETRY_DELAY_S


@dataclass
class Ping:
    host: str


def ping_job(body: Any, **options: Any) -> Any:
    return declared(body, input=Ping, key=lambda i: f"ping:{i.host}", **options)


async def claim_one(driver: MemoryJobDriver, queue: str = "default") -> ClaimedJob:
    batch = await driver.claim(worker_id="w1", slots={queue: 1}, visibility_timeout=30)
    assert len(batch.jobs) == 1
    return batch.jobs[0]


async def row(driver: MemoryJobDriver, job_id: str) -> Any:
    detail = await driver.introspect.get(job_id)
    assert detail is not None
    return detail.row


async def totals(driver: MemoryJobDriver, clock: FrozenClock) -> dict[str, int]:
    found = await driver.introspect.counter_totals(since=clock.now() - timedelta(days=1))
    if not found:
        return {}
    t = found[0]
    return {"done": t.done, "retried": t.retried, "failed": t.failed, "dead": t.dead}


async def test_a_body_that_returns_completes_and_counts_done(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def ok(*, input: Ping) -> str:
        return f"pong {input.host}"

    handle = ping_job(ok)
    queued = await handle.enqueue(Ping("a"))
    execution = await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert (execution.outcome, execution.settled, execution.result) == ("completed", True, "pong a")
    assert (await row(driver, queued.id)).state is JobState.DONE
    assert await totals(driver, clock) == {"done": 1, "retried": 0, "failed": 0, "dead": 0}


async def test_a_throw_with_attempts_left_retries_after_the_backoff(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def boom(*, input: Ping) -> None:
        raise RuntimeError("down")

    handle = ping_job(boom)
    queued = await handle.enqueue(Ping("b"))
    execution = await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert execution.outcome == "retried"
    stored = await row(driver, queued.id)
    assert (stored.state, stored.attempt, stored.run_at) == (
        JobState.READY,
        1,
        clock.now() + timedelta(seconds=1),
    )
    assert "RuntimeError: down" in stored.last_error
    assert (await totals(driver, clock))["retried"] == 1


async def test_a_replay_answers_what_was_stored_whatever_the_body_did_with_it(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """The memory driver stores and hands out copies, as a server stores bytes: a body that
    changes the value its step returned must not change what the next attempt replays."""

    async def cart(*, input: Ping, step: Step, attempt: int) -> Any:
        loaded = await step.run("load-cart", lambda: {"items": ["a"]})
        loaded["items"].append(f"attempt-{attempt}")
        if attempt == 1:
            raise RuntimeError("transient")
        return loaded

    handle = ping_job(cart)
    await handle.enqueue(Ping("c"))
    await execute_job(await claim_one(driver), driver=driver, handle=handle)
    clock.advance(1)
    execution = await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert execution.result == {"items": ["a", "attempt-2"]}


async def test_exhausted_attempts_dead_letter_with_the_stop_reason(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def boom(*, input: Ping) -> None:
        raise RuntimeError("down")

    handle = ping_job(boom)
    queued = await handle.enqueue(Ping("c"))
    executions = await drain(driver, clock, handle)
    assert [e.outcome for e in executions] == ["retried", "retried", "dead-lettered"]
    assert executions[-1].stop_reason == "attempts-exhausted"
    stored = await row(driver, queued.id)
    assert (stored.state, stored.attempt) == (JobState.DEAD, 3)
    assert await totals(driver, clock) == {"done": 0, "retried": 2, "failed": 0, "dead": 1}


async def test_dead_letter_false_drops_the_row_to_failed(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def boom(*, input: Ping) -> None:
        raise RuntimeError("down")

    handle = ping_job(boom, retry=Retry(attempts=1, dead_letter=False))
    queued = await handle.enqueue(Ping("d"))
    [execution] = await drain(driver, clock, handle)
    assert execution.outcome == "dropped"
    assert (await row(driver, queued.id)).state is JobState.FAILED
    assert (await totals(driver, clock))["failed"] == 1


async def test_a_tenant_function_raising_on_a_stored_input_still_tells_on_settled(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """New code whose tenant function reads a field the queued rows lack: the run fails, the
    final attempt dead-letters, and on_settled hears of it under the row's own tenant."""
    told: list[tuple[str, str | None]] = []
    strict = False

    def tenant(value: Ping) -> str:
        if strict:
            raise KeyError("org")
        return "org-1"

    async def body(*, input: Ping) -> None:
        return None

    async def on_settled(settled: Any) -> None:
        actor = current_actor()
        told.append((settled.outcome, actor.org_id if actor is not None else None))

    handle = ping_job(body, tenant=tenant, retry=Retry(attempts=1), on_settled=on_settled)
    queued = await handle.enqueue(Ping("t"))
    strict = True
    [execution] = await drain(driver, clock, handle)
    assert execution.outcome == "dead-lettered"
    assert (await row(driver, queued.id)).state is JobState.DEAD
    assert told == [("dead-lettered", "org-1")]


class RejectedError(JobsError):
    code = "X_VALIDATION"


async def test_a_terminal_code_dead_letters_at_once_and_says_why(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def reject(*, input: Ping) -> None:
        raise RejectedError("bad card")

    handle = ping_job(reject, retry=Retry(attempts=5))
    queued = await handle.enqueue(Ping("e"))
    [execution] = await drain(driver, clock, handle)
    assert (execution.outcome, execution.stop_reason) == ("dead-lettered", "terminal")
    stored = await row(driver, queued.id)
    assert stored.attempt == 1
    assert "terminal: dead-lettered on attempt 1 of 5" in stored.last_error


class RateLimitedError(JobsError):
    code = "X_RATE_LIMITED"


async def test_a_huge_stated_retry_after_still_lands_the_nack(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """1e12 s past now is no datetime: the delay is held to the ceiling, so the row is retried
    instead of the settle raising and leaving it running until its lease lapses."""

    async def limited(*, input: Ping) -> None:
        raise RateLimitedError("slow down", meta={"retry_after_seconds": 1e12})

    handle = ping_job(limited, retry=Retry(attempts=5, jitter=False))
    queued = await handle.enqueue(Ping("rate-limited"))
    execution = await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert (execution.outcome, execution.settled) == ("retried", True)
    stored = await row(driver, queued.id)
    assert (stored.state, stored.attempt) == (JobState.READY, 1)
    assert stored.run_at == clock.now() + timedelta(seconds=MAX_RETRY_DELAY_S)


async def test_a_suspension_hands_the_attempt_back(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def nap(*, input: Ping, step: Step) -> None:
        await step.sleep("1h")

    handle = ping_job(nap)
    queued = await handle.enqueue(Ping("f"))
    execution = await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert execution.outcome == "suspended"
    stored = await row(driver, queued.id)
    assert (stored.state, stored.attempt) == (JobState.SUSPENDED, 0)
    assert stored.run_at == clock.now() + timedelta(hours=1)
    assert await totals(driver, clock) == {}


async def test_the_deadline_aborts_ctx_signal_and_cancels_the_body(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    seen: list[AbortSignal] = []

    async def stuck(*, input: Ping, ctx: JobContext[Any]) -> None:
        seen.append(ctx.signal)
        await asyncio.sleep(3600)

    handle = ping_job(stuck, timeout="5s")
    queued = await handle.enqueue(Ping("g"))
    running = asyncio.create_task(
        execute_job(await claim_one(driver), driver=driver, handle=handle)
    )
    while not seen:
        await asyncio.sleep(0)
    clock.advance(5)
    execution = await running
    assert seen[0].aborted
    assert execution.outcome == "retried"
    assert getattr(execution.error, "code", None) == "X_JOB_TIMEOUT"
    assert "X_JOB_TIMEOUT" in (await row(driver, queued.id)).last_error


async def test_a_body_that_finishes_past_its_deadline_is_logged_abandoned(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def ignores_signal(*, input: Ping) -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "finished anyway"
        return "never"

    handle = ping_job(ignores_signal, timeout="1s")
    await handle.enqueue(Ping("h"))
    running = asyncio.create_task(
        execute_job(await claim_one(driver), driver=driver, handle=handle)
    )
    await asyncio.sleep(0.01)
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        clock.advance(1)
        execution = await running
    assert execution.outcome == "retried"
    assert any(r.getMessage().startswith("jobs.timeout.abandoned") for r in caplog.records)


async def test_a_body_that_ignores_its_deadline_does_not_hold_the_job_past_it(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The attempt fails at its deadline and the job is claimable again; the body left behind
    can write no step, and is logged abandoned when it does end. Waiting for it, a body that
    never returned held its row, its lease and its worker slot for ever."""
    release = asyncio.Event()
    late: list[BaseException] = []

    async def deaf(*, input: Ping, step: Step) -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # swallows every cancel
        try:
            await step.run("late", lambda: 1)
        except JobAbortedError as refused:
            late.append(refused)

    handle = ping_job(deaf, timeout="1s", retry=Retry(attempts=3, delay=0))
    queued = await handle.enqueue(Ping("deaf"))
    running = asyncio.create_task(
        execute_job(await claim_one(driver), driver=driver, handle=handle)
    )
    await asyncio.sleep(0.01)
    clock.advance(1)
    execution = await asyncio.wait_for(running, timeout=30)
    assert (execution.outcome, getattr(execution.error, "code", None)) == (
        "retried",
        "X_JOB_TIMEOUT",
    )
    assert (await row(driver, queued.id)).state is JobState.READY
    again = await claim_one(driver)
    assert again.id == queued.id
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        release.set()
        for _ in range(100):
            if late:
                break
            await asyncio.sleep(0.01)
    assert [error.code for error in late] == ["X_ABORTED"]
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.steps == []
    assert any(r.getMessage().startswith("jobs.timeout.abandoned") for r in caplog.records)


async def test_a_drain_interrupts_the_attempt_uncounted_and_ready_at_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    started = asyncio.Event()

    async def long(*, input: Ping) -> None:
        started.set()
        await asyncio.sleep(3600)

    handle = ping_job(long, retry=Retry(attempts=1))
    queued = await handle.enqueue(Ping("i"))
    drain_signal = AbortController()
    running = asyncio.create_task(
        execute_job(
            await claim_one(driver), driver=driver, handle=handle, signal=drain_signal.signal
        )
    )
    await started.wait()
    drain_signal.abort(JobDrainedError("worker w1 draining on SIGTERM"))
    execution = await running
    assert execution.outcome == "interrupted"
    stored = await row(driver, queued.id)
    assert (stored.state, stored.attempt, stored.run_at) == (JobState.READY, 0, clock.now())
    assert await totals(driver, clock) == {}


async def test_a_lost_lease_settles_nothing(driver: MemoryJobDriver, clock: FrozenClock) -> None:
    started = asyncio.Event()

    async def long(*, input: Ping) -> None:
        started.set()
        await asyncio.sleep(3600)

    handle = ping_job(long)
    queued = await handle.enqueue(Ping("j"))
    lease = AbortController()
    running = asyncio.create_task(
        execute_job(await claim_one(driver), driver=driver, handle=handle, signal=lease.signal)
    )
    await started.wait()
    lease.abort(LeaseLostError("renewals stopped landing"))
    execution = await running
    assert (execution.outcome, execution.settled) == ("lease-lost", False)
    assert (await row(driver, queued.id)).state is JobState.RUNNING


async def test_a_cancelled_row_refuses_the_workers_settle(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def ok(*, input: Ping) -> None:
        await driver.introspect.cancel(queued.id, "operator")

    handle = ping_job(ok)
    queued = await handle.enqueue(Ping("k"))
    execution = await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert (execution.outcome, execution.settled) == ("lease-lost", False)
    assert (await row(driver, queued.id)).state is JobState.CANCELLED


async def test_execute_cancelled_from_outside_settles_nothing(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    started = asyncio.Event()

    async def long(*, input: Ping) -> None:
        started.set()
        await asyncio.sleep(3600)

    handle = ping_job(long)
    queued = await handle.enqueue(Ping("l"))
    running = asyncio.create_task(
        execute_job(await claim_one(driver), driver=driver, handle=handle)
    )
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert (await row(driver, queued.id)).state is JobState.RUNNING


async def test_a_stored_payload_that_no_longer_parses_dead_letters_keeping_it(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    told: list[Settled[Any]] = []

    async def ok(*, input: Ping) -> None:
        return None

    handle = ping_job(ok, retry=Retry(attempts=5), on_settled=told.append)
    queued = await handle.enqueue(Ping("m"))
    driver._state.rows[queued.id].input = {"hostname": "renamed-field"}
    [execution] = await drain(driver, clock, handle)
    assert (execution.outcome, execution.stop_reason) == ("dead-lettered", "terminal")
    stored = await row(driver, queued.id)
    assert stored.input == {"hostname": "renamed-field"}
    assert "X_VALIDATION" in stored.last_error
    assert (told[0].outcome, told[0].input, told[0].code) == ("dead-lettered", None, "X_VALIDATION")


async def test_an_unregistered_name_is_retried_not_lost(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def ok(*, input: Ping) -> None:
        return None

    handle = ping_job(ok)
    await handle.enqueue(Ping("n"))
    claimed = replace(await claim_one(driver), name="no-such-job-is-registered")
    execution = await execute_job(claimed, driver=driver)
    assert execution.outcome == "retried"
    assert "no job named" in str(execution.error)


async def test_progress_is_written_at_most_once_a_second_plus_the_last(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    writes: list[Any] = []
    record = driver.introspect.record_progress

    async def spy(job_id: str, ref: Any, progress: Any) -> bool:
        writes.append(progress)
        return await record(job_id, ref, progress)

    driver.introspect.record_progress = spy  # type: ignore[method-assign]

    async def loop(*, input: Ping, progress: Any) -> None:
        for done in range(5):
            progress(done, 5, "rows")
        clock.advance(1)
        progress(5, 5)

    handle = ping_job(loop)
    queued = await handle.enqueue(Ping("o"))
    execution = await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert [(w.done, w.total) for w in writes] == [(0, 5), (5, 5)]
    assert execution.progress is not None
    assert execution.progress.done == 5
    assert (await row(driver, queued.id)).progress == Progress(done=5, total=5)


async def test_the_last_progress_lands_last_whatever_an_earlier_write_takes(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """Each write overwrites the row's progress: the last one, sent at the settle while the
    first is still on the wire, must not land before it (on Postgres the two took two pooled
    connections and often did)."""
    record = driver.introspect.record_progress
    landed: list[Any] = []
    later_landed = asyncio.Event()

    async def first_one_slow(job_id: str, ref: Any, progress: Any) -> bool:
        if not landed and progress.note == "start":
            with contextlib.suppress(TimeoutError):  # the later write lands first, if it can
                await asyncio.wait_for(later_landed.wait(), 0.2)
        answer = await record(job_id, ref, progress)
        landed.append(progress.note)
        later_landed.set()
        return answer

    driver.introspect.record_progress = first_one_slow  # type: ignore[method-assign]

    async def two_reports(*, input: Ping, progress: Any) -> None:
        progress(0, 2, "start")
        progress(2, 2, "end")

    handle = ping_job(two_reports)
    queued = await handle.enqueue(Ping("order"))
    await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert landed == ["start", "end"]
    assert (await row(driver, queued.id)).progress == Progress(done=2, total=2, note="end")


@pytest.mark.parametrize(
    "report",
    [(math.nan, 2, None), (1, math.inf, None), ("three", None, None), (1, 2, 3)],
    ids=["a NaN count", "an infinite total", "a count that is text", "a note that is not"],
)
async def test_progress_no_driver_stores_is_refused_to_the_body(
    driver: MemoryJobDriver, clock: FrozenClock, report: tuple[Any, Any, Any]
) -> None:
    """A NaN count was kept by the memory driver and dropped, silently, by the servers'."""
    refused: list[str] = []

    async def reports(*, input: Ping, progress: Any) -> None:
        try:
            progress(*report)
        except InvariantError as exc:
            refused.append(exc.code)

    handle = ping_job(reports)
    queued = await handle.enqueue(Ping("bad-progress"))
    await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert refused == ["X_INVARIANT"]
    assert (await row(driver, queued.id)).progress is None


async def test_on_settled_is_told_completed_with_the_result_under_the_tenant(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    from ultimat3.jobs.core import current_actor

    told: list[tuple[str, Any, Any]] = []

    async def hook(settled: Settled[Any]) -> None:
        actor = current_actor()
        told.append((settled.outcome, settled.result, actor.org_id if actor else None))

    async def sync(*, input: Ping) -> dict[str, int]:
        return {"rows": 2}

    handle = job(
        input=Ping,
        idempotency_key=lambda i: i.host,
        tenant=lambda i: f"org-{i.host}",
        on_settled=hook,
    )(sync)
    await handle.enqueue(Ping("p"))
    await drain(driver, clock, handle)
    assert told == [("completed", {"rows": 2}, "org-p")]


async def test_on_settled_is_not_told_about_a_retry(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    told: list[str] = []
    attempts: list[int] = []

    async def flaky(*, input: Ping, attempt: int) -> None:
        attempts.append(attempt)
        if attempt == 1:
            raise RuntimeError("once")

    handle = ping_job(flaky, on_settled=lambda s: told.append(s.outcome))
    await handle.enqueue(Ping("q"))
    await drain(driver, clock, handle)
    assert (attempts, told) == ([1, 2], ["completed"])


async def test_a_hook_that_keeps_throwing_is_tried_three_times_logged_and_never_thrown(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    tries: list[int] = []

    def hook(settled: Settled[Any]) -> None:
        tries.append(1)
        raise RuntimeError("webhook down")

    async def ok(*, input: Ping) -> None:
        return None

    handle = ping_job(ok, on_settled=hook)
    queued = await handle.enqueue(Ping("r"))
    with caplog.at_level(logging.ERROR, logger="ultimat3.jobs"):
        [execution] = await drain(driver, clock, handle)
    assert len(tries) == 3
    assert execution.outcome == "completed"
    assert execution.on_settled_error is not None
    assert execution.on_settled_error.code == "X_JOB_ON_SETTLED_FAILED"
    assert any(r.getMessage().startswith("jobs.on-settled.failed") for r in caplog.records)
    assert (await row(driver, queued.id)).state is JobState.DONE


async def test_a_refused_run_is_failed_uncounted_and_told(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    told: list[Settled[Any]] = []
    ran: list[str] = []

    async def body(*, input: Ping) -> None:
        ran.append(input.host)

    handle = ping_job(body, on_settled=told.append)
    queued = await handle.enqueue(Ping("s"))
    execution = await refuse_job(
        await claim_one(driver),
        driver=driver,
        handle=handle,
        value=Ping("s"),
        error=JobKeyBusyError("key s is held by another run"),
    )
    assert (execution.outcome, execution.settled, ran) == ("refused", True, [])
    stored = await row(driver, queued.id)
    assert (stored.state, stored.attempt) == (JobState.FAILED, 0)
    assert "X_JOB_KEY_BUSY" in stored.last_error
    assert (told[0].outcome, told[0].code) == ("refused", "X_JOB_KEY_BUSY")
    assert (await totals(driver, clock))["failed"] == 1


async def test_a_lease_lapsed_on_the_final_attempt_is_buried_and_told(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    told: list[Settled[Any]] = []

    async def dies(*, input: Ping) -> None:
        return None

    handle = ping_job(dies, retry=Retry(attempts=1), on_settled=told.append)
    queued = await handle.enqueue(Ping("t"))
    await claim_one(driver)  # the worker that took it dies here
    clock.advance(31)
    batch = await driver.claim(worker_id="w2", slots={"default": 1}, visibility_timeout=30)
    assert batch.jobs == []
    [buried] = batch.exhausted
    await announce_exhausted(buried, handle=handle)
    stored = await row(driver, queued.id)
    assert (stored.state, stored.last_error) == (JobState.DEAD, LEASE_LAPSED_FINAL_ATTEMPT)
    assert (told[0].outcome, told[0].code) == ("dead-lettered", None)
    assert str(told[0].error) == LEASE_LAPSED_FINAL_ATTEMPT


async def test_final_attempt_is_true_only_when_a_failure_would_not_be_retried(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    seen: list[tuple[int, bool]] = []

    async def body(*, input: Ping, attempt: int, final_attempt: bool) -> None:
        seen.append((attempt, final_attempt))
        raise RuntimeError("again")

    handle = ping_job(body, retry=Retry(attempts=3, jitter=False))
    await handle.enqueue(Ping("u"))
    await drain(driver, clock, handle)
    assert seen == [(1, False), (2, False), (3, True)]


async def test_a_drained_attempt_is_presented_again_under_the_same_number(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    seen: list[tuple[int, bool]] = []
    release = asyncio.Event()

    async def body(*, input: Ping, attempt: int, final_attempt: bool) -> None:
        seen.append((attempt, final_attempt))
        if len(seen) == 1:
            release.set()
            await asyncio.sleep(3600)

    handle = ping_job(body, retry=Retry(attempts=1))
    await handle.enqueue(Ping("v"))
    controller = AbortController()
    running = asyncio.create_task(
        execute_job(await claim_one(driver), driver=driver, handle=handle, signal=controller.signal)
    )
    await release.wait()
    controller.abort(JobDrainedError("draining"))
    await running
    await drain(driver, clock, handle)
    assert seen == [(1, True), (1, True)]


async def test_a_sync_body_reports_progress_from_its_thread(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    def crunch(*, input: Ping, progress: Any) -> str:
        for done in range(3):
            progress(done, 3)
        return "crunched"

    handle = ping_job(crunch)
    queued = await handle.enqueue(Ping("sync-progress"))
    execution = await execute_job(await claim_one(driver), driver=driver, handle=handle)
    assert (execution.outcome, execution.result) == ("completed", "crunched")
    assert (await row(driver, queued.id)).progress == Progress(done=2, total=3)


async def test_a_wait_for_event_times_out_on_the_memory_drivers_frozen_clock(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def waits(*, input: Ping, step: Step) -> Any:
        return await step.wait_for_event("answer", "never.published", timeout="1m")

    handle = ping_job(waits)
    await handle.enqueue(Ping("event-clock"))
    executions = await drain(driver, clock, handle)
    # parked on the 30 s event poll, then at the 1-minute deadline: timed out, answering None
    assert [e.outcome for e in executions] == ["suspended", "suspended", "completed"]
    assert executions[-1].result is None


async def test_a_required_wait_that_timed_out_ends_the_run_on_that_attempt(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """A retry would replay the stored timeout and fail the same way: the attempts left are
    not spent on that, and the dead row says why."""

    async def waits(*, input: Ping, step: Step) -> Any:
        return await step.wait_for_event("answer", "never.published", timeout="1m", required=True)

    handle = ping_job(waits, retry=Retry(attempts=5, delay=1, jitter=False))
    queued = await handle.enqueue(Ping("required-wait"))
    executions = await drain(driver, clock, handle)
    assert [e.outcome for e in executions] == ["suspended", "suspended", "dead-lettered"]
    assert executions[-1].stop_reason == "terminal"
    stored = await row(driver, queued.id)
    assert (stored.state, stored.attempt) == (JobState.DEAD, 1)
    assert "X_JOB_TIMEOUT" in stored.last_error
    assert "replays its timeout on every retry" in stored.last_error


@pytest.mark.usefixtures("quick_ack_retries")
async def test_an_ack_the_backend_did_not_take_is_sent_again_while_the_lease_holds(
    driver: MemoryJobDriver, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Given up after the driver's own retry, the ack of a completed job would leave its row to
    lapse, and a final attempt's to be buried dead."""

    async def ok(*, input: Ping) -> str:
        return "pong"

    handle = ping_job(ok, retry=Retry(attempts=1))
    queued = await handle.enqueue(Ping("ack"))
    flaky = AckOutage(driver, failures=3, step=5)
    caplog.set_level(logging.WARNING)
    execution = await execute_job(await claim_one(driver), driver=flaky, handle=handle)  # type: ignore[arg-type]
    assert (execution.outcome, execution.settled, flaky.acks) == ("completed", True, 4)
    assert (await row(driver, queued.id)).state is JobState.DONE
    assert sum("jobs.ack.retrying" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.usefixtures("quick_ack_retries")
async def test_an_ack_that_cannot_land_before_the_lease_lapses_raises(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """Past its lease the row is another claim's to take: the failure is the worker's to log,
    and the row returns through the claim."""

    async def ok(*, input: Ping) -> None:
        return None

    handle = ping_job(ok)
    queued = await handle.enqueue(Ping("gone"))
    flaky = AckOutage(driver, failures=100, step=10)  # the claim's lease is 30 s
    with pytest.raises(DriverUnavailableError):
        await execute_job(await claim_one(driver), driver=flaky, handle=handle)  # type: ignore[arg-type]
    assert flaky.acks == 3  # sent at 0 s, 10 s and 20 s; at 30 s the lease had lapsed
    assert (await row(driver, queued.id)).state is JobState.RUNNING


@pytest.mark.usefixtures("quick_ack_retries")
async def test_the_ack_retries_stop_when_the_caller_says_the_lease_is_gone(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    async def ok(*, input: Ping) -> None:
        return None

    handle = ping_job(ok)
    await handle.enqueue(Ping("refused"))
    flaky = AckOutage(driver, failures=100)
    held = iter([True, True, False])
    with pytest.raises(DriverUnavailableError):
        await execute_job(
            await claim_one(driver),
            driver=flaky,  # type: ignore[arg-type]
            handle=handle,
            holds_lease=lambda: next(held),
        )
    assert flaky.acks == 3
