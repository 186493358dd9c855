"""The worker registry: live workers, each expiring ``ttl`` after its last record."""

from __future__ import annotations

from ultimat3.jobs.core.constants import MAX_WORKER_IN_FLIGHT
from ultimat3.jobs.core.model import WorkerInfo

from .target import Conformance

__all__ = ["WorkerRules"]


def _info(jobs: Conformance, worker_id: str, in_flight: tuple[str, ...] = ()) -> WorkerInfo:
    return WorkerInfo(
        id=worker_id,
        host="host-1",
        started_at=jobs.at(-60),
        queues=("default", "mail"),
        slots={"default": 8, "mail": 2},
        in_flight=in_flight,
        last_heartbeat=jobs.now(),
    )


def _shape(info: WorkerInfo) -> tuple[object, ...]:
    """A worker record with its collections as plain lists and dicts, however stored."""
    return (
        info.id,
        info.host,
        info.started_at,
        list(info.queues),
        dict(info.slots),
        list(info.in_flight),
        info.last_heartbeat,
    )


class WorkerRules:
    async def test_a_recorded_worker_is_listed_as_recorded(self, jobs: Conformance) -> None:
        info = _info(jobs, "w-1", ("0190a000-0000-7000-8000-000000000001",))
        await jobs.introspect.record_worker(info, ttl=30)
        assert [_shape(w) for w in await jobs.introspect.workers()] == [_shape(info)]

    async def test_a_worker_lists_at_most_max_worker_in_flight_ids(self, jobs: Conformance) -> None:
        ids = tuple(f"0190a000-0000-7000-8000-{n:012d}" for n in range(MAX_WORKER_IN_FLIGHT + 50))
        await jobs.introspect.record_worker(_info(jobs, "w-1", ids), ttl=30)
        [listed] = await jobs.introspect.workers()
        assert list(listed.in_flight) == list(ids[:MAX_WORKER_IN_FLIGHT])

    async def test_workers_are_listed_by_id(self, jobs: Conformance) -> None:
        for worker_id in ("w-b", "w-c", "w-a"):
            await jobs.introspect.record_worker(_info(jobs, worker_id), ttl=30)
        assert [w.id for w in await jobs.introspect.workers()] == ["w-a", "w-b", "w-c"]

    async def test_a_worker_expires_ttl_after_its_last_record(self, jobs: Conformance) -> None:
        await jobs.introspect.record_worker(_info(jobs, "w-1"), ttl=30)
        jobs.advance(29.999)
        assert [w.id for w in await jobs.introspect.workers()] == ["w-1"]
        jobs.advance(0.001)
        assert await jobs.introspect.workers() == []

    async def test_recording_again_replaces_and_renews(self, jobs: Conformance) -> None:
        await jobs.introspect.record_worker(_info(jobs, "w-1"), ttl=30)
        jobs.advance(20)
        renewed = _info(jobs, "w-1", ("0190a000-0000-7000-8000-000000000009",))
        await jobs.introspect.record_worker(renewed, ttl=30)
        jobs.advance(20)
        assert [_shape(w) for w in await jobs.introspect.workers()] == [_shape(renewed)]

    async def test_a_removed_worker_is_gone(self, jobs: Conformance) -> None:
        await jobs.introspect.record_worker(_info(jobs, "w-1"), ttl=30)
        await jobs.introspect.record_worker(_info(jobs, "w-2"), ttl=30)
        await jobs.introspect.remove_worker("w-1")
        await jobs.introspect.remove_worker("never-recorded")
        assert [w.id for w in await jobs.introspect.workers()] == ["w-2"]
