"""Per-job counters: moved by the settle itself, in minute buckets, folded into coarser tiers."""

from __future__ import annotations

from datetime import timedelta

from ultimat3.jobs.core.constants import COUNTER_TIERS
from ultimat3.jobs.core.counters import bucket_start
from ultimat3.jobs.core.model import CounterBucket, CounterTotals

from .target import Conformance

__all__ = ["CounterRules"]

_MINUTE, _FIVE_MINUTES, _HOUR = (width for width, _ in COUNTER_TIERS)
_LONG_AGO = timedelta(days=400)


async def _buckets(jobs: Conformance, name: str) -> list[CounterBucket]:
    return await jobs.introspect.counters(name, since=jobs.now() - _LONG_AGO)


class CounterRules:
    async def test_an_ack_counts_done_with_its_duration(self, jobs: Conformance) -> None:
        held = await jobs.running(name="counted")
        assert await jobs.ack(held, duration_ms=250)
        start = bucket_start(jobs.now(), _MINUTE)
        assert await _buckets(jobs, "counted") == [
            CounterBucket("counted", start, _MINUTE, done=1, duration_ms=250)
        ]

    async def test_a_counted_retry_counts_retried(self, jobs: Conformance) -> None:
        held = await jobs.running(name="counted")
        assert await jobs.nack(held, error="boom", duration_ms=40)
        assert (await jobs.totals()).get("counted") == CounterTotals(
            "counted", retried=1, duration_ms=40
        )

    async def test_a_dead_letter_counts_dead(self, jobs: Conformance) -> None:
        held = await jobs.running(name="counted")
        assert await jobs.nack(held, dead_letter=True)
        assert (await jobs.totals()).get("counted") == CounterTotals("counted", dead=1)

    async def test_a_failure_counts_failed_even_uncounted(self, jobs: Conformance) -> None:
        held = await jobs.running(name="counted")
        assert await jobs.nack(held, fail=True, count_attempt=False)
        assert (await jobs.totals()).get("counted") == CounterTotals("counted", failed=1)

    async def test_a_handed_back_attempt_counts_nothing(self, jobs: Conformance) -> None:
        parked = await jobs.running(name="counted")
        assert await jobs.nack(parked, park=True, run_at=jobs.at(5), count_attempt=False)
        drained = await jobs.running(name="counted")
        assert await jobs.nack(drained, count_attempt=False, duration_ms=10)
        assert "counted" not in await jobs.totals()

    async def test_a_burial_counts_dead(self, jobs: Conformance) -> None:
        held = await jobs.running(name="counted", max_attempts=1)
        jobs.clock.set(held.lease_until)
        await jobs.claim(held.queue)
        assert (await jobs.totals()).get("counted") == CounterTotals("counted", dead=1)

    async def test_a_dropped_burial_counts_failed(self, jobs: Conformance) -> None:
        held = await jobs.running(name="counted", max_attempts=1)
        jobs.clock.set(held.lease_until)
        await jobs.claim(held.queue, drop_exhausted={"counted"})
        assert (await jobs.totals()).get("counted") == CounterTotals("counted", failed=1)

    async def test_settles_in_one_minute_share_a_bucket(self, jobs: Conformance) -> None:
        jobs.clock.set(bucket_start(jobs.now(), _MINUTE) + timedelta(minutes=1))
        for _ in range(2):
            assert await jobs.ack(await jobs.running(name="counted"), duration_ms=5)
            jobs.advance(59)
        assert await jobs.ack(await jobs.running(name="counted"))
        assert [(b.done, b.duration_ms) for b in await _buckets(jobs, "counted")] == [
            (2, 10),
            (1, 0),
        ]

    async def test_counters_answer_one_job_from_since_on(self, jobs: Conformance) -> None:
        assert await jobs.ack(await jobs.running(name="counted"))
        jobs.advance(120)
        assert await jobs.ack(await jobs.running(name="counted"))
        assert await jobs.ack(await jobs.running(name="other"))
        recent = await jobs.introspect.counters("counted", since=jobs.at(-60))
        assert [(b.name, b.start) for b in recent] == [
            ("counted", bucket_start(jobs.now(), _MINUTE))
        ]

    async def test_counter_totals_sum_per_job_by_name(self, jobs: Conformance) -> None:
        assert await jobs.ack(await jobs.running(name="b-job"), duration_ms=3)
        jobs.advance(300)
        assert await jobs.ack(await jobs.running(name="b-job"), duration_ms=4)
        assert await jobs.nack(await jobs.running(name="a-job"), dead_letter=True)
        totals = await jobs.introspect.counter_totals(since=jobs.now() - _LONG_AGO)
        assert totals == [
            CounterTotals("a-job", dead=1),
            CounterTotals("b-job", done=2, duration_ms=7),
        ]

    async def test_rollup_folds_a_day_old_minute_into_five_minutes(self, jobs: Conformance) -> None:
        jobs.clock.set(bucket_start(jobs.now(), _HOUR) + timedelta(minutes=2))
        assert await jobs.ack(await jobs.running(name="counted"), duration_ms=1)
        jobs.advance(60)
        assert await jobs.ack(await jobs.running(name="counted"), duration_ms=2)
        settled_at = jobs.now()
        jobs.advance(timedelta(days=1, minutes=5).total_seconds())
        await jobs.introspect.rollup_counters()
        assert await _buckets(jobs, "counted") == [
            CounterBucket(
                "counted",
                bucket_start(settled_at, _FIVE_MINUTES),
                _FIVE_MINUTES,
                done=2,
                duration_ms=3,
            )
        ]

    async def test_rollup_folds_a_week_old_bucket_into_the_hour(self, jobs: Conformance) -> None:
        assert await jobs.ack(await jobs.running(name="counted"))
        settled_at = jobs.now()
        jobs.advance(timedelta(days=8).total_seconds())
        await jobs.introspect.rollup_counters()
        assert [(b.start, b.width_s, b.done) for b in await _buckets(jobs, "counted")] == [
            (bucket_start(settled_at, _HOUR), _HOUR, 1)
        ]

    async def test_rollup_drops_buckets_past_the_last_tier(self, jobs: Conformance) -> None:
        assert await jobs.ack(await jobs.running(name="counted"))
        jobs.advance(timedelta(days=31).total_seconds())
        await jobs.introspect.rollup_counters()
        assert await _buckets(jobs, "counted") == []

    async def test_rollup_keeps_recent_buckets_as_they_are(self, jobs: Conformance) -> None:
        assert await jobs.ack(await jobs.running(name="counted"))
        before = await _buckets(jobs, "counted")
        jobs.advance(3600)
        await jobs.introspect.rollup_counters()
        assert await _buckets(jobs, "counted") == before

    async def test_rollup_is_idempotent(self, jobs: Conformance) -> None:
        for _ in range(3):
            assert await jobs.ack(await jobs.running(name="counted"), duration_ms=1)
            jobs.advance(600)
        jobs.advance(timedelta(days=2).total_seconds())
        await jobs.introspect.rollup_counters()
        once = await _buckets(jobs, "counted")
        await jobs.introspect.rollup_counters()
        assert await _buckets(jobs, "counted") == once
        assert sum(b.done for b in once) == 3
