"""The jobs the fleet-concurrency tests share, on any driver: runs of ``Sync`` per account, held
until released, with the runs in flight per account counted."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from support.jobs import declared
from ultimat3.jobs.core import Concurrency, JobDriver, JobFilter, JobRow


@dataclass
class Sync:
    account: str
    n: int = 0


class Accounts:
    """Bodies that hold their run until released, counting runs in flight per account.
    ``linger``: seconds each run still takes once released, so runs that a broken cap let
    overlap are seen overlapping (0: none, for a frozen clock)."""

    def __init__(self, *, linger: float = 0.0) -> None:
        self.release = asyncio.Event()
        self.linger = linger
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.total_peak = 0
        self.started: list[tuple[str, int]] = []
        self.reasons: list[BaseException | None] = []

    async def run(self, *, input: Sync, ctx: Any) -> None:
        self.started.append((input.account, input.n))
        self.active[input.account] += 1
        self.peak[input.account] = max(self.peak[input.account], self.active[input.account])
        self.total_peak = max(self.total_peak, sum(self.active.values()))
        try:
            await self.release.wait()
            if self.linger:
                await asyncio.sleep(self.linger)
        except asyncio.CancelledError:
            self.reasons.append(ctx.signal.reason)
            raise
        finally:
            self.active[input.account] -= 1


def sync_job(body: Any, **options: Any) -> Any:
    return declared(body, input=Sync, key=lambda i: f"sync:{i.account}:{i.n}", **options)


def keyed(when_busy: str = "wait", limit: int = 1) -> Concurrency[Sync]:
    return Concurrency(key=lambda i: i.account, limit=limit, when_busy=when_busy)  # type: ignore[arg-type]


async def rows(driver: JobDriver) -> list[JobRow]:
    """Every row (up to 200), in idempotency-key order."""
    introspect = driver.introspect
    assert introspect is not None
    page = await introspect.list(JobFilter(limit=200))
    return sorted(page.rows, key=lambda r: r.idempotency_key)
