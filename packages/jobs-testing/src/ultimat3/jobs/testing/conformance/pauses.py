"""Pauses: a paused queue is claimed by nobody (enqueues still land); paused tasks are listed."""

from __future__ import annotations

from .target import Conformance

__all__ = ["PauseRules"]


class PauseRules:
    async def test_a_paused_queue_is_not_claimed(self, jobs: Conformance) -> None:
        await jobs.enqueue(queue="mail")
        await jobs.introspect.pause_queue("mail")
        assert await jobs.claimed_ids("mail") == []

    async def test_enqueues_land_on_a_paused_queue(self, jobs: Conformance) -> None:
        await jobs.introspect.pause_queue("mail")
        assert not (await jobs.enqueue(queue="mail")).deduped
        assert (await jobs.queue_stats("mail")).ready == 1

    async def test_a_resumed_queue_is_claimed_again(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue(queue="mail")
        await jobs.introspect.pause_queue("mail")
        await jobs.introspect.resume_queue("mail")
        assert await jobs.claimed_ids("mail") == [queued.id]

    async def test_a_pause_holds_only_its_own_queue(self, jobs: Conformance) -> None:
        await jobs.enqueue(queue="mail")
        billing = await jobs.enqueue(queue="billing")
        await jobs.introspect.pause_queue("mail")
        batch = await jobs.claim(queues={"mail": 5, "billing": 5})
        assert [job.id for job in batch.jobs] == [billing.id]

    async def test_paused_queues_are_listed_by_name(self, jobs: Conformance) -> None:
        for queue in ("mail", "billing", "mail"):
            await jobs.introspect.pause_queue(queue)
        assert await jobs.introspect.paused_queues() == ["billing", "mail"]
        await jobs.introspect.resume_queue("mail")
        assert await jobs.introspect.paused_queues() == ["billing"]

    async def test_resuming_a_queue_that_is_not_paused_changes_nothing(
        self, jobs: Conformance
    ) -> None:
        await jobs.introspect.resume_queue("never-paused")
        assert await jobs.introspect.paused_queues() == []

    async def test_a_pause_holds_a_queue_before_it_has_rows(self, jobs: Conformance) -> None:
        await jobs.introspect.pause_queue("later")
        await jobs.enqueue(queue="later")
        assert await jobs.claimed_ids("later") == []

    async def test_paused_tasks_are_listed_by_name(self, jobs: Conformance) -> None:
        for task in ("nightly", "hourly", "nightly"):
            await jobs.introspect.pause_task(task)
        assert await jobs.introspect.paused_tasks() == ["hourly", "nightly"]
        await jobs.introspect.resume_task("hourly")
        await jobs.introspect.resume_task("never-paused")
        assert await jobs.introspect.paused_tasks() == ["nightly"]

    async def test_task_and_queue_pauses_are_separate(self, jobs: Conformance) -> None:
        await jobs.introspect.pause_task("same-name")
        assert await jobs.introspect.paused_queues() == []
        await jobs.enqueue(queue="same-name")
        assert len(await jobs.claimed_ids("same-name")) == 1
