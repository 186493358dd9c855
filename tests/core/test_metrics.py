"""Prometheus series: counted as runs end, gauges read from the driver's stats."""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.eventually import until
from support.jobs import Item

from ultimat3.jobs.core import (
    EnqueueRequest,
    FrozenClock,
    JobMetrics,
    Retry,
    job,
    job_metrics,
    job_worker,
    memory_job_driver,
    new_id,
    observe_queues,
)
from ultimat3.jobs.core.memory import MemoryJobDriver
from ultimat3.jobs.core.metrics import jobs_total_outcome


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.mark.parametrize(
    ("outcome", "label"),
    [
        ("completed", "ok"),
        ("retried", "failed"),
        ("dead-lettered", "dead"),
        ("dropped", "failed"),
        ("refused", "failed"),
        ("suspended", None),
        ("interrupted", None),
        ("lease-lost", None),
    ],
)
def test_each_outcome_counts_under_its_jobs_total_label_or_not_at_all(
    outcome: Any, label: str | None
) -> None:
    assert jobs_total_outcome(outcome) == label


async def test_the_worker_counts_jobs_total_per_queue_and_outcome(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    registry = CollectorRegistry()

    @job(
        input=Item,
        idempotency_key=lambda i: f"metered:{i.n}",
        tenant="none",
        queue="metered",
        retry=Retry(attempts=1),
    )
    async def metered(*, input: Item, step: Any) -> None:
        if input.n == 1:
            raise RuntimeError("boom")
        if input.n == 2:
            await step.sleep("later", 3600)

    worker = job_worker(
        driver=driver,
        context=lambda: None,
        jobs=[metered],
        clock=clock,
        metrics=JobMetrics(registry=registry),
    )
    async with worker:
        for n in range(3):
            await metered.enqueue(Item(n))
        await until(
            lambda: worker.stats.completed + worker.stats.dead + worker.stats.suspended == 3
        )
    assert sample(registry, "jobs_total", queue="metered", outcome="ok") == 1
    assert sample(registry, "jobs_total", queue="metered", outcome="dead") == 1
    assert sample(registry, "jobs_total", queue="metered", outcome="failed") is None


async def test_the_queue_gauges_are_read_from_the_driver_stats(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    registry = CollectorRegistry()

    @job(input=Item, idempotency_key=lambda i: f"gauged:{i.n}", tenant="none", queue="gauged")
    async def gauged(*, input: Item) -> None:
        return None

    await gauged.enqueue(Item(1))
    clock.advance(90)
    await gauged.enqueue(Item(2))
    await gauged.enqueue(Item(3), delay=timedelta(hours=1))
    await observe_queues(driver, JobMetrics(registry=registry))
    assert sample(registry, "queue_depth", queue="gauged") == 3
    assert sample(registry, "queue_oldest_ready_seconds", queue="gauged") == 90
    assert sample(registry, "queue_dead_jobs", queue="gauged") == 0


async def test_a_queue_emptied_since_the_last_read_reads_zero(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    """An operator removed every row: stats() no longer lists the queue, and its gauges must not
    keep the last values (an oldest-ready alert would fire on for an empty queue)."""
    registry = CollectorRegistry()
    metrics = JobMetrics(registry=registry)

    @job(input=Item, idempotency_key=lambda i: f"emptied:{i.n}", tenant="none", queue="emptied")
    async def emptied(*, input: Item) -> None:
        return None

    queued = await emptied.enqueue(Item(1))
    clock.advance(600)
    await observe_queues(driver, metrics)
    assert sample(registry, "queue_oldest_ready_seconds", queue="emptied") == 600
    assert await driver.introspect.remove(queued.id)
    await observe_queues(driver, metrics)
    for gauge in ("queue_depth", "queue_oldest_ready_seconds", "queue_dead_jobs"):
        assert sample(registry, gauge, queue="emptied") == 0


async def test_a_queue_is_zeroed_only_by_the_driver_that_listed_it(clock: FrozenClock) -> None:
    """One process watching two drivers: a read of one does not empty the other's queues."""
    registry = CollectorRegistry()
    metrics = JobMetrics(registry=registry)
    billing, mail = memory_job_driver(clock=clock), memory_job_driver(clock=clock)
    await billing.enqueue(_request("billing", clock))
    await mail.enqueue(_request("mail", clock))
    await observe_queues(billing, metrics)
    await observe_queues(mail, metrics)
    await observe_queues(billing, metrics)
    assert sample(registry, "queue_depth", queue="billing") == 1
    assert sample(registry, "queue_depth", queue="mail") == 1


def _request(queue: str, clock: FrozenClock) -> EnqueueRequest:
    return EnqueueRequest(
        id=new_id(),
        run_id=new_id(),
        name="metered",
        queue=queue,
        input={},
        idempotency_key=new_id(),
        tenant_id=None,
        max_attempts=1,
        run_at=clock.now(),
    )


def test_lost_leases_count_per_queue() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics(registry=registry)
    metrics.lease_lost("payments")
    metrics.lease_lost("payments")
    assert sample(registry, "job_leases_lost_total", queue="payments") == 2


def test_the_process_series_are_created_once() -> None:
    assert job_metrics() is job_metrics()


def test_without_prometheus_client_every_series_is_a_silent_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    metrics = JobMetrics()
    assert not metrics.enabled
    metrics.settled("q", "completed")
    metrics.lease_lost("q")
    metrics.observe([], FrozenClock().now())
