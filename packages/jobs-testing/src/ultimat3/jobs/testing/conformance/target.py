"""What a driver author hands the suite, and the harness every conformance test works through.

A target factory is an async context manager taking the suite's ``FrozenClock`` and the pytest
``request``; it yields a ``ConformanceTarget`` over a fresh, empty backend and tears it down
after. The suite builds the driver's clock-dependent rows on that clock, so every timing rule is
checked by advancing it, never by sleeping.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias, TypeVar

import pytest

from ultimat3.jobs.core import (
    MAX_JOB_PAGE,
    AckOptions,
    BackfillLedger,
    ClaimBatch,
    ClaimedJob,
    Enqueued,
    EnqueueRequest,
    EventBus,
    FrozenClock,
    JobDriver,
    JobFilter,
    JobIntrospection,
    JobRow,
    Leader,
    LeaseStore,
    NackOptions,
    OutboxStore,
    QueueStats,
    SchedulerState,
    job_cursor,
    new_id,
)
from ultimat3.jobs.core.model import CounterTotals, JobDetail, JsonValue

__all__ = [
    "CONFORMANCE_EPOCH",
    "Conformance",
    "ConformanceTarget",
    "TargetFactory",
    "exactly",
    "open_conformance",
]

T = TypeVar("T")

CONFORMANCE_EPOCH = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
"""Where every conformance clock starts: a whole second, so a backend that keeps milliseconds
stores every instant the suite makes exactly."""


@dataclass(frozen=True)
class ConformanceTarget:
    """A driver under test and the stores that go with it.

    ``driver`` is required; its optional parts (``introspect``, ``leases``, ``backfills``,
    ``events``) are read off it. The rest are stores a backend may offer beside its driver:

    - ``outbox``: an ``OutboxStore`` on the same clock. The suite calls ``stage`` outside any
      transaction: a store that stages only in its caller's transaction is handed in with
      each ``stage`` wrapped in a transaction of its own (as this repository's targets do);
    - ``events``: an ``EventBus``, when the bus is not ``driver.events``;
    - ``scheduler_state``: a ``SchedulerState`` whose ``fire`` enqueues onto ``driver``;
    - ``leader``: builds a new ``Leader`` contending for ONE lease on the backend each call;
      ``leader_ttl`` (seconds) lets the suite check that a silent leader's lease lapses;
    - ``reset``: empties the backend cheaply, so the stateful test can run many examples on one
      server database instead of creating one per example.

    A section whose part is missing is skipped, naming the part.
    """

    driver: JobDriver
    outbox: OutboxStore | None = None
    events: EventBus | None = None
    scheduler_state: SchedulerState | None = None
    leader: Callable[[], Leader] | None = None
    leader_ttl: float | None = None
    reset: Callable[[], Awaitable[None]] | None = None


TargetFactory: TypeAlias = Callable[
    [FrozenClock, pytest.FixtureRequest], AbstractAsyncContextManager[ConformanceTarget]
]
"""``factory(clock, request)``: an async context manager yielding a fresh, empty target."""


def exactly(value: JsonValue) -> str:
    """``value`` in a form that tells apart what ``==`` equates (``True`` and ``1``, ``1.0`` and
    ``1``, a ``Decimal`` and a float, which JSON cannot even write): two values are the same
    JSON value when these match. Key order is not part of a value; what is not JSON shows as
    its type and repr, so it matches no JSON value."""
    return json.dumps(value, sort_keys=True, default=lambda o: f"<{type(o).__name__} {o!r}>")


def _offered(part: T | None, what: str) -> T:
    """``part``, or a skip of the test naming what the target does not offer."""
    if part is None:
        pytest.skip(f"the target offers no {what}")
    return part


class Conformance:
    """One test's view of the target: the parts it offers, the clock, and terse builders.

    Every builder picks unique ids and idempotency keys unless told otherwise, so a test states
    only what its rule is about.
    """

    def __init__(self, target: ConformanceTarget, clock: FrozenClock) -> None:
        self.target = target
        self.driver = target.driver
        self.clock = clock

    # -- the optional parts: skip the test when the target does not offer them ----------------

    @property
    def introspect(self) -> JobIntrospection:
        return _offered(self.driver.introspect, "operator surface (driver.introspect is None)")

    @property
    def leases(self) -> LeaseStore:
        return _offered(self.driver.leases, "lease store (driver.leases is None)")

    @property
    def backfills(self) -> BackfillLedger:
        return _offered(self.driver.backfills, "backfill ledger (driver.backfills is None)")

    @property
    def events(self) -> EventBus:
        return _offered(
            self.target.events or self.driver.events,
            "event bus (neither ConformanceTarget.events nor driver.events)",
        )

    @property
    def outbox(self) -> OutboxStore:
        return _offered(self.target.outbox, "outbox store (ConformanceTarget.outbox)")

    @property
    def scheduler_state(self) -> SchedulerState:
        return _offered(
            self.target.scheduler_state, "scheduler state (ConformanceTarget.scheduler_state)"
        )

    def new_leader(self) -> Leader:
        return _offered(self.target.leader, "leader (ConformanceTarget.leader)")()

    @property
    def leader_ttl(self) -> float:
        return _offered(self.target.leader_ttl, "leader lease TTL (ConformanceTarget.leader_ttl)")

    # -- time ---------------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock.now()

    def at(self, seconds: float) -> datetime:
        """The instant ``seconds`` from now on the suite's clock."""
        return self.clock.now() + timedelta(seconds=seconds)

    def advance(self, seconds: float) -> datetime:
        return self.clock.advance(seconds)

    # -- building and queueing rows -----------------------------------------------------------

    def request(
        self,
        *,
        name: str = "conformance-job",
        queue: str = "q",
        key: str | None = None,
        tenant: str | None = None,
        delay: float = 0.0,
        run_at: datetime | None = None,
        max_attempts: int = 3,
        input: JsonValue = None,
        id: str | None = None,
        run_id: str | None = None,
        enqueued_by: str | None = None,
        traceparent: str | None = None,
    ) -> EnqueueRequest:
        return EnqueueRequest(
            id=id if id is not None else new_id(),
            run_id=run_id if run_id is not None else new_id(),
            name=name,
            queue=queue,
            input={"n": 1} if input is None else input,
            idempotency_key=key if key is not None else f"key-{uuid.uuid4().hex}",
            tenant_id=tenant,
            max_attempts=max_attempts,
            run_at=run_at if run_at is not None else self.at(delay),
            enqueued_by=enqueued_by,
            traceparent=traceparent,
        )

    async def enqueue(self, **fields: Any) -> Enqueued:
        return await self.driver.enqueue(self.request(**fields))

    async def claim(
        self,
        queue: str = "q",
        slots: int = 1,
        *,
        worker: str = "w1",
        visibility_timeout: float = 30.0,
        drop_exhausted: Collection[str] = (),
        queues: Mapping[str, int] | None = None,
    ) -> ClaimBatch:
        return await self.driver.claim(
            worker_id=worker,
            slots=dict(queues) if queues is not None else {queue: slots},
            visibility_timeout=visibility_timeout,
            drop_exhausted=drop_exhausted,
        )

    async def claim_one(self, queue: str = "q", **options: Any) -> ClaimedJob:
        """Claim with one slot and insist a job came back."""
        batch = await self.claim(queue, 1, **options)
        assert len(batch.jobs) == 1, f"expected one claimed job in {queue!r}, got {batch.jobs!r}"
        return batch.jobs[0]

    async def ack(self, job: ClaimedJob, duration_ms: int | None = None) -> bool:
        """Ack under ``job``'s own claim."""
        return await self.driver.ack(
            job.id, AckOptions(job.claim.worker_id, job.claim.claim, duration_ms)
        )

    async def nack(
        self,
        job: ClaimedJob,
        *,
        error: str | None = None,
        run_at: datetime | None = None,
        dead_letter: bool = False,
        fail: bool = False,
        park: bool = False,
        count_attempt: bool = True,
        duration_ms: int | None = None,
    ) -> bool:
        """Nack under ``job``'s own claim."""
        options = NackOptions(
            job.claim.worker_id,
            job.claim.claim,
            error=error,
            run_at=run_at,
            dead_letter=dead_letter,
            fail=fail,
            park=park,
            count_attempt=count_attempt,
            duration_ms=duration_ms,
        )
        return await self.driver.nack(job.id, options)

    async def claimed_ids(self, queue: str = "q", slots: int = 10, **options: Any) -> list[str]:
        return [job.id for job in (await self.claim(queue, slots, **options)).jobs]

    async def running(self, **fields: Any) -> ClaimedJob:
        """Queue one row in its own queue and claim it: a job held under a fresh claim."""
        queue = fields.setdefault("queue", f"q-{uuid.uuid4().hex[:8]}")
        await self.enqueue(**fields)
        return await self.claim_one(queue)

    async def lapse_and_reclaim(
        self, held: ClaimedJob, *, worker: str = "w2", visibility_timeout: float = 30.0
    ) -> ClaimedJob:
        """Let ``held``'s lease lapse and have ``worker`` claim the row again."""
        self.clock.set(held.lease_until)
        again = await self.claim_one(
            held.queue, worker=worker, visibility_timeout=visibility_timeout
        )
        assert again.id == held.id
        return again

    # -- reading ------------------------------------------------------------------------------

    async def stats(self) -> dict[str, QueueStats]:
        return {entry.queue: entry for entry in await self.driver.stats()}

    async def queue_stats(self, queue: str = "q") -> QueueStats:
        return (await self.stats()).get(queue) or QueueStats(queue=queue)

    async def row(self, job_id: str) -> JobRow:
        """The operator's view of one row (skips without an operator surface)."""
        detail = await self.introspect.get(job_id)
        assert detail is not None, f"job {job_id} is gone"
        return detail.row

    async def detail(self, job_id: str) -> JobDetail:
        detail = await self.introspect.get(job_id)
        assert detail is not None, f"job {job_id} is gone"
        return detail

    async def totals(self) -> dict[str, CounterTotals]:
        since = self.now() - timedelta(days=60)
        return {t.name: t for t in await self.introspect.counter_totals(since=since)}

    async def all_rows(self) -> list[JobRow]:
        """Every row, newest first, paging with cursors."""
        rows: list[JobRow] = []
        after: str | None = None
        while True:
            page = await self.introspect.list(JobFilter(limit=MAX_JOB_PAGE, after=after))
            rows.extend(page.rows)
            if page.last:
                return rows
            after = job_cursor(page.rows[-1])

    async def snapshot(self, job_id: str | None = None) -> object:
        """Everything observable about the backend (one row in detail when named): what a write
        that must change nothing is checked against."""
        seen: dict[str, object] = {"stats": sorted(await self.driver.stats(), key=_queue_of)}
        introspect = self.driver.introspect
        if introspect is not None:
            if job_id is not None:
                seen["row"] = await introspect.get(job_id)
            seen["counters"] = await introspect.counter_totals(
                since=self.now() - timedelta(days=60)
            )
        return seen


def _queue_of(stats: QueueStats) -> str:
    return stats.queue


@asynccontextmanager
async def open_conformance(
    factory: TargetFactory,
    request: pytest.FixtureRequest,
    *,
    clock: FrozenClock | None = None,
) -> AsyncIterator[Conformance]:
    """The harness over a fresh target built by ``factory`` on a frozen clock."""
    clock = clock or FrozenClock(CONFORMANCE_EPOCH)
    async with factory(clock, request) as target:
        if target.driver.clock.now() != clock.now():
            raise AssertionError(
                "the target's driver does not run on the clock the suite handed its factory; "
                "build it with clock=clock so the suite can move time"
            )
        yield Conformance(target, clock)
