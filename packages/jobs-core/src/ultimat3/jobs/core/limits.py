"""Per-process limits: the fast path, counted in this process's heap and nowhere else.

``LimitConfig`` caps what ONE process runs at once — per tenant, per queue, in total — and how many
runs per tenant it starts in a sliding window. It is multiplied by your replica count:
``per_tenant=2`` on twenty pods is forty concurrent runs, and the rate window lives in memory, so a
rolling restart grants every tenant a fresh allowance. Size it as a per-pod budget, never as a
partner's contractual rate. The fleet-wide cap is a job's own ``concurrency``, held in the driver's
lease store (``concurrency.py``).

A worker given a ``LimitConfig`` counts under it alone; hand several workers of one process the
same ``ProcessLimits`` to share one budget. A run over any cap is handed straight back to the queue
without burning an attempt, so one org's 50k-row import cannot starve everybody else.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from .clock import Clock
from .durations import Duration, parse_duration
from .errors import InvariantError

__all__ = ["LimitConfig", "ProcessLimits", "RateLimit"]


def _cap(value: object, field: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvariantError(f"{field} must be a whole number >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count`` runs started per ``per`` (a sliding window), per tenant."""

    count: int
    per: Duration

    def __post_init__(self) -> None:
        _cap(self.count, "rate_per_tenant.count")
        if not parse_duration(self.per, field="rate_per_tenant.per") > 0:
            raise InvariantError(f"rate_per_tenant.per must be positive, got {self.per!r}")

    @property
    def per_s(self) -> float:
        return parse_duration(self.per, field="rate_per_tenant.per")


@dataclass(frozen=True, slots=True)
class LimitConfig:
    """Caps on what this process runs at once. ``global_`` is the process-wide total (``global``
    is a Python keyword); ``per_queue`` is one number for every queue or a table per queue (a
    queue the table does not name is uncapped). A run without a tenant counts under no tenant
    cap."""

    per_tenant: int | None = None
    per_queue: int | Mapping[str, int] | None = None
    global_: int | None = None
    rate_per_tenant: RateLimit | None = None

    def __post_init__(self) -> None:
        _cap(self.per_tenant, "per_tenant")
        _cap(self.global_, "global_")
        if isinstance(self.per_queue, Mapping):
            for queue, cap in self.per_queue.items():
                _cap(cap, f"per_queue[{queue!r}]")
        else:
            _cap(self.per_queue, "per_queue")

    def queue_cap(self, queue: str) -> int | None:
        if isinstance(self.per_queue, Mapping):
            return self.per_queue.get(queue)
        return self.per_queue


class ProcessLimits:
    """The counters behind a ``LimitConfig``: three maps and a window per tenant, one heap."""

    def __init__(self, config: LimitConfig, clock: Clock) -> None:
        self.config = config
        self._clock = clock
        self._total = 0
        self._per_queue: dict[str, int] = {}
        self._per_tenant: dict[str, int] = {}
        self._starts: dict[str, deque[datetime]] = {}
        self._rotation = itertools.count()

    def room(self, free: Mapping[str, int]) -> dict[str, int]:
        """The slots worth claiming: ``free`` cut to the per-queue and global caps, so a claim
        asks for no row these caps would hand straight back. The global remainder is shared out
        from a rotating first queue, so no queue is always served last."""
        config = self.config
        room: dict[str, int] = {}
        for queue, slots in free.items():
            cap = config.queue_cap(queue)
            if cap is not None:
                slots = min(slots, cap - self._per_queue.get(queue, 0))
            if slots > 0:
                room[queue] = slots
        if config.global_ is None or not room:
            return room
        left = config.global_ - self._total
        queues = list(room)
        start = next(self._rotation) % len(queues)
        shared: dict[str, int] = {}
        for queue in queues[start:] + queues[:start]:
            take = min(room[queue], left)
            if take > 0:
                shared[queue] = take
                left -= take
        return shared

    def hold(
        self, queue: str, tenant: str | None, *, now: datetime | None = None
    ) -> datetime | None:
        """Take a place for one run, at ``now`` (default: the clock's). None when taken;
        otherwise the instant to hand the run back for (now for a full cap, the window's opening
        for a spent rate)."""
        config = self.config
        now = self._clock.now() if now is None else now
        if config.global_ is not None and self._total >= config.global_:
            return now
        cap = config.queue_cap(queue)
        if cap is not None and self._per_queue.get(queue, 0) >= cap:
            return now
        if tenant is not None:
            if config.per_tenant is not None and self._per_tenant.get(tenant, 0) >= (
                config.per_tenant
            ):
                return now
            rate = config.rate_per_tenant
            if rate is not None:
                window = timedelta(seconds=rate.per_s)
                self._forget_idle(now - window)
                starts = self._window(tenant, now - window)
                if len(starts) >= rate.count:
                    return starts[0] + window
                starts.append(now)
                self._starts[tenant] = self._starts.pop(tenant)  # the newest start goes last
            self._per_tenant[tenant] = self._per_tenant.get(tenant, 0) + 1
        self._total += 1
        self._per_queue[queue] = self._per_queue.get(queue, 0) + 1
        return None

    def release(self, queue: str, tenant: str | None, *, unstarted: datetime | None = None) -> None:
        """Give back the place ``hold`` took for a run that has ended. ``unstarted``: the run
        never started its body (handed back for a busy key, refused), and this is the ``now``
        its ``hold`` took: the start recorded then is taken back, so a tenant's rate counts the
        runs that began, and rows waiting on a busy key do not spend it."""
        self._total -= 1
        _decrement(self._per_queue, queue)
        if tenant is not None:
            _decrement(self._per_tenant, tenant)
            rate = self.config.rate_per_tenant
            if rate is not None and tenant in self._starts:
                if unstarted is not None:
                    with contextlib.suppress(ValueError):
                        self._starts[tenant].remove(unstarted)
                since = self._clock.now() - timedelta(seconds=rate.per_s)
                if not self._window(tenant, since):
                    del self._starts[tenant]

    def _forget_idle(self, since: datetime) -> None:
        """Drop the windows of tenants that started nothing after ``since``. The windows are
        kept in the order of their newest start, so the idle ones are first: a tenant seen once
        is not remembered for ever."""
        while self._starts:
            tenant, starts = next(iter(self._starts.items()))
            if starts and starts[-1] > since:
                return
            del self._starts[tenant]

    def _window(self, tenant: str, since: datetime) -> deque[datetime]:
        """The tenant's run starts after ``since``, oldest first."""
        starts = self._starts.setdefault(tenant, deque())
        while starts and starts[0] <= since:
            starts.popleft()
        return starts


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
