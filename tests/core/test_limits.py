"""Per-process limits: caps per tenant, per queue and in total, and a rate per tenant."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from support.eventually import run_clock, settle, until
from support.jobs import declared

from ultimat3.jobs.core import (
    Concurrency,
    FrozenClock,
    InvariantError,
    JobFilter,
    JobState,
    LimitConfig,
    ProcessLimits,
    RateLimit,
    Retry,
    job,
    job_worker,
    memory_job_driver,
)
from ultimat3.jobs.core.memory import MemoryJobDriver


@dataclass
class Task:
    org: str
    n: int


class Held:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.total_peak = 0
        self.started: list[tuple[str, int]] = []

    async def run(self, *, input: Task) -> None:
        self.started.append((input.org, input.n))
        self.active[input.org] += 1
        self.peak[input.org] = max(self.peak[input.org], self.active[input.org])
        self.total_peak = max(self.total_peak, sum(self.active.values()))
        try:
            await self.release.wait()
        finally:
            self.active[input.org] -= 1


def tenant_job(body: Any, **options: Any) -> Any:
    """A job of ``Task`` run for the input's org, with two attempts."""
    options = {"tenant": lambda i: i.org, "retry": Retry(attempts=2, jitter=False), **options}
    return declared(body, input=Task, key=lambda i: f"task:{i.org}:{i.n}", **options)


# -- the configuration --------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["per_tenant", "per_queue", "global_"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_cap_that_is_not_a_whole_positive_number_is_refused(field: str, bad: Any) -> None:
    with pytest.raises(InvariantError):
        LimitConfig(**{field: bad})


def test_a_per_queue_table_is_checked_entry_by_entry() -> None:
    with pytest.raises(InvariantError):
        LimitConfig(per_queue={"mail": 2, "reports": 0})


@pytest.mark.parametrize(("count", "per"), [(0, 1), (2, 0), (2, "-1s"), (2, "soon")])
def test_a_rate_that_cannot_be_honoured_is_refused(count: int, per: Any) -> None:
    with pytest.raises(InvariantError):
        RateLimit(count, per)


# -- the counters -------------------------------------------------------------------------------


def test_a_tenant_at_its_cap_is_handed_back_and_other_tenants_are_not(clock: FrozenClock) -> None:
    limits = ProcessLimits(LimitConfig(per_tenant=2), clock)
    assert limits.hold("q", "acme") is None
    assert limits.hold("q", "acme") is None
    assert limits.hold("q", "acme") == clock.now()
    assert limits.hold("q", "globex") is None
    limits.release("q", "acme")
    assert limits.hold("q", "acme") is None


def test_a_run_without_a_tenant_counts_under_no_tenant_cap(clock: FrozenClock) -> None:
    limits = ProcessLimits(LimitConfig(per_tenant=1), clock)
    assert [limits.hold("q", None) for _ in range(3)] == [None, None, None]


def test_a_queue_at_its_cap_is_handed_back(clock: FrozenClock) -> None:
    limits = ProcessLimits(LimitConfig(per_queue={"mail": 1}), clock)
    assert limits.hold("mail", None) is None
    assert limits.hold("mail", None) == clock.now()
    assert limits.hold("reports", None) is None  # a queue the table does not name is uncapped


def test_the_global_cap_counts_every_queue(clock: FrozenClock) -> None:
    limits = ProcessLimits(LimitConfig(global_=2), clock)
    assert limits.hold("a", None) is None
    assert limits.hold("b", None) is None
    assert limits.hold("c", None) == clock.now()


def test_a_spent_rate_hands_back_until_the_window_opens(clock: FrozenClock) -> None:
    limits = ProcessLimits(LimitConfig(rate_per_tenant=RateLimit(2, "10s")), clock)
    first = clock.now()
    assert limits.hold("q", "acme") is None
    clock.advance(4)
    assert limits.hold("q", "acme") is None
    clock.advance(1)
    assert limits.hold("q", "acme") == first + timedelta(seconds=10)
    assert limits.hold("q", "globex") is None
    clock.advance(5)
    assert limits.hold("q", "acme") is None  # the first start left the window


