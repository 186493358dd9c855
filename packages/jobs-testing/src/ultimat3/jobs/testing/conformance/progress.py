"""Progress: what a run reports, fenced on its claim like every other write after it."""

from __future__ import annotations

from ultimat3.jobs.core import Progress

from .target import Conformance

__all__ = ["ProgressRules"]


class ProgressRules:
    async def test_progress_is_stored_on_the_row(self, jobs: Conformance) -> None:
        held = await jobs.running()
        progress = Progress(done=3, total=10, note="page 3")
        assert await jobs.introspect.record_progress(held.id, held.claim, progress)
        assert (await jobs.row(held.id)).progress == progress

    async def test_progress_replaces_the_last_report(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.introspect.record_progress(held.id, held.claim, Progress(1, 4))
        assert await jobs.introspect.record_progress(held.id, held.claim, Progress(2.5))
        assert (await jobs.row(held.id)).progress == Progress(2.5)

    async def test_progress_under_a_stale_claim_answers_false_and_changes_nothing(
        self, jobs: Conformance
    ) -> None:
        stale = await jobs.running()
        await jobs.lapse_and_reclaim(stale)
        before = await jobs.snapshot(stale.id)
        assert not await jobs.introspect.record_progress(stale.id, stale.claim, Progress(9, 9))
        assert await jobs.snapshot(stale.id) == before

    async def test_progress_after_the_settle_answers_false(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.introspect.record_progress(held.id, held.claim, Progress(1, 2))
        assert await jobs.ack(held)
        assert not await jobs.introspect.record_progress(held.id, held.claim, Progress(2, 2))
        assert (await jobs.row(held.id)).progress == Progress(1, 2)

    async def test_progress_of_an_unknown_job_answers_false(self, jobs: Conformance) -> None:
        held = await jobs.running()
        unknown = "0190a000-0000-7000-8000-0000000000ff"
        assert not await jobs.introspect.record_progress(unknown, held.claim, Progress(1))
