"""Scheduler state and leadership: watermarks that move with their jobs, and one leader."""

from __future__ import annotations

from ultimat3.jobs.core import Enqueued
from ultimat3.jobs.core.model import TaskFire

from .target import Conformance

__all__ = ["SchedulerRules"]

_HOUR_MS = 3_600_000


class SchedulerRules:
    async def test_a_task_never_armed_has_no_watermark(self, jobs: Conformance) -> None:
        assert await jobs.scheduler_state.watermarks(["nightly"]) == {}

    async def test_arm_sets_the_watermark_without_firing(self, jobs: Conformance) -> None:
        state = jobs.scheduler_state
        await state.arm("nightly", 5 * _HOUR_MS)
        assert await state.watermarks(["nightly", "other"]) == {"nightly": 5 * _HOUR_MS}
        assert await jobs.driver.stats() == []

    async def test_arm_moves_the_watermark_forward(self, jobs: Conformance) -> None:
        state = jobs.scheduler_state
        await state.arm("nightly", _HOUR_MS)
        await state.arm("nightly", 3 * _HOUR_MS)
        assert await state.watermarks(["nightly"]) == {"nightly": 3 * _HOUR_MS}

    async def test_a_first_fire_enqueues_and_sets_the_watermark(self, jobs: Conformance) -> None:
        state = jobs.scheduler_state
        requests = [jobs.request(), jobs.request(queue="other")]
        fired = await state.fire("nightly", _HOUR_MS, requests, previous=None)
        assert fired == [Enqueued(r.id, r.run_id) for r in requests]
        assert await state.watermarks(["nightly"]) == {"nightly": _HOUR_MS}
        assert set(await jobs.stats()) == {"q", "other"}

    async def test_a_fire_from_the_watermark_moves_it(self, jobs: Conformance) -> None:
        state = jobs.scheduler_state
        await state.arm("nightly", _HOUR_MS)
        fired = await state.fire("nightly", 2 * _HOUR_MS, [jobs.request()], previous=_HOUR_MS)
        assert fired is not None
        assert len(fired) == 1
        assert await state.watermarks(["nightly"]) == {"nightly": 2 * _HOUR_MS}

    async def test_a_fire_from_a_stale_watermark_does_nothing(self, jobs: Conformance) -> None:
        state = jobs.scheduler_state
        await state.arm("nightly", 2 * _HOUR_MS)
        stale = await state.fire("nightly", 3 * _HOUR_MS, [jobs.request()], previous=_HOUR_MS)
        assert stale is None
        assert await state.watermarks(["nightly"]) == {"nightly": 2 * _HOUR_MS}
        assert await jobs.driver.stats() == []

    async def test_a_state_records_each_fire_it_makes_when_it_says_it_does(
        self, jobs: Conformance
    ) -> None:
        """In the operation that fires: a crash between the two must not leave a fire the
        operator surface never heard of. A refused fire records nothing; a state that says it
        keeps no record (``records_fires`` False) leaves them all to the scheduler."""
        state = jobs.scheduler_state
        await state.arm("nightly", _HOUR_MS)
        assert await state.fire(
            "nightly", 3 * _HOUR_MS, [jobs.request()], previous=_HOUR_MS, fired_ms=2 * _HOUR_MS
        )
        recorded = [TaskFire("nightly", 2 * _HOUR_MS, jobs.now())] if state.records_fires else []
        assert await jobs.introspect.task_fires() == recorded
        jobs.advance(60)
        assert (
            await state.fire("nightly", 4 * _HOUR_MS, [jobs.request()], previous=_HOUR_MS) is None
        )
        assert await jobs.introspect.task_fires() == recorded

    async def test_a_second_first_fire_does_nothing(self, jobs: Conformance) -> None:
        state = jobs.scheduler_state
        assert await state.fire("nightly", _HOUR_MS, [jobs.request()], previous=None)
        assert await state.fire("nightly", _HOUR_MS, [jobs.request()], previous=None) is None
        assert (await jobs.queue_stats()).ready == 1

    async def test_a_fire_dedupes_like_an_enqueue(self, jobs: Conformance) -> None:
        held = await jobs.enqueue(key="k")
        fired = await jobs.scheduler_state.fire(
            "nightly", _HOUR_MS, [jobs.request(key="k")], previous=None
        )
        assert fired == [Enqueued(held.id, held.run_id, deduped=True)]

    async def test_watermarks_are_per_task(self, jobs: Conformance) -> None:
        state = jobs.scheduler_state
        await state.arm("a", _HOUR_MS)
        assert await state.fire("b", 2 * _HOUR_MS, [], previous=None) == []
        assert await state.watermarks(["a", "b"]) == {"a": _HOUR_MS, "b": 2 * _HOUR_MS}

    async def test_one_leader_at_a_time(self, jobs: Conformance) -> None:
        first, second = jobs.new_leader(), jobs.new_leader()
        assert await first.acquire()
        assert not await second.acquire()
        assert await first.acquire()

    async def test_a_released_leadership_passes_on(self, jobs: Conformance) -> None:
        first, second = jobs.new_leader(), jobs.new_leader()
        assert await first.acquire()
        await first.release()
        assert await second.acquire()
        assert not await first.acquire()

    async def test_a_silent_leaders_lease_lapses(self, jobs: Conformance) -> None:
        first, second = jobs.new_leader(), jobs.new_leader()
        ttl = jobs.leader_ttl
        assert await first.acquire()
        jobs.advance(ttl * 0.9)
        assert await first.acquire()
        jobs.advance(ttl * 0.9)
        assert not await second.acquire()
        jobs.advance(ttl * 0.1)
        assert await second.acquire()
        assert not await first.acquire()
