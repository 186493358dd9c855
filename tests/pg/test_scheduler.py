"""Schedulers on one Postgres database: a lease-row leader, and every occurrence fired exactly once
across a rolling restart in which leaders die without handing the lease back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from ultimat3.jobs.core import (
    FrozenClock,
    InvariantError,
    JobScheduler,
    LeaseLeader,
    job,
    job_scheduler,
    new_id,
    task,
)
from ultimat3.jobs.core.cron import occurrence_ms
from ultimat3.jobs.core.model import Enqueued, EnqueueRequest
from ultimat3.jobs.pg import PostgresJobDriver, postgres_job_driver
from ultimat3.jobs.pg.scheduler import (
    PostgresSchedulerState,
    postgres_lease_leader,
    postgres_scheduler_state,
)

pytestmark = pytest.mark.pg

START = datetime(2026, 3, 2, 9, 0, 30, tzinfo=UTC)
TTL_S = 30.0
ROUND_S = 5.0


@dataclass
class Tick:
    at: int
    nonce: str


@job(input=Tick, idempotency_key=lambda i: f"tick:{i.at}:{i.nonce}", tenant="none", queue="ticks")
async def minute_tick(*, input: Tick) -> None:
    return None


every_minute = task(
    cron="* * * * *",
    tz="UTC",
    catch_up="run-all",
    name="pg-scheduler-every-minute",
    # A fresh key per fire: a second fire of one occurrence would insert a second row, never be
    # folded into the first by the live-key dedupe.
    enqueue=lambda at: [(minute_tick, Tick(at, new_id()))],
)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


class FireStarted:
    """The state, reporting the moment a fire statement is on its way."""

    def __init__(self, state: PostgresSchedulerState) -> None:
        self.state = state
        self.started = asyncio.Event()
        self.records_fires = state.records_fires

    async def watermarks(self, tasks: Sequence[str]) -> dict[str, int]:
        return await self.state.watermarks(tasks)

    async def arm(self, task: str, occurrence_ms: int) -> None:
        await self.state.arm(task, occurrence_ms)

    async def fire(
        self,
        task: str,
        occurrence_ms: int,
        requests: Sequence[EnqueueRequest],
        *,
        previous: int | None,
        fired_ms: int | None = None,
    ) -> list[Enqueued] | None:
        self.started.set()
        return await self.state.fire(
            task, occurrence_ms, requests, previous=previous, fired_ms=fired_ms
        )


@dataclass
class Node:
    """One scheduler process: its own pool, state and leader."""

    name: str
    driver: PostgresJobDriver
    state: FireStarted
    scheduler: JobScheduler
    round: asyncio.Task[object] | None = field(default=None)


@pytest.fixture
async def nodes(pg_url: str, clock: FrozenClock) -> AsyncIterator[dict[str, Node]]:
    started: dict[str, Node] = {}
    yield started
    for node in started.values():
        await node.driver.close()


def start_node(
    name: str, pg_url: str, clock: FrozenClock, nodes: dict[str, Node], ttl: float = TTL_S
) -> Node:
    driver = postgres_job_driver(pg_url, clock=clock)
    state = FireStarted(postgres_scheduler_state(driver.executor, clock=clock))
    scheduler = job_scheduler(
        driver=driver,
        state=state,
        leader=postgres_lease_leader(executor=driver.executor, holder=name, ttl=ttl, clock=clock),
        tasks=[every_minute],
        clock=clock,
    )
    nodes[name] = Node(name, driver, state, scheduler)
    return nodes[name]


async def run(clock: FrozenClock, alive: list[Node], seconds: float) -> None:
    """Every live node runs a dispatch round every ROUND_S seconds, all at once."""
    for _ in range(int(seconds // ROUND_S)):
        clock.advance(ROUND_S)
        await asyncio.gather(*(node.scheduler.run_once() for node in alive))


async def kill_mid_fire(clock: FrozenClock, alive: list[Node]) -> Node:
    """Kill the leader while its fire statement is on the wire: no stop, no lease handed back,
    its pool gone. Whether that statement committed is the server's business."""
    (leader,) = [node for node in alive if node.scheduler.leading]
    clock.set(clock.now().replace(second=0, microsecond=0) + timedelta(minutes=1, seconds=1))
    leader.state.started.clear()
    in_flight = asyncio.create_task(leader.scheduler.run_once())
    await leader.state.started.wait()
    await asyncio.sleep(0)
    in_flight.cancel()
    await asyncio.gather(in_flight, return_exceptions=True)
    await leader.driver.close()
    alive.remove(leader)
    return leader


async def fires_per_occurrence(driver: PostgresJobDriver) -> dict[int, int]:
    rows = await driver.executor.fetch(
        "select (input->>'at')::bigint, count(*) from x_jobs where name = %(name)s group by 1",
        {"name": minute_tick.name},
    )
    return {int(at): int(count) for at, count in rows}