def test_a_run_that_never_started_gives_its_start_back_to_the_rate(clock: FrozenClock) -> None:
    limits = ProcessLimits(LimitConfig(rate_per_tenant=RateLimit(1, "1m")), clock)
    at = clock.now()
    assert limits.hold("q", "acme", now=at) is None
    limits.release("q", "acme", unstarted=at)  # handed back: its body never ran
    assert limits.hold("q", "acme") is None
    limits.release("q", "acme")  # this one ran: its start stays in the window
    assert limits.hold("q", "acme") is not None


async def test_rows_waiting_on_a_busy_key_do_not_spend_their_tenants_rate(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    held = Held()
    handle = tenant_job(
        held.run, concurrency=Concurrency(key=lambda i: i.org, limit=1, when_busy="wait")
    )
    ran: list[int] = []

    async def other(*, input: Task) -> None:
        ran.append(input.n)

    free = tenant_job(other, name="limits-rate-free")
    async with job_worker(
        driver=driver,
        context=lambda: None,
        jobs=[handle, free],
        limits=LimitConfig(rate_per_tenant=RateLimit(5, "1h")),
        clock=clock,
    ):
        try:
            for n in range(3):
                await handle.enqueue(Task("acme", n))
            await until(lambda: held.started == [("acme", 0)])
            await run_clock(clock, 30)  # the two rows behind the key are handed back, repeatedly
            await free.enqueue(Task("acme", 9))
            await run_clock(clock, 1)
            await until(lambda: ran == [9])
        finally:
            held.release.set()


def test_a_claim_asks_for_no_more_than_the_queue_and_global_caps_allow(
    clock: FrozenClock,
) -> None:
    limits = ProcessLimits(LimitConfig(per_queue={"a": 2}, global_=5), clock)
    assert limits.room({"a": 8, "b": 8}) == {"a": 2, "b": 3}
    limits.hold("a", None)
    limits.hold("b", None)
    room = limits.room({"a": 7, "b": 7})
    assert sum(room.values()) == 3
    assert room.get("a", 0) <= 1


def test_the_global_remainder_is_shared_from_a_rotating_first_queue(clock: FrozenClock) -> None:
    limits = ProcessLimits(LimitConfig(global_=1), clock)
    firsts = [next(iter(limits.room({"a": 4, "b": 4, "c": 4}))) for _ in range(3)]
    assert sorted(firsts) == ["a", "b", "c"]


# -- in a worker --------------------------------------------------------------------------------


async def test_a_worker_caps_each_tenant_and_hands_the_rest_back_uncounted(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Held()
    handle = tenant_job(body.run)
    worker = job_worker(
        driver=driver,
        context=lambda: None,
        jobs=[handle],
        limits=LimitConfig(per_tenant=2),
        clock=clock,
    )
    async with worker:
        for n in range(5):
            await handle.enqueue(Task("acme", n))
        await handle.enqueue(Task("globex", 0))
        await run_clock(clock, 3)
        assert body.peak == Counter({"acme": 2, "globex": 1})
        page = await driver.introspect.list(JobFilter(state=JobState.READY, limit=200))
        assert {row.attempt for row in page.rows} == {0}
        assert worker.stats.handed_back > 0
        body.release.set()
        await run_clock(clock, 3)
    assert worker.stats.completed == 6
    assert body.peak["acme"] == 2


async def test_a_worker_starts_a_rate_limited_tenant_again_when_its_window_opens(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    start = clock.now()
    started_at: list[float] = []

    async def timed(*, input: Task) -> None:
        started_at.append((clock.now() - start).total_seconds())

    handle = tenant_job(timed)
    async with job_worker(
        driver=driver,
        context=lambda: None,
        jobs=[handle],
        limits=LimitConfig(rate_per_tenant=RateLimit(1, "30s")),
        idle_poll_max=3600,  # only the local timer for the handed-back row can bring it back
        clock=clock,
    ):
        await handle.enqueue(Task("acme", 0))
        await handle.enqueue(Task("acme", 1))
        await run_clock(clock, 65)
        await until(lambda: len(started_at) == 2)
    assert started_at == [0, 30]


async def test_workers_handed_one_process_limits_share_one_budget(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    body = Held()
    handle = tenant_job(body.run)
    shared = ProcessLimits(LimitConfig(global_=3), clock)
    workers = [
        job_worker(driver=driver, context=lambda: None, jobs=[handle], limits=shared, clock=clock)
        for _ in range(2)
    ]
    for worker in workers:
        await worker.start()
    for n in range(8):
        await handle.enqueue(Task(f"org{n}", n))
    await run_clock(clock, 3)
    assert body.total_peak == 3
    body.release.set()
    await run_clock(clock, 3)
    for worker in workers:
        await worker.stop()
    assert sum(worker.stats.completed for worker in workers) == 8


async def test_workers_sharing_process_limits_wake_when_the_other_frees_the_place(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    release = asyncio.Event()
    ran: list[str] = []

    async def on_a(*, input: Any) -> None:
        ran.append("a")

    async def on_b(*, input: Any) -> None:
        await release.wait()
        ran.append("b")

    a_job = job(
        input=dict, idempotency_key=lambda i: "a", tenant="none", queue="a", name="shared-a"
    )(on_a)
    b_job = job(
        input=dict, idempotency_key=lambda i: "b", tenant="none", queue="b", name="shared-b"
    )(on_b)
    shared = ProcessLimits(LimitConfig(global_=1), clock)
    a = job_worker(driver=driver, context=lambda: None, jobs=[a_job], limits=shared, clock=clock)
    b = job_worker(driver=driver, context=lambda: None, jobs=[b_job], limits=shared, clock=clock)
    async with a, b:
        await b_job.enqueue({})
        await until(lambda: shared.room({"a": 1}) == {})
        await a_job.enqueue({})  # A is rung and finds no room: B holds the only place
        await settle()
        release.set()  # B's run ends: the place is free, but only B is rung
        await run_clock(clock, 10)
        await until(lambda: ran == ["b", "a"])


def test_the_rate_windows_of_tenants_gone_quiet_are_forgotten(clock: FrozenClock) -> None:
    """A tenant seen once is not remembered for ever: a process serving many tenants keeps a
    window only for those that started a run within the last one."""
    limits = ProcessLimits(LimitConfig(rate_per_tenant=RateLimit(10, "1m")), clock)
    for n in range(1_000):
        assert limits.hold("q", f"org-{n}") is None
        limits.release("q", f"org-{n}")
    clock.advance(61)
    assert limits.hold("q", "org-new") is None
    assert list(limits._starts) == ["org-new"]


class SlowAcks:
    """A memory driver on the system clock, each ack a millisecond long, as a server's round
    trip is: the settle is still on its way when the body's end frees the run's slot."""

    def __init__(self) -> None:
        self.inner = memory_job_driver()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def ack(self, job_id: str, options: Any) -> bool:
        await asyncio.sleep(0.001)
        return bool(await self.inner.ack(job_id, options))


@pytest.mark.parametrize(
    "limits", [LimitConfig(global_=1), LimitConfig(per_queue=1)], ids=["global", "per_queue"]
)
async def test_the_claim_a_run_ending_brings_finds_its_place_under_the_limits_free(
    limits: LimitConfig,
) -> None:
    """The place a run holds is given back when its body ends, before its slot's ring brings
    the next claim. Given back after the settle, that claim found it still held and handed its
    row back, and the backlog went one row per poll."""
    done: list[int] = []

    async def quick(*, input: Task) -> None:
        done.append(input.n)

    handle = tenant_job(quick)
    driver = SlowAcks()
    for n in range(20):
        await driver.inner.enqueue(handle.request(Task("acme", n)))
    worker = job_worker(
        driver=driver,  # type: ignore[arg-type]
        context=lambda: None,
        jobs=[handle],
        concurrency=4,
        limits=limits,
        idle_poll_max=3600,  # no poll covers for a lost ring
    )
    async with worker:
        for _ in range(500):
            if len(done) == 20:
                break
            await asyncio.sleep(0.01)
    assert sorted(done) == list(range(20))
    assert worker.stats.handed_back == 0
