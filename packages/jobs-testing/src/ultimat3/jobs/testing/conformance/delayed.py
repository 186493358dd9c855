"""Delayed rows: queued for later, handed out in ``run_at`` order once due."""

from __future__ import annotations

from ultimat3.jobs.core import JobState

from .target import Conformance

__all__ = ["DelayedRules"]


class DelayedRules:
    async def test_a_delayed_row_waits_for_its_run_at(self, jobs: Conformance) -> None:
        await jobs.enqueue(delay=30)
        jobs.advance(29.999)
        assert await jobs.claimed_ids() == []

    async def test_a_delayed_row_is_due_at_exactly_its_run_at(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue(delay=30)
        jobs.advance(30)
        claimed = await jobs.claim_one()
        assert (claimed.id, claimed.run_at, claimed.attempt) == (queued.id, jobs.now(), 1)

    async def test_delayed_rows_run_in_run_at_order_not_enqueue_order(
        self, jobs: Conformance
    ) -> None:
        later = await jobs.enqueue(delay=20)
        sooner = await jobs.enqueue(delay=10)
        jobs.advance(20)
        assert [(await jobs.claim_one()).id for _ in range(2)] == [sooner.id, later.id]

    async def test_a_due_delayed_row_orders_with_ready_rows_by_run_at(
        self, jobs: Conformance
    ) -> None:
        delayed = await jobs.enqueue(delay=10)
        jobs.advance(20)
        ready = await jobs.enqueue(delay=-5)
        assert [(await jobs.claim_one()).id for _ in range(2)] == [delayed.id, ready.id]

    async def test_a_delayed_row_stays_delayed_until_claimed(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue(delay=10)
        jobs.advance(20)
        assert (await jobs.queue_stats()).delayed == 1
        assert (await jobs.row(queued.id)).state is JobState.DELAYED
