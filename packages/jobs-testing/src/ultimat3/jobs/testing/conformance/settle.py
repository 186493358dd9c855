"""Settling and fencing: ack, nack and heartbeat land only under the claim that holds the row.

A write under any other claim — one whose lease lapsed and was claimed again, by another worker
or by the same one — answers False and changes nothing at all.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ultimat3.jobs.core import AckOptions, ClaimRef, JobState

from .target import Conformance

__all__ = ["SettleRules"]


class SettleRules:
    async def test_ack_moves_the_row_to_done(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.ack(held)
        stats = await jobs.queue_stats(held.queue)
        assert (stats.running, stats.done) == (0, 1)

    async def test_the_operator_sees_an_acked_row_finished(self, jobs: Conformance) -> None:
        held = await jobs.running()
        jobs.advance(2)
        assert await jobs.ack(held)
        row = await jobs.row(held.id)
        assert row.state is JobState.DONE
        assert (row.finished_at, row.updated_at) == (jobs.now(), jobs.now())
        assert (row.worker_id, row.lease_until, row.attempt) == (None, None, 1)

    async def test_ack_of_an_unknown_id_answers_false(self, jobs: Conformance) -> None:
        held = await jobs.running()
        unknown = AckOptions(held.claim.worker_id, held.claim.claim)
        assert not await jobs.driver.ack("0190a000-0000-7000-8000-0000000000ff", unknown)

    async def test_an_ack_sent_again_answers_true_and_changes_nothing(
        self, jobs: Conformance
    ) -> None:
        """An ack repeated under the claim it landed with (its answer was lost with the
        connection) answers as the first did, and is counted once."""
        held = await jobs.running()
        assert await jobs.ack(held, 7)
        before = await jobs.snapshot(held.id)
        jobs.advance(3)
        assert await jobs.ack(held, 7)
        assert await jobs.snapshot(held.id) == before

    async def test_an_ack_under_a_claim_another_ack_finished_answers_false(
        self, jobs: Conformance
    ) -> None:
        stale = await jobs.running()
        fresh = await jobs.lapse_and_reclaim(stale, worker=stale.claim.worker_id)
        assert await jobs.ack(fresh)
        before = await jobs.snapshot(stale.id)
        assert not await jobs.ack(stale)
        assert await jobs.snapshot(stale.id) == before

    async def test_ack_under_a_stale_claim_answers_false_and_changes_nothing(
        self, jobs: Conformance
    ) -> None:
        stale = await jobs.running()
        await jobs.lapse_and_reclaim(stale, worker="w2")
        before = await jobs.snapshot(stale.id)
        assert not await jobs.ack(stale, 5)
        assert await jobs.snapshot(stale.id) == before

    async def test_ack_is_fenced_on_the_token_not_only_the_worker(self, jobs: Conformance) -> None:
        stale = await jobs.running()
        fresh = await jobs.lapse_and_reclaim(stale, worker=stale.claim.worker_id)
        before = await jobs.snapshot(stale.id)
        assert not await jobs.ack(stale)
        assert await jobs.snapshot(stale.id) == before
        assert await jobs.ack(fresh)

    async def test_ack_under_another_workers_id_answers_false(self, jobs: Conformance) -> None:
        held = await jobs.running()
        before = await jobs.snapshot(held.id)
        forged = AckOptions("someone-else", held.claim.claim)
        assert not await jobs.driver.ack(held.id, forged)
        assert await jobs.snapshot(held.id) == before

    async def test_the_current_claim_settles_after_a_stale_one_tried(
        self, jobs: Conformance
    ) -> None:
        stale = await jobs.running()
        fresh = await jobs.lapse_and_reclaim(stale)
        assert not await jobs.ack(stale)
        assert await jobs.ack(fresh)
        assert (await jobs.queue_stats(fresh.queue)).done == 1

    async def test_a_lapsed_lease_still_settles_until_another_claim_takes_the_row(
        self, jobs: Conformance
    ) -> None:
        held = await jobs.running()
        jobs.clock.set(held.lease_until + timedelta(seconds=60))
        assert await jobs.ack(held)

    async def test_a_lapsed_lease_is_still_renewed_until_another_claim_takes_the_row(
        self, jobs: Conformance
    ) -> None:
        held = await jobs.running()
        jobs.clock.set(held.lease_until + timedelta(seconds=60))
        assert await jobs.driver.heartbeat(held.id, held.claim, 30)
        assert await jobs.claimed_ids(held.queue, worker="w2") == []
        assert (await jobs.row(held.id)).lease_until == jobs.at(30)

    async def test_nack_under_a_stale_claim_answers_false_and_changes_nothing(
        self, jobs: Conformance
    ) -> None:
        stale = await jobs.running()
        await jobs.lapse_and_reclaim(stale)
        variants: list[dict[str, Any]] = [
            {"error": "boom", "run_at": jobs.at(5)},
            {"error": "boom", "dead_letter": True},
            {"fail": True},
            {"park": True, "run_at": jobs.at(60), "count_attempt": False},
        ]
        for options in variants:
            before = await jobs.snapshot(stale.id)
            assert not await jobs.nack(stale, **options)
            assert await jobs.snapshot(stale.id) == before

    async def test_nack_of_a_finished_row_answers_false(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.ack(held)
        before = await jobs.snapshot(held.id)
        assert not await jobs.nack(held, error="late")
        assert await jobs.snapshot(held.id) == before

    async def test_heartbeat_extends_the_lease_from_now(self, jobs: Conformance) -> None:
        held = await jobs.running()
        jobs.advance(20)
        assert await jobs.driver.heartbeat(held.id, held.claim, 30)
        jobs.advance(29)
        assert await jobs.claimed_ids(held.queue, worker="w2") == []
        jobs.advance(1)
        assert await jobs.claimed_ids(held.queue, worker="w2") == [held.id]

    async def test_the_operator_sees_the_renewed_lease(self, jobs: Conformance) -> None:
        held = await jobs.running()
        jobs.advance(20)
        assert await jobs.driver.heartbeat(held.id, held.claim, 45)
        assert (await jobs.row(held.id)).lease_until == jobs.at(45)

    async def test_heartbeat_under_a_stale_claim_answers_false_and_changes_nothing(
        self, jobs: Conformance
    ) -> None:
        stale = await jobs.running()
        await jobs.lapse_and_reclaim(stale)
        jobs.advance(5)
        before = await jobs.snapshot(stale.id)
        assert not await jobs.driver.heartbeat(stale.id, stale.claim, 300)
        assert await jobs.snapshot(stale.id) == before

    async def test_a_stale_heartbeat_does_not_keep_the_new_claim_alive(
        self, jobs: Conformance
    ) -> None:
        stale = await jobs.running()
        fresh = await jobs.lapse_and_reclaim(stale, visibility_timeout=30)
        assert not await jobs.driver.heartbeat(stale.id, stale.claim, 3600)
        jobs.clock.set(fresh.lease_until)
        assert await jobs.claimed_ids(fresh.queue, worker="w3") == [fresh.id]

    async def test_heartbeat_after_the_settle_answers_false(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.ack(held)
        assert not await jobs.driver.heartbeat(held.id, held.claim, 30)

    async def test_heartbeat_of_an_unknown_id_answers_false(self, jobs: Conformance) -> None:
        ref = ClaimRef("w1", "no-such-claim")
        assert not await jobs.driver.heartbeat("0190a000-0000-7000-8000-0000000000ff", ref, 30)