def minutes_between(start: datetime, end: datetime) -> list[int]:
    first = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return [
        occurrence_ms(first + timedelta(minutes=n))
        for n in range(int((end - first).total_seconds() // 60) + 1)
    ]


async def test_two_schedulers_fire_each_occurrence_once_across_a_rolling_restart(
    pg_url: str, clock: FrozenClock, nodes: dict[str, Node], driver: PostgresJobDriver
) -> None:
    alive = [start_node("a", pg_url, clock, nodes), start_node("b", pg_url, clock, nodes)]
    await run(clock, alive, 300)
    await kill_mid_fire(clock, alive)
    alive.append(start_node("c", pg_url, clock, nodes))  # the replacement pod
    await run(clock, alive, 300)
    await kill_mid_fire(clock, alive)
    await run(clock, alive, 300)
    expected = minutes_between(START, clock.now())
    assert await fires_per_occurrence(driver) == dict.fromkeys(expected, 1)


async def test_a_standby_takes_over_only_once_the_dead_leaders_lease_lapses(
    pg_url: str, clock: FrozenClock, nodes: dict[str, Node]
) -> None:
    alive = [start_node("a", pg_url, clock, nodes)]
    await run(clock, alive, 10)
    standby = start_node("b", pg_url, clock, nodes)
    alive.append(standby)
    dead = await kill_mid_fire(clock, alive)
    (_, _, lapses_at) = await lease_row(standby.driver, "scheduler")
    while not standby.scheduler.leading:
        assert clock.now() < lapses_at + timedelta(seconds=TTL_S / 3 + ROUND_S)
        await run(clock, alive, ROUND_S)
    assert clock.now() >= lapses_at  # never while the dead leader's lease was live
    assert dead.scheduler.leading  # it never learned: it died


async def test_a_short_lease_is_renewed_every_third_of_its_ttl_and_never_shared(
    pg_url: str, clock: FrozenClock, nodes: dict[str, Node]
) -> None:
    """A 6 s lease renewed every 10 s lay empty 4 s of every 10, and a standby started 7 s
    after the leader led beside it until the leader's next renewal."""
    first = start_node("a", pg_url, clock, nodes, ttl=6)
    second = start_node("b", pg_url, clock, nodes, ttl=6)
    for elapsed in range(30):
        await first.scheduler.run_once()
        if elapsed >= 7:
            await second.scheduler.run_once()
        holder, _, expires_at = await lease_row(first.driver, "scheduler")
        assert (holder, expires_at > clock.now()) == ("a", True), elapsed
        assert (first.scheduler.leading, second.scheduler.leading) == (True, False), elapsed
        clock.advance(1)


async def test_the_lease_leader_states_its_ttl_and_a_renewal_as_long_is_refused(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    leader = postgres_lease_leader(executor=driver.executor, ttl=6, clock=clock)
    assert isinstance(leader, LeaseLeader)
    assert leader.ttl == 6.0
    with pytest.raises(InvariantError) as refused:
        job_scheduler(driver=driver, leader=leader, tasks=[], leader_renew_interval="10s")
    assert refused.value.meta["ttl"] == 6.0
    job_scheduler(driver=driver, leader=leader, tasks=[], leader_renew_interval="5s")


async def test_the_lease_outlives_the_connection_that_took_it(
    pg_url: str, clock: FrozenClock
) -> None:
    first = postgres_lease_leader(executor=pg_url, holder="a", ttl=TTL_S, clock=clock)
    assert await first.acquire()
    await first.close()  # its pool and every session of it are gone
    second = postgres_lease_leader(executor=pg_url, holder="b", ttl=TTL_S, clock=clock)
    try:
        assert not await second.acquire()
        clock.advance(TTL_S)
        assert await second.acquire()
    finally:
        await second.close()


async def test_acquire_renews_the_lease_and_keeps_when_it_was_taken(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    leader = postgres_lease_leader(executor=driver.executor, holder="a", ttl=TTL_S, clock=clock)
    taken_at = clock.now()
    assert await leader.acquire()
    clock.advance(20)
    assert await leader.acquire()
    assert await lease_row(driver, leader.name) == (
        "a",
        taken_at,
        clock.now() + timedelta(seconds=TTL_S),
    )


async def test_a_node_that_lost_the_lease_cannot_hand_it_back(
    driver: PostgresJobDriver, clock: FrozenClock
) -> None:
    first = postgres_lease_leader(executor=driver.executor, holder="a", ttl=TTL_S, clock=clock)
    second = postgres_lease_leader(executor=driver.executor, holder="b", ttl=TTL_S, clock=clock)
    assert await first.acquire()
    clock.advance(TTL_S)
    assert await second.acquire()
    await first.release()
    assert (await lease_row(driver, second.name))[0] == "b"
    assert not await first.acquire()


async def lease_row(driver: PostgresJobDriver, name: str) -> tuple[str, datetime, datetime]:
    rows = await driver.executor.fetch(
        "select holder, acquired_at, expires_at from x_scheduler_leader where name = %(name)s",
        {"name": name},
    )
    holder, acquired_at, expires_at = rows[0]
    return holder, acquired_at, expires_at
