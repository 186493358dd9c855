"""Prometheus series, when ``prometheus_client`` is importable; silent no-ops otherwise.

==================================  =======  =====================================================
series                              kind     answers
==================================  =======  =====================================================
``queue_depth{queue}``              gauge    how much work waits (ready + delayed + suspended)
``jobs_total{queue,outcome}``       counter  is any of it succeeding (``ok``, ``failed``, ``dead``)
``queue_oldest_ready_seconds``      gauge    how long the oldest due row of a queue has waited
``queue_dead_jobs{queue}``          gauge    the dead-letter queue's size (a counter's rate is
                                             flat on a queue that filled overnight)
``job_leases_lost_total{queue}``    counter  a job this worker still ran was presumed dead —
                                             at-least-once turning into twice; alert on any rate
==================================  =======  =====================================================

The worker counts ``jobs_total`` and ``job_leases_lost_total`` as runs end. The three gauges are a
read of ``driver.stats(include_done=False)``: call ``observe_queues(driver)`` where you serve
``/metrics`` (or on a timer) — the worker does not, because one stats read per pod per scrape
interval is the caller's budget to spend.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from .context import JobOutcome
from .model import QueueStats
from .protocol import JobDriver

__all__ = ["JobMetrics", "job_metrics", "jobs_total_outcome", "observe_queues"]

_OUTCOME_LABEL: dict[str, str] = {
    "completed": "ok",
    "retried": "failed",
    "dead-lettered": "dead",
    "dropped": "failed",
    "refused": "failed",
}


def jobs_total_outcome(outcome: JobOutcome) -> str | None:
    """The ``jobs_total`` label of an attempt's outcome; None for one handed back uncounted (a
    suspension, a drain) or one whose settle did not land."""
    return _OUTCOME_LABEL.get(outcome)


class _Noop:
    def labels(self, *_: str) -> _Noop:
        return self

    def inc(self, amount: float = 1) -> None:
        return None

    def set(self, value: float) -> None:
        return None


class JobMetrics:
    """The five series, registered once on ``registry`` (the default one unless given)."""

    def __init__(self, registry: Any = None) -> None:
        try:
            import prometheus_client as prom
        except ImportError:  # pragma: no cover - exercised only without the package
            noop = _Noop()
            self.enabled = False
            self.jobs_total: Any = noop
            self.leases_lost: Any = noop
            self.depth: Any = noop
            self.oldest_ready: Any = noop
            self.dead: Any = noop
        else:
            where = {"registry": registry} if registry is not None else {}
            self.enabled = True
            self.jobs_total = prom.Counter(
                "jobs", "Attempts that ended, by outcome", ["queue", "outcome"], **where
            )
            self.leases_lost = prom.Counter(
                "job_leases_lost",
                "Jobs whose lease lapsed while this worker still ran them",
                ["queue"],
                **where,
            )
            self.depth = prom.Gauge("queue_depth", "Rows waiting to run", ["queue"], **where)
            self.oldest_ready = prom.Gauge(
                "queue_oldest_ready_seconds",
                "Age of the oldest due row still waiting",
                ["queue"],
                **where,
            )
            self.dead = prom.Gauge(
                "queue_dead_jobs", "Rows in the dead-letter queue", ["queue"], **where
            )
        self._settled: dict[tuple[str, str], Any] = {}
        self._listed: dict[object, set[str]] = {}
        """Per source (a driver), the queues its last read listed: one its next read no longer
        lists holds no row there any more."""

    def settled(self, queue: str, outcome: JobOutcome, count: int = 1) -> None:
        """``count`` attempts of ``queue`` ended with ``outcome``."""
        label = jobs_total_outcome(outcome)
        if label is None:
            return
        child = self._settled.get((queue, label))
        if child is None:
            child = self._settled[(queue, label)] = self.jobs_total.labels(queue, label)
        child.inc(count)

    def lease_lost(self, queue: str) -> None:
        self.leases_lost.labels(queue).inc()

    def observe(self, stats: Iterable[QueueStats], now: datetime, *, source: object = None) -> None:
        """Set the queue gauges from one stats read of ``source``. A queue the source's last read
        listed and this one does not (emptied by an operator or by retention) reads 0, unless
        another source lists it: its last values would otherwise stay, and an alert on the oldest
        ready row would keep firing for a queue with nothing in it."""
        listed: set[str] = set()
        for queue in stats:
            listed.add(queue.queue)
            self.depth.labels(queue.queue).set(queue.depth)
            self.dead.labels(queue.queue).set(queue.dead)
            age = 0.0
            if queue.oldest_ready_at is not None:
                age = max(0.0, (now - queue.oldest_ready_at).total_seconds())
            self.oldest_ready.labels(queue.queue).set(age)
        before = self._listed.get(source, set())
        self._listed[source] = listed
        elsewhere = set().union(*(q for s, q in self._listed.items() if s is not source))
        for emptied in before - listed - elsewhere:
            for gauge in (self.depth, self.dead, self.oldest_ready):
                gauge.labels(emptied).set(0)


_default: JobMetrics | None = None


def job_metrics() -> JobMetrics:
    """The process's series on the default registry, created on first use."""
    global _default
    if _default is None:
        _default = JobMetrics()
    return _default


async def observe_queues(driver: JobDriver, metrics: JobMetrics | None = None) -> None:
    """Refresh the queue gauges from one ``driver.stats(include_done=False)`` read: no gauge
    needs the done rows, and on Postgres leaving them out keeps a scrape from reading them all."""
    stats = await driver.stats(include_done=False)
    (metrics or job_metrics()).observe(stats, driver.clock.now(), source=driver)
