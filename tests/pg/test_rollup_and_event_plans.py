"""Plans of the counters' rollup read and the event lookup: each reads the rows it answers, not
every row of its table (or of its event name), under statistics that mislead the planner."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pg.plans import plan_of, scans_run

from ultimat3.jobs.core.constants import COUNTER_TIERS
from ultimat3.jobs.pg import PostgresJobDriver
from ultimat3.jobs.pg.events import postgres_event_bus
from ultimat3.jobs.pg.sql_counters import SQL_COUNTERS_DUE_FOR_ROLLUP
from ultimat3.jobs.pg.sql_events import SQL_EVENT_LOOKUP

pytestmark = pytest.mark.pg

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NAMES = 10
# Per tier, the buckets k = 1..depth back from NOW (start NOW - k * width, end one width later):
# bucket retention / width + 1 ends exactly at NOW - retention, the first due; one more is due.
DEPTHS = [retention // width + 2 for width, retention in COUNTER_TIERS]

FILL_COUNTERS = """
insert into x_job_counters (name, bucket_start, width_s, done)
select 'job-' || n, %(now)s::timestamptz - make_interval(secs => t.width_s * k), t.width_s, 1
from unnest(%(widths)s::int[], %(depths)s::int[]) as t (width_s, depth),
     generate_series(1, %(names)s) as n,
     generate_series(1, t.depth) as k
where t.width_s = any(%(tiers)s::int[])
order by random()
"""

WIDTHS = [width for width, _ in COUNTER_TIERS]
ROLLUP: dict[str, Any] = {
    "widths": WIDTHS,
    "retentions": [retention for _, retention in COUNTER_TIERS],
    "now": NOW,
}


async def fill(driver: PostgresJobDriver, tiers: list[int]) -> None:
    params = {"now": NOW, "widths": WIDTHS, "depths": DEPTHS, "names": NAMES}
    await driver.executor.fetch(FILL_COUNTERS, {**params, "tiers": tiers}, prepare=False)


async def analyzed_before_the_coarser_tiers(driver: PostgresJobDriver) -> None:
    """The last ANALYZE saw one tier only: to the planner every row has the same width."""
    first, *coarser = WIDTHS
    await fill(driver, [first])
    await driver.executor.fetch("analyze x_job_counters", prepare=False)
    await fill(driver, coarser)


async def analyzed_when_full(driver: PostgresJobDriver) -> None:
    await fill(driver, WIDTHS)
    await driver.executor.fetch("analyze x_job_counters", prepare=False)


def due_buckets() -> list[tuple[str, datetime, int]]:
    """What the rollup must answer, by the core's rule: a bucket is due once it ended at or
    before now - its tier's retention."""
    due = [
        (f"job-{n}", NOW - timedelta(seconds=width * k), width)
        for n in range(1, NAMES + 1)
        for (width, retention), depth in zip(COUNTER_TIERS, DEPTHS, strict=True)
        for k in range(1, depth + 1)
        if NOW - timedelta(seconds=width * (k - 1)) <= NOW - timedelta(seconds=retention)
    ]
    return sorted(due)


Statistics = Callable[[PostgresJobDriver], Awaitable[None]]


