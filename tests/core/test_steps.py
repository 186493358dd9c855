"""Durable steps: run once ever, replay from storage, suspend without burning an attempt."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

import pytest

from ultimat3.jobs.core import (
    AbortController,
    AbortSignal,
    FrozenClock,
    InvariantError,
    JobAbortedError,
    JobTimeoutError,
    StepDuplicateError,
    StepKind,
    StepOutputInvalidError,
    StepRecord,
    StepSuspension,
    memory_event_bus,
)
from ultimat3.jobs.core.model import STEP_KINDS
from ultimat3.jobs.core.steps import Step


class Storage:
    """Step storage as a driver keeps it, with a switch to make the claim lapse."""

    def __init__(self) -> None:
        self.records: dict[str, StepRecord] = {}
        self.claim_held = True

    async def __call__(self, record: StepRecord) -> bool:
        if not self.claim_held:
            return False
        self.records[record.name] = record
        return True


def make_step(
    storage: Storage,
    clock: FrozenClock,
    *,
    signal: AbortSignal | None = None,
    step_timeout: float | None = None,
    events: Any = None,
) -> Step:
    return Step(
        store=storage,
        steps=dict(storage.records),
        signal=signal or AbortController().signal,
        clock=clock,
        events=events or memory_event_bus(clock),
        step_timeout=step_timeout,
        event_poll=30,
    )


async def test_a_step_runs_once_and_replays_its_stored_result(clock: FrozenClock) -> None:
    storage, calls = Storage(), []

    def provision() -> dict[str, str]:
        calls.append("provision")
        return {"org": "o1"}

    first = await make_step(storage, clock).run("provision", provision)
    again = await make_step(storage, clock).run("provision", provision)
    assert first == again == {"org": "o1"}
    assert calls == ["provision"]


async def test_the_first_run_returns_the_json_round_trip_a_replay_would(clock: FrozenClock) -> None:
    result = await make_step(Storage(), clock).run("pair", lambda: (1, 2))
    assert result == [1, 2]


async def test_a_result_json_cannot_hold_is_x_step_output_invalid(clock: FrozenClock) -> None:
    with pytest.raises(StepOutputInvalidError):
        await make_step(Storage(), clock).run("set", lambda: {1, 2})


async def test_a_result_nested_past_max_json_depth_is_x_step_output_invalid(
    clock: FrozenClock,
) -> None:
    """Stored by one driver and refused by another's decoder (or by the claim reading it back,
    with every row of that claim): refused here, before anything is stored."""

    def deep() -> object:
        value: object = 1
        for _ in range(150):
            value = {"down": value}
        return value

    with pytest.raises(StepOutputInvalidError):
        await make_step(Storage(), clock).run("deep", deep)


async def test_a_step_name_twice_in_one_run_is_x_step_duplicate(clock: FrozenClock) -> None:
    step = make_step(Storage(), clock)
    await step.run("charge", lambda: 1)
    with pytest.raises(StepDuplicateError) as caught:
        await step.run("charge", lambda: 2)
    assert caught.value.code == "X_STEP_DUPLICATE"


async def test_a_failed_step_stores_nothing_and_runs_again_next_attempt(clock: FrozenClock) -> None:
    storage, calls = Storage(), []

    async def flaky() -> str:
        calls.append("try")
        if len(calls) == 1:
            raise RuntimeError("smtp down")
        return "sent"

    with pytest.raises(RuntimeError):
        await make_step(storage, clock).run("welcome", flaky)
    assert "welcome" not in storage.records
    assert await make_step(storage, clock).run("welcome", flaky) == "sent"


async def test_fn_receives_the_steps_signal(clock: FrozenClock) -> None:
    seen: list[AbortSignal] = []

    async def save(signal: AbortSignal) -> None:
        seen.append(signal)

    await make_step(Storage(), clock).run("save", save)
    assert isinstance(seen[0], AbortSignal)
    assert not seen[0].aborted


async def test_step_timeout_aborts_the_steps_signal_then_fails_the_step(clock: FrozenClock) -> None:
    seen: list[AbortSignal] = []
    cancelled = asyncio.Event()

    async def hang(signal: AbortSignal) -> None:
        seen.append(signal)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    running = asyncio.ensure_future(make_step(Storage(), clock, step_timeout=10).run("hang", hang))
    while not seen:
        await asyncio.sleep(0)
    clock.advance(9)
    await asyncio.sleep(0)
    assert not running.done()  # the ceiling runs on the job's clock, not the wall's
    clock.advance(1)
    with pytest.raises(JobTimeoutError) as caught:
        await asyncio.wait_for(running, 5)
    assert caught.value.code == "X_JOB_TIMEOUT"
    assert seen[0].aborted
    await asyncio.wait_for(cancelled.wait(), 5)  # the step's own work is stopped too


async def test_a_step_cancelled_with_its_body_stops_its_own_work(clock: FrozenClock) -> None:
    """A drain or a deadline cancels the body: a step under a ceiling must not run on after."""
    started, stopped = asyncio.Event(), asyncio.Event()

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise

    body = asyncio.ensure_future(make_step(Storage(), clock, step_timeout=60).run("slow", slow))
    await started.wait()
    body.cancel()
    with pytest.raises(asyncio.CancelledError):
        await body
    await asyncio.wait_for(stopped.wait(), 5)


async def test_a_run_of_many_steps_leaves_no_listener_behind(clock: FrozenClock) -> None:
    controller = AbortController()
    step = make_step(Storage(), clock, signal=controller.signal)
    for n in range(50):
        await step.run(f"step-{n}", lambda: None)
    assert controller.signal._listeners == []


async def test_a_write_after_the_attempt_was_aborted_is_x_aborted(clock: FrozenClock) -> None:
    controller, storage = AbortController(), Storage()
    step = make_step(storage, clock, signal=controller.signal)

    async def slow() -> str:
        controller.abort(JobTimeoutError("deadline"))
        return "late"

    with pytest.raises(JobAbortedError) as caught:
        await step.run("late", slow)
    assert caught.value.code == "X_ABORTED"
    assert storage.records == {}


async def test_a_step_begun_after_the_attempt_was_aborted_is_x_aborted(clock: FrozenClock) -> None:
    """Whatever aborted the attempt (here its deadline), a step past the abort is refused with
    X_ABORTED and its function never runs."""
    controller, storage, calls = AbortController(), Storage(), []
    step = make_step(storage, clock, signal=controller.signal)
    controller.abort(JobTimeoutError("deadline"))
    with pytest.raises(JobAbortedError) as caught:
        await step.run("after", lambda: calls.append(1))
    assert caught.value.code == "X_ABORTED"
    assert (calls, storage.records) == ([], {})


async def test_a_write_the_claim_no_longer_holds_is_refused(clock: FrozenClock) -> None:
    from ultimat3.jobs.core import LeaseLostError

    storage = Storage()
    storage.claim_held = False
    with pytest.raises(LeaseLostError):
        await make_step(storage, clock).run("x", lambda: 1)


async def test_sleep_suspends_until_the_wake_time_then_replays(clock: FrozenClock) -> None:
    storage = Storage()
    with pytest.raises(StepSuspension) as caught:
        await make_step(storage, clock).sleep("3d")
    assert caught.value.resume_at == clock.now() + timedelta(days=3)
    clock.advance(timedelta(days=1))
    with pytest.raises(StepSuspension) as again:
        await make_step(storage, clock).sleep("3d")
    assert again.value.resume_at == caught.value.resume_at
    clock.advance(timedelta(days=2))
    await make_step(storage, clock).sleep("3d")


async def test_sleep_takes_an_explicit_name(clock: FrozenClock) -> None:
    storage = Storage()
    with pytest.raises(StepSuspension):
        await make_step(storage, clock).sleep("cool-off", "1h")
    assert "cool-off" in storage.records


async def test_suspension_is_not_an_exception_a_body_can_swallow(clock: FrozenClock) -> None:
    step = make_step(Storage(), clock)

    async def body_with_broad_handler() -> str:
        try:
            await step.sleep("1h")
        except Exception:
            return "swallowed"
        return "slept"

    with pytest.raises(StepSuspension):
        await body_with_broad_handler()


async def test_wait_for_event_suspends_then_answers_the_matching_payload(
    clock: FrozenClock,
) -> None:
    storage, bus = Storage(), memory_event_bus(clock)
    await bus.publish("order.paid", {"order": "o-1"})
    with pytest.raises(StepSuspension) as caught:
        await make_step(storage, clock, events=bus).wait_for_event(
            "paid", "order.paid", match={"order": "o-2"}, timeout="1h"
        )
    assert caught.value.resume_at == clock.now() + timedelta(seconds=30)
    clock.advance(5)
    await bus.publish("order.paid", {"order": "o-2", "amount": 10})
    answer = await make_step(storage, clock, events=bus).wait_for_event(
        "paid", "order.paid", match={"order": "o-2"}, timeout="1h"
    )
    assert answer == {"order": "o-2", "amount": 10}


async def test_an_event_published_before_the_wait_began_does_not_match(clock: FrozenClock) -> None:
    bus = memory_event_bus(clock)
    await bus.publish("order.paid", {"order": "o-3"})
    clock.advance(1)
    with pytest.raises(StepSuspension):
        await make_step(Storage(), clock, events=bus).wait_for_event(
            "paid", "order.paid", match={"order": "o-3"}
        )


async def test_wait_for_event_times_out_to_none_or_x_job_timeout_when_required(
    clock: FrozenClock,
) -> None:
    storage, bus = Storage(), memory_event_bus(clock)
    for name, required in (("optional", False), ("required", True)):
        with pytest.raises(StepSuspension):
            await make_step(storage, clock, events=bus).wait_for_event(
                name, "never", timeout="1m", required=required
            )
    clock.advance(61)
    assert await make_step(storage, clock, events=bus).wait_for_event("optional", "never") is None
    with pytest.raises(JobTimeoutError):
        await make_step(storage, clock, events=bus).wait_for_event(
            "required", "never", required=True
        )


@pytest.mark.parametrize(
    ("published_after_s", "answer"),
    [(60, {"order": "o-1"}), (61, None)],
    ids=["published-by-the-deadline", "published-after-it"],
)
async def test_a_wait_resumed_long_after_its_deadline_answers_as_it_would_have_on_time(
    clock: FrozenClock, published_after_s: int, answer: Any
) -> None:
    """A run that resumes late (its workers were down) takes an event published by the
    deadline, and times out on one published after it, whenever it looks."""
    storage, bus = Storage(), memory_event_bus(clock)
    with pytest.raises(StepSuspension):
        await make_step(storage, clock, events=bus).wait_for_event(
            "paid", "order.paid", timeout="1m"
        )
    clock.advance(published_after_s)
    await bus.publish("order.paid", {"order": "o-1"})
    clock.advance(3600)
    step = make_step(storage, clock, events=bus)
    assert await step.wait_for_event("paid", "order.paid") == answer
    timed_out = storage.records["paid"].output == {"timed_out": True}
    assert timed_out is (answer is None)


async def test_a_wait_parks_no_longer_than_its_deadline(clock: FrozenClock) -> None:
    with pytest.raises(StepSuspension) as caught:
        await make_step(Storage(), clock).wait_for_event("w", "e", timeout="10s")
    assert caught.value.resume_at == clock.now() + timedelta(seconds=10)


async def test_the_timeout_is_declared_on_the_bus_clock_not_the_workers(clock: FrozenClock) -> None:
    """A worker running an hour ahead of the bus must not give up early."""
    bus_clock = FrozenClock(clock.now())
    bus, storage = memory_event_bus(bus_clock), Storage()
    with pytest.raises(StepSuspension):
        await make_step(storage, clock, events=bus).wait_for_event("w", "e", timeout="10m")
    clock.advance(timedelta(hours=1))
    bus_clock.advance(60)
    await bus.publish("e", {"ok": True})
    assert await make_step(storage, clock, events=bus).wait_for_event("w", "e") == {"ok": True}


async def test_steps_run_side_by_side_are_numbered_in_the_order_they_started(
    clock: FrozenClock,
) -> None:
    """``from_step`` drops a step and every step that started after it: the number is taken when
    a step starts, not when it finishes."""
    storage, slow_may_finish = Storage(), asyncio.Event()

    async def slow() -> str:
        await slow_may_finish.wait()
        return "slow"

    async def fast() -> str:
        slow_may_finish.set()
        return "fast"

    step = make_step(storage, clock)
    assert await asyncio.gather(step.run("slow", slow), step.run("fast", fast)) == ["slow", "fast"]
    assert {name: record.seq for name, record in storage.records.items()} == {"slow": 0, "fast": 1}


@pytest.mark.parametrize(
    "name",
    ["", "a\x00b", 7, "lone \udcff", "é" * 300],
    ids=["empty", "a NUL", "not text", "a lone surrogate", "over the bytes a name holds"],
)
async def test_a_step_name_no_store_can_hold_is_refused_before_the_step_runs(
    clock: FrozenClock, name: Any
) -> None:
    storage, calls = Storage(), []
    with pytest.raises(InvariantError) as caught:
        await make_step(storage, clock).run(name, lambda: calls.append(1))
    assert caught.value.code == "X_INVARIANT"
    assert (calls, storage.records) == ([], {})


async def take_step(step: Step, kind: StepKind, name: str, ran: list[str]) -> None:
    """One step of ``kind`` under ``name``, as a run's body takes it; a run step's function
    notes in ``ran`` that it ran. A sleep or a wait suspending is how it ends an attempt."""

    def charge() -> str:
        ran.append(name)
        return "charged"

    with contextlib.suppress(StepSuspension):
        if kind == "run":
            await step.run(name, charge)
        elif kind == "sleep":
            await step.sleep(name, "1h")
        else:
            await step.wait_for_event(name, "order.paid")


@pytest.mark.parametrize(
    ("stored", "met_by"),
    [("run", "sleep"), ("run", "wait"), ("sleep", "run"), ("wait", "run"), ("sleep", "wait")],
)
async def test_a_name_another_kind_of_step_stored_is_x_step_duplicate_before_the_step_runs(
    clock: FrozenClock, stored: StepKind, met_by: StepKind
) -> None:
    """The run's code changed between attempts and reused a name for another kind of step."""
    storage, ran = Storage(), []
    await take_step(make_step(storage, clock), stored, "x", ran)
    record, ran_before = storage.records["x"], list(ran)
    with pytest.raises(StepDuplicateError) as caught:
        await take_step(make_step(storage, clock), met_by, "x", ran)
    assert caught.value.code == "X_STEP_DUPLICATE"
    assert f"{stored!r} step" in caught.value.message
    assert f"{met_by!r} step" in caught.value.message
    assert (ran, storage.records) == (ran_before, {"x": record})


