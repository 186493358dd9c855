"""Nack targets: where ``nack_state(options)`` sends a row, when it is due, what it costs."""

from __future__ import annotations

from ultimat3.jobs.core import JobState

from .target import Conformance

__all__ = ["NackRules"]


class NackRules:
    async def test_a_plain_nack_is_ready_again_at_its_run_at(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="boom", run_at=jobs.at(10))
        assert (await jobs.queue_stats(held.queue)).ready == 1
        jobs.advance(9.999)
        assert await jobs.claimed_ids(held.queue) == []
        jobs.advance(0.001)
        assert await jobs.claimed_ids(held.queue) == [held.id]

    async def test_a_nack_without_run_at_is_due_at_once(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="boom")
        assert await jobs.claimed_ids(held.queue) == [held.id]

    async def test_the_operator_sees_the_backoff_on_the_row(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="boom", run_at=jobs.at(10))
        row = await jobs.row(held.id)
        assert row.state is JobState.READY
        assert (row.run_at, row.last_error, row.attempt) == (jobs.at(10), "boom", 1)
        assert (row.worker_id, row.lease_until, row.finished_at) == (None, None, None)

    async def test_a_retry_counts_the_attempt(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="boom")
        assert (await jobs.claim_one(held.queue)).attempt == 2

    async def test_dead_letter_moves_the_row_to_dead(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="boom", dead_letter=True)
        stats = await jobs.queue_stats(held.queue)
        assert (stats.running, stats.dead) == (0, 1)

    async def test_fail_moves_the_row_to_failed(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="boom", fail=True)
        stats = await jobs.queue_stats(held.queue)
        assert (stats.running, stats.failed, stats.dead) == (0, 1, 0)

    async def test_park_suspends_the_row_until_its_run_at(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, park=True, run_at=jobs.at(60), count_attempt=False)
        assert (await jobs.queue_stats(held.queue)).suspended == 1
        jobs.advance(59)
        assert await jobs.claimed_ids(held.queue) == []
        jobs.advance(1)
        assert await jobs.claimed_ids(held.queue) == [held.id]

    async def test_dead_letter_wins_over_fail_and_park(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, dead_letter=True, fail=True, park=True, run_at=jobs.at(9))
        assert (await jobs.queue_stats(held.queue)).dead == 1

    async def test_fail_wins_over_park(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, fail=True, park=True, run_at=jobs.at(9))
        assert (await jobs.queue_stats(held.queue)).failed == 1

    async def test_a_finished_nack_keeps_the_rows_run_at(self, jobs: Conformance) -> None:
        held = await jobs.running(delay=-7)
        assert await jobs.nack(held, dead_letter=True, run_at=jobs.at(99))
        row = await jobs.row(held.id)
        assert (row.state, row.run_at, row.finished_at) == (JobState.DEAD, held.run_at, jobs.now())

    async def test_an_uncounted_nack_hands_the_attempt_back(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, park=True, run_at=jobs.at(5), count_attempt=False)
        jobs.advance(5)
        assert (await jobs.claim_one(held.queue)).attempt == 1

    async def test_an_uncounted_retry_hands_the_attempt_back(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, count_attempt=False)
        assert (await jobs.claim_one(held.queue)).attempt == 1

    async def test_an_uncounted_failure_records_the_attempt_before_the_claim(
        self, jobs: Conformance
    ) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="busy", fail=True, count_attempt=False)
        row = await jobs.row(held.id)
        assert (row.state, row.attempt, row.last_error) == (JobState.FAILED, 0, "busy")

    async def test_a_nack_records_its_error(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="X_BOOM: it broke\n  at line 3", run_at=jobs.at(1))
        assert (await jobs.row(held.id)).last_error == "X_BOOM: it broke\n  at line 3"

    async def test_a_nack_without_an_error_keeps_the_last_one(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, error="first failure")
        again = await jobs.claim_one(held.queue)
        assert await jobs.nack(again, park=True, run_at=jobs.at(5), count_attempt=False)
        assert (await jobs.row(held.id)).last_error == "first failure"

    async def test_dead_and_failed_rows_are_never_handed_out(self, jobs: Conformance) -> None:
        dead = await jobs.running(queue="q")
        assert await jobs.nack(dead, dead_letter=True)
        failed = await jobs.running(queue="q")
        assert await jobs.nack(failed, fail=True)
        jobs.advance(86400)
        assert await jobs.claimed_ids("q") == []