@pytest.mark.parametrize("statistics", [analyzed_before_the_coarser_tiers, analyzed_when_full])
async def test_the_rollup_answers_every_due_bucket_and_no_other(
    driver: PostgresJobDriver, statistics: Statistics
) -> None:
    """Two due buckets per name and tier — one of them ending exactly at now - retention — among
    thousands that are not (the bucket just after each cutoff among them), in rollup order."""
    await statistics(driver)
    rows = await driver.executor.fetch(SQL_COUNTERS_DUE_FOR_ROLLUP, ROLLUP)
    answered = [(name, start, width) for name, start, width, *_ in rows]
    assert answered == due_buckets()
    assert len(answered) == 2 * NAMES * len(COUNTER_TIERS)


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
@pytest.mark.parametrize("statistics", [analyzed_before_the_coarser_tiers, analyzed_when_full])
async def test_the_rollup_reads_only_the_due_buckets_whatever_the_statistics_say(
    driver: PostgresJobDriver, statistics: Statistics, generic: bool
) -> None:
    """Run once a minute on the scheduler's leader: it read every counter row (54 ms at 185k
    rows); through x_job_counters_due_idx it reads the due buckets of each tier and stops. With
    statistics that saw one tier only, and in a generic plan, matching the tier by equality
    still read the whole table."""
    await statistics(driver)
    plan = await plan_of(driver.executor, SQL_COUNTERS_DUE_FOR_ROLLUP, ROLLUP, generic=generic)
    assert "x_job_counters_due_idx" in plan, plan
    assert "Seq Scan on x_job_counters" not in plan, plan
    if not generic:
        scans = await scans_run(
            driver.executor, SQL_COUNTERS_DUE_FOR_ROLLUP, ROLLUP, "x_job_counters"
        )
        assert scans
        assert all(node != "Seq Scan" for node, _ in scans), scans
        assert sum(rows for _, rows in scans) == len(due_buckets()), scans


PUBLISH_MANY = """
insert into x_job_events (id, event, payload, published_at, expires_at)
select p.prefix || lpad(i::text, 6, '0'), %(event)s, jsonb_build_object('i', i), now(),
       now() + interval '1 day'
from unnest(%(prefixes)s::text[]) as p (prefix), generate_series(1, %(count)s) as i
order by random()
"""


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_an_event_lookup_reads_the_earliest_event_without_sorting_the_names_events(
    driver: PostgresJobDriver, generic: bool
) -> None:
    """Statistics taken before the event name existed, then thousands of its events published
    in one instant: the lookup took the top of a sort of all of them (2.7 ms at 10k events).
    x_job_events_earliest_idx holds them in answer order, ties on published_at by id."""
    fetch = driver.executor.fetch
    await fetch(PUBLISH_MANY, {"prefixes": ["o-"], "event": "other", "count": 100}, prepare=False)
    await fetch("analyze x_job_events", prepare=False)
    many = {"prefixes": ["z-", "a-"], "event": "order.paid", "count": 5_000}
    await fetch(PUBLISH_MANY, many, prepare=False)
    bus = postgres_event_bus(executor=driver.executor)
    since = await bus.now() - timedelta(hours=1)
    found = await bus.lookup("order.paid", since=since)
    assert found is not None
    assert found.id == "a-000001"

    params: dict[str, Any] = {"event": "order.paid", "since": since, "until": None, "match": None}
    plan = await plan_of(driver.executor, SQL_EVENT_LOOKUP, params, generic=generic)
    assert "Index Scan using x_job_events_earliest_idx" in plan, plan
    assert "Sort" not in plan, plan
    if not generic:
        scans = await scans_run(driver.executor, SQL_EVENT_LOOKUP, params, "x_job_events")
        assert scans == [("Index Scan", 1)], scans


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_an_event_lookup_bounded_by_until_stops_at_it(
    driver: PostgresJobDriver, generic: bool
) -> None:
    """A wait resumed long after its deadline asks for the events published by then: thousands
    published after it, none matching, are not read one by one (until bounds the index scan)."""
    fetch = driver.executor.fetch
    many = {"prefixes": ["z-"], "event": "order.paid", "count": 5_000}
    await fetch(PUBLISH_MANY, many, prepare=False)
    await fetch("analyze x_job_events", prepare=False)
    bus = postgres_event_bus(executor=driver.executor)
    since = await bus.now() - timedelta(hours=1)
    until = since + timedelta(minutes=1)
    assert await bus.lookup("order.paid", since=since, until=until, match={"n": 1}) is None

    params: dict[str, Any] = {
        "event": "order.paid",
        "since": since,
        "until": until,
        "match": '{"n": 1}',
    }
    plan = await plan_of(driver.executor, SQL_EVENT_LOOKUP, params, generic=generic)
    assert "Index Scan using x_job_events_earliest_idx" in plan, plan
    if not generic:
        scans = await scans_run(driver.executor, SQL_EVENT_LOOKUP, params, "x_job_events")
        assert scans == [("Index Scan", 0)], scans
