"""Stats: one entry per queue holding any row, counting every state (or every state but done)."""

from __future__ import annotations

from dataclasses import replace

from ultimat3.jobs.core import QueueStats

from .target import Conformance

__all__ = ["StatsRules"]


class StatsRules:
    async def test_an_empty_backend_has_no_stats(self, jobs: Conformance) -> None:
        assert await jobs.driver.stats() == []

    async def test_stats_has_one_entry_per_queue_holding_rows(self, jobs: Conformance) -> None:
        await jobs.enqueue(queue="a")
        await jobs.enqueue(queue="a")
        await jobs.enqueue(queue="b", delay=5)
        entries = await jobs.driver.stats()
        assert sorted(entry.queue for entry in entries) == ["a", "b"]

    async def test_stats_counts_every_state(self, jobs: Conformance) -> None:
        _, done, failed, dead, suspended = [await jobs.running(queue="q") for _ in range(5)]
        await jobs.enqueue()
        await jobs.enqueue(delay=60)
        assert await jobs.ack(done)
        assert await jobs.nack(failed, fail=True)
        assert await jobs.nack(dead, dead_letter=True)
        assert await jobs.nack(suspended, park=True, run_at=jobs.at(60), count_attempt=False)
        stats = await jobs.queue_stats()
        assert stats == QueueStats(
            queue="q",
            ready=1,
            delayed=1,
            running=1,
            suspended=1,
            done=1,
            failed=1,
            dead=1,
            oldest_ready_at=jobs.now(),
        )
        assert stats.depth == 3
        # Without the done rows, every other figure stays.
        assert await jobs.driver.stats(include_done=False) == [replace(stats, done=0)]

    async def test_stats_without_done_leaves_out_a_queue_of_done_rows(
        self, jobs: Conformance
    ) -> None:
        assert await jobs.ack(await jobs.running(queue="finished"))
        await jobs.enqueue(queue="waiting")
        assert sorted(await jobs.stats()) == ["finished", "waiting"]
        entries = await jobs.driver.stats(include_done=False)
        assert [entry.queue for entry in entries] == ["waiting"]

    async def test_stats_counts_cancelled_rows(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue()
        assert await jobs.introspect.cancel(queued.id) is not None
        assert (await jobs.queue_stats()).cancelled == 1
        (entry,) = await jobs.driver.stats(include_done=False)
        assert entry.cancelled == 1

    async def test_oldest_ready_at_is_the_oldest_due_waiting_row(self, jobs: Conformance) -> None:
        await jobs.enqueue(delay=-10)
        await jobs.enqueue(delay=-30)
        await jobs.enqueue(delay=5)
        assert (await jobs.queue_stats()).oldest_ready_at == jobs.at(-30)

    async def test_oldest_ready_at_counts_a_due_delayed_row(self, jobs: Conformance) -> None:
        await jobs.enqueue(delay=10)
        jobs.advance(15)
        assert (await jobs.queue_stats()).oldest_ready_at == jobs.at(-5)

    async def test_oldest_ready_at_ignores_rows_not_yet_due(self, jobs: Conformance) -> None:
        await jobs.enqueue(delay=10)
        held = await jobs.running(queue="q")
        assert await jobs.nack(held, run_at=jobs.at(20))
        assert (await jobs.queue_stats()).oldest_ready_at is None

    async def test_oldest_ready_at_ignores_running_and_suspended_rows(
        self, jobs: Conformance
    ) -> None:
        await jobs.running(queue="q", delay=-10)
        parked = await jobs.running(queue="q", delay=-20)
        assert await jobs.nack(parked, park=True, run_at=jobs.at(-20), count_attempt=False)
        assert (await jobs.queue_stats()).oldest_ready_at is None
