"""A memory driver whose acks fail as an unreachable backend's do."""

from __future__ import annotations

from typing import Any

from ultimat3.jobs.core import AckOptions, DriverUnavailableError
from ultimat3.jobs.core.memory import MemoryJobDriver


class AckOutage:
    """``driver``, with its first ``failures`` acks raising ``X_DRIVER_UNAVAILABLE``; the clock
    moves ``step`` seconds with each of them."""

    def __init__(self, driver: MemoryJobDriver, failures: int, step: float = 0.0) -> None:
        self.inner, self.failures, self.step = driver, failures, step
        self.acks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        self.acks += 1
        if self.acks <= self.failures:
            self.inner.clock.advance(self.step)  # type: ignore[attr-defined]
            raise DriverUnavailableError("the backend did not answer")
        return await self.inner.ack(job_id, options)
