"""The driver conformance suite: one entry, ``job_driver_conformance``, fanned out by area.

Each area is a class of tests over the ``jobs`` fixture (a ``Conformance`` harness). The entry
mixes them into one pytest test class bound to a driver author's target factory::

    TestMyDriver = job_driver_conformance(my_target)

Areas whose part the target does not offer (an operator surface, a lease store, an outbox, ...)
skip, naming the missing part.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, cast

import pytest
import pytest_asyncio

from .backfills import BackfillRules
from .bulk import BulkRules
from .burial import BurialRules
from .claim import ClaimRules
from .counters import CounterRules
from .delayed import DelayedRules
from .enqueue import EnqueueRules
from .events import EventBusRules
from .leases import LeaseRules
from .listing import ListingRules
from .nack import NackRules
from .operator import OperatorRules
from .outbox import OutboxRules
from .pauses import PauseRules
from .progress import ProgressRules
from .queues import QueueRules
from .scheduler import SchedulerRules
from .settle import SettleRules
from .stateful import StatefulRules, check_against_reference
from .stats import StatsRules
from .steps import StepRules
from .target import (
    CONFORMANCE_EPOCH,
    Conformance,
    ConformanceTarget,
    TargetFactory,
    open_conformance,
)
from .task_fires import TaskFireRules
from .workers import WorkerRules

__all__ = [
    "AREAS",
    "CONFORMANCE_EPOCH",
    "Conformance",
    "ConformanceTarget",
    "TargetFactory",
    "check_against_reference",
    "job_driver_conformance",
    "open_conformance",
]

AREAS: tuple[type, ...] = (
    EnqueueRules,
    ClaimRules,
    SettleRules,
    NackRules,
    BurialRules,
    StepRules,
    DelayedRules,
    QueueRules,
    StatsRules,
    LeaseRules,
    ListingRules,
    OperatorRules,
    BulkRules,
    PauseRules,
    WorkerRules,
    CounterRules,
    ProgressRules,
    TaskFireRules,
    BackfillRules,
    EventBusRules,
    OutboxRules,
    SchedulerRules,
    StatefulRules,
)
"""Every area of the suite, in the order a failing run is easiest to read."""

_AsyncTest = Callable[[Any, Conformance], Coroutine[Any, Any, None]]


def _asyncio_test(test: _AsyncTest) -> _AsyncTest:
    """``test`` marked for pytest-asyncio on a copy, so the suite also runs in strict mode
    without the areas' own functions collecting marks."""

    @functools.wraps(test)
    async def marked(self: Any, jobs: Conformance) -> None:
        await test(self, jobs)

    return cast(_AsyncTest, pytest.mark.asyncio(marked))


def job_driver_conformance(factory: TargetFactory, *, name: str = "JobDriverConformance") -> type:
    """A pytest test class holding the whole suite against ``factory``'s targets.

    ``factory(clock, request)`` is an async context manager yielding a ``ConformanceTarget`` over
    a fresh, empty backend whose driver runs on ``clock``. Bind the class to a ``Test*`` name in
    a test module for pytest to collect it.
    """

    async def jobs(self: Any, request: pytest.FixtureRequest) -> AsyncIterator[Conformance]:
        async with open_conformance(factory, request) as harness:
            yield harness

    namespace: dict[str, Any] = {
        "jobs": pytest_asyncio.fixture(jobs),
        "_target_factory": staticmethod(factory),
        "__doc__": f"The ultimat3-jobs driver conformance suite against {factory.__name__}.",
    }
    for area in AREAS:
        for attribute, value in vars(area).items():
            if attribute.startswith("test_") and inspect.iscoroutinefunction(value):
                namespace[attribute] = _asyncio_test(value)
    return type(name, AREAS, namespace)
