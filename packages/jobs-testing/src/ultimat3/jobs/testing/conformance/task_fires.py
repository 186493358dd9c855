"""Task fires: per task, the last occurrence that dispatched."""

from __future__ import annotations

from ultimat3.jobs.core.constants import MAX_TASK_FIRES
from ultimat3.jobs.core.model import TaskFire

from .target import Conformance

__all__ = ["TaskFireRules"]


class TaskFireRules:
    async def test_no_task_has_fired_on_an_empty_backend(self, jobs: Conformance) -> None:
        assert await jobs.introspect.task_fires() == []

    async def test_a_fire_is_recorded_with_its_time(self, jobs: Conformance) -> None:
        await jobs.introspect.record_task_fire("nightly", 1_767_225_600_000)
        assert await jobs.introspect.task_fires() == [
            TaskFire("nightly", 1_767_225_600_000, jobs.now())
        ]

    async def test_a_later_occurrence_replaces_the_fire(self, jobs: Conformance) -> None:
        await jobs.introspect.record_task_fire("hourly", 1_000)
        jobs.advance(3600)
        await jobs.introspect.record_task_fire("hourly", 3_601_000)
        assert await jobs.introspect.task_fires() == [TaskFire("hourly", 3_601_000, jobs.now())]

    async def test_an_earlier_occurrence_never_moves_the_fire_back(self, jobs: Conformance) -> None:
        await jobs.introspect.record_task_fire("hourly", 3_601_000)
        fired_at = jobs.now()
        jobs.advance(60)
        await jobs.introspect.record_task_fire("hourly", 1_000)
        assert await jobs.introspect.task_fires() == [TaskFire("hourly", 3_601_000, fired_at)]

    async def test_fires_are_listed_by_task_name(self, jobs: Conformance) -> None:
        for task in ("weekly", "daily", "hourly"):
            await jobs.introspect.record_task_fire(task, 1_000)
        assert [fire.task for fire in await jobs.introspect.task_fires()] == [
            "daily",
            "hourly",
            "weekly",
        ]

    async def test_fires_are_listed_up_to_the_bound(self, jobs: Conformance) -> None:
        names = [f"task-{n:05d}" for n in range(MAX_TASK_FIRES + 1)]
        for task in reversed(names):
            await jobs.introspect.record_task_fire(task, 1_000)
        fires = await jobs.introspect.task_fires()
        assert [fire.task for fire in fires] == names[:MAX_TASK_FIRES]
