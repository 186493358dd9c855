"""The scheduler's defaults: watermarks in one heap, and a leader that never asks anybody.

Both fail silently in a real deployment, so each says so when it is built: with no durable
watermark a redeployed scheduler arms to now and never sees the occurrence the pod it replaced
dropped (``catch_up`` becomes inert), and with no election a rolling update runs two leaders that
fire every occurrence twice. Pass ``postgres_scheduler_state(...)`` and
``postgres_lease_leader(...)`` (``ultimat3.jobs.pg``) anywhere but a single dev process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..logs import log_event
from ..model import Enqueued, EnqueueRequest
from ..protocol import JobDriver

__all__ = ["AlwaysLeader", "MemorySchedulerState", "always_leader", "memory_scheduler_state"]


class MemorySchedulerState:
    """Per-task watermarks in this process's heap; a fire enqueues through ``driver``.

    It keeps no fire record of its own (``records_fires`` is False), so the scheduler writes each
    fire through ``driver.introspect.record_task_fire``.
    """

    records_fires = False

    def __init__(self, driver: JobDriver) -> None:
        self._driver = driver
        self._marks: dict[str, int] = {}
        log_event(
            logging.WARNING,
            "jobs.scheduler.state-volatile",
            fix="watermarks live in this process only, so a restart forgets what it missed; "
            "pass state=postgres_scheduler_state(executor) from ultimat3.jobs.pg",
        )

    async def watermarks(self, tasks: Sequence[str]) -> dict[str, int]:
        return {task: self._marks[task] for task in tasks if task in self._marks}

    async def arm(self, task: str, occurrence_ms: int) -> None:
        held = self._marks.get(task)
        if held is None or occurrence_ms > held:
            self._marks[task] = occurrence_ms

    async def fire(
        self,
        task: str,
        occurrence_ms: int,
        requests: Sequence[EnqueueRequest],
        *,
        previous: int | None,
        fired_ms: int | None = None,
    ) -> list[Enqueued] | None:
        if self._marks.get(task) != previous:
            return None
        self._marks[task] = occurrence_ms
        try:
            return await self._driver.enqueue_many(requests)
        except BaseException:
            if self._marks.get(task) == occurrence_ms:
                self._restore(task, previous)
            raise

    def _restore(self, task: str, previous: int | None) -> None:
        if previous is None:
            del self._marks[task]
        else:
            self._marks[task] = previous


class AlwaysLeader:
    """Answers yes to everyone: right for one process, two leaders in a rolling update."""

    def __init__(self) -> None:
        log_event(
            logging.WARNING,
            "jobs.scheduler.leader-unelected",
            fix="every scheduler process leads, so two of them fire every occurrence twice; "
            "pass leader=postgres_lease_leader(executor=...) from ultimat3.jobs.pg",
        )

    async def acquire(self) -> bool:
        return True

    async def release(self) -> None:
        return None


def memory_scheduler_state(driver: JobDriver) -> MemorySchedulerState:
    return MemorySchedulerState(driver)


def always_leader() -> AlwaysLeader:
    return AlwaysLeader()
