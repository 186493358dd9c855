"""Queues: a claim serves exactly the queues it names, each with its own slots."""

from __future__ import annotations

from .target import Conformance

__all__ = ["QueueRules"]


class QueueRules:
    async def test_a_claim_serves_only_the_queues_it_names(self, jobs: Conformance) -> None:
        await jobs.enqueue(queue="mail")
        billing = await jobs.enqueue(queue="billing")
        assert await jobs.claimed_ids("billing") == [billing.id]
        assert await jobs.claimed_ids("billing") == []
        assert (await jobs.queue_stats("mail")).ready == 1

    async def test_slots_are_counted_per_queue(self, jobs: Conformance) -> None:
        for _ in range(3):
            await jobs.enqueue(queue="a")
            await jobs.enqueue(queue="b")
        batch = await jobs.claim(queues={"a": 1, "b": 2})
        assert sorted(job.queue for job in batch.jobs) == ["a", "b", "b"]

    async def test_an_older_row_elsewhere_does_not_block_a_queue(self, jobs: Conformance) -> None:
        await jobs.enqueue(queue="a", delay=-60)
        b = await jobs.enqueue(queue="b")
        assert await jobs.claimed_ids("b") == [b.id]

    async def test_a_queue_with_no_slot_is_not_served(self, jobs: Conformance) -> None:
        await jobs.enqueue(queue="a")
        b = await jobs.enqueue(queue="b")
        batch = await jobs.claim(queues={"a": 0, "b": 1})
        assert [job.id for job in batch.jobs] == [b.id]

    async def test_a_claimed_job_names_its_queue(self, jobs: Conformance) -> None:
        await jobs.enqueue(queue="reports")
        assert (await jobs.claim_one("reports")).queue == "reports"