async def test_every_kind_of_step_stores_its_kind(clock: FrozenClock) -> None:
    storage = Storage()
    for kind in STEP_KINDS:
        await take_step(make_step(storage, clock), kind, kind, [])
    assert {name: record.kind for name, record in storage.records.items()} == {
        "run": "run",
        "sleep": "sleep",
        "wait": "wait",
    }


async def test_a_step_stored_before_steps_carried_their_kind_replays_for_any_kind(
    clock: FrozenClock,
) -> None:
    """A run in flight across the upgrade keeps replaying the records it already has."""
    storage, ran = Storage(), []
    past = (clock.now() - timedelta(minutes=1)).isoformat()
    for record in (
        StepRecord("charge", 0, "charged"),
        StepRecord("cool-off", 1, {"until": past}),
        StepRecord("paid", 2, {"event_id": "e-1", "payload": {"order": "o-1"}}),
    ):
        storage.records[record.name] = record
    step = make_step(storage, clock)
    assert await step.run("charge", lambda: ran.append("charge")) == "charged"
    await step.sleep("cool-off", "1h")
    assert await step.wait_for_event("paid", "order.paid") == {"order": "o-1"}
    assert ran == []
    assert step.trace == [("charge", "replayed"), ("cool-off", "replayed"), ("paid", "replayed")]
