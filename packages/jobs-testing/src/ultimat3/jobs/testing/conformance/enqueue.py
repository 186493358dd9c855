"""Enqueue: what inserts a row, and what answers the row already there."""

from __future__ import annotations

from ultimat3.jobs.core import Enqueued, JobState

from .target import Conformance

__all__ = ["EnqueueRules"]


class EnqueueRules:
    async def test_enqueue_answers_the_request_ids(self, jobs: Conformance) -> None:
        request = jobs.request()
        assert await jobs.driver.enqueue(request) == Enqueued(request.id, request.run_id)

    async def test_a_row_due_now_is_ready(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        stats = await jobs.queue_stats()
        assert (stats.ready, stats.delayed) == (1, 0)

    async def test_a_row_due_in_the_past_is_ready(self, jobs: Conformance) -> None:
        await jobs.enqueue(delay=-60)
        stats = await jobs.queue_stats()
        assert (stats.ready, stats.delayed) == (1, 0)

    async def test_a_row_due_later_is_delayed(self, jobs: Conformance) -> None:
        await jobs.enqueue(delay=5)
        stats = await jobs.queue_stats()
        assert (stats.ready, stats.delayed) == (0, 1)

    async def test_a_live_key_dedupes_to_the_row_holding_it(self, jobs: Conformance) -> None:
        first = await jobs.enqueue(key="k")
        again = await jobs.enqueue(key="k")
        assert again == Enqueued(first.id, first.run_id, deduped=True)
        assert (await jobs.queue_stats()).ready == 1

    async def test_dedupe_is_per_tenant(self, jobs: Conformance) -> None:
        a = await jobs.enqueue(key="k", tenant="org-a")
        b = await jobs.enqueue(key="k", tenant="org-b")
        assert not b.deduped
        assert a.id != b.id
        assert (await jobs.queue_stats()).ready == 2

    async def test_a_none_tenant_is_its_own_tenant(self, jobs: Conformance) -> None:
        await jobs.enqueue(key="k", tenant="org-a")
        untenanted = await jobs.enqueue(key="k", tenant=None)
        assert not untenanted.deduped
        again = await jobs.enqueue(key="k", tenant=None)
        assert again == Enqueued(untenanted.id, untenanted.run_id, deduped=True)
        assert (await jobs.queue_stats()).ready == 2

    async def test_dedupe_is_per_job_name(self, jobs: Conformance) -> None:
        await jobs.enqueue(name="one", key="k")
        other = await jobs.enqueue(name="two", key="k")
        assert not other.deduped

    async def test_dedupe_spans_queues(self, jobs: Conformance) -> None:
        first = await jobs.enqueue(key="k", queue="a")
        again = await jobs.enqueue(key="k", queue="b")
        assert again == Enqueued(first.id, first.run_id, deduped=True)
        assert set(await jobs.stats()) == {"a"}

    async def test_a_delayed_row_holds_its_key(self, jobs: Conformance) -> None:
        first = await jobs.enqueue(key="k", delay=60)
        assert (await jobs.enqueue(key="k")).id == first.id

    async def test_a_running_row_holds_its_key(self, jobs: Conformance) -> None:
        held = await jobs.running(key="k")
        again = await jobs.enqueue(key="k", queue=held.queue)
        assert again == Enqueued(held.id, held.run_id, deduped=True)

    async def test_a_suspended_row_holds_its_key(self, jobs: Conformance) -> None:
        held = await jobs.running(key="k")
        assert await jobs.nack(held, park=True, run_at=jobs.at(60))
        assert (await jobs.enqueue(key="k", queue=held.queue)).id == held.id

    async def test_a_done_row_frees_its_key(self, jobs: Conformance) -> None:
        held = await jobs.running(key="k")
        assert await jobs.ack(held)
        again = await jobs.enqueue(key="k", queue=held.queue)
        assert not again.deduped
        assert again.id != held.id

    async def test_a_dead_row_frees_its_key(self, jobs: Conformance) -> None:
        held = await jobs.running(key="k")
        assert await jobs.nack(held, dead_letter=True)
        assert not (await jobs.enqueue(key="k", queue=held.queue)).deduped

    async def test_an_id_naming_a_live_row_inserts_nothing(self, jobs: Conformance) -> None:
        first = await jobs.enqueue()
        again = await jobs.enqueue(id=first.id, key="another-key", run_id="another-run")
        assert again == Enqueued(first.id, first.run_id, deduped=True)
        assert (await jobs.queue_stats()).ready == 1

    async def test_an_id_naming_a_finished_row_inserts_nothing(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.ack(held)
        again = await jobs.enqueue(id=held.id, queue=held.queue)
        assert again == Enqueued(held.id, held.run_id, deduped=True)
        stats = await jobs.queue_stats(held.queue)
        assert (stats.ready, stats.done) == (0, 1)

    async def test_an_id_naming_a_row_wins_over_a_live_key(self, jobs: Conformance) -> None:
        first = await jobs.enqueue(key="k")
        other = await jobs.enqueue(key="other")
        again = await jobs.enqueue(id=other.id, key="k")
        assert again == Enqueued(other.id, other.run_id, deduped=True)
        assert again.id != first.id

    async def test_enqueue_many_answers_in_request_order(self, jobs: Conformance) -> None:
        requests = [jobs.request(), jobs.request(delay=10), jobs.request(queue="other")]
        answers = await jobs.driver.enqueue_many(requests)
        assert answers == [Enqueued(r.id, r.run_id) for r in requests]
        stats = await jobs.stats()
        assert (stats["q"].ready, stats["q"].delayed, stats["other"].ready) == (1, 1, 1)

    async def test_enqueue_many_dedupes_within_one_call(self, jobs: Conformance) -> None:
        first, second = jobs.request(key="k"), jobs.request(key="k")
        answers = await jobs.driver.enqueue_many([first, second])
        assert answers == [
            Enqueued(first.id, first.run_id),
            Enqueued(first.id, first.run_id, deduped=True),
        ]

    async def test_enqueue_many_dedupes_against_existing_rows(self, jobs: Conformance) -> None:
        held = await jobs.enqueue(key="k")
        fresh = jobs.request()
        answers = await jobs.driver.enqueue_many([jobs.request(key="k"), fresh])
        assert answers == [Enqueued(held.id, held.run_id, True), Enqueued(fresh.id, fresh.run_id)]

    async def test_enqueue_many_of_nothing_answers_nothing(self, jobs: Conformance) -> None:
        assert await jobs.driver.enqueue_many([]) == []
        assert await jobs.driver.stats() == []

    async def test_a_claimed_row_carries_what_was_enqueued(self, jobs: Conformance) -> None:
        payload = {"org": "o-1", "items": [1, 2.5, None, True], "note": "héllo ✓", "n": {"x": []}}
        request = jobs.request(
            name="carried",
            key="key-1",
            tenant="org-1",
            max_attempts=4,
            input=payload,
            enqueued_by="user:7",
            traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            delay=-5,
        )
        created = jobs.now()
        await jobs.driver.enqueue(request)
        jobs.advance(1)
        claimed = await jobs.claim_one()
        assert (claimed.id, claimed.run_id, claimed.name, claimed.queue) == (
            request.id,
            request.run_id,
            "carried",
            "q",
        )
        assert claimed.input == payload
        assert (claimed.idempotency_key, claimed.tenant_id) == ("key-1", "org-1")
        assert (claimed.attempt, claimed.max_attempts) == (1, 4)
        assert (claimed.run_at, claimed.created_at) == (request.run_at, created)
        assert (claimed.enqueued_by, claimed.traceparent) == (
            request.enqueued_by,
            request.traceparent,
        )
        assert claimed.steps == {}

    async def test_the_operator_sees_a_new_row_as_enqueued(self, jobs: Conformance) -> None:
        request = jobs.request(tenant="org-1", delay=30, enqueued_by="user:7")
        await jobs.driver.enqueue(request)
        row = await jobs.row(request.id)
        assert row.state is JobState.DELAYED
        assert (row.attempt, row.max_attempts, row.run_at) == (0, 3, request.run_at)
        assert (row.created_at, row.updated_at) == (jobs.now(), jobs.now())
        assert (row.finished_at, row.last_error, row.progress) == (None, None, None)
        assert (row.worker_id, row.lease_until) == (None, None)
        assert (row.tenant_id, row.enqueued_by, row.input) == ("org-1", "user:7", request.input)

    async def test_a_row_keeps_the_input_it_was_enqueued_with(self, jobs: Conformance) -> None:
        """A server stores bytes: what the enqueuer, a body or a reader later does to the values
        it holds never changes what the next attempt receives."""
        request = jobs.request(input={"items": [1]})
        await jobs.driver.enqueue(request)
        request.input["items"].append("changed by the enqueuer")
        held = await jobs.claim_one()
        assert held.input == {"items": [1]}
        held.input["items"].append("changed by the body")
        row = await jobs.row(held.id)
        assert row.input == {"items": [1]}
        row.input["items"].append("changed by a reader")
        assert (await jobs.lapse_and_reclaim(held)).input == {"items": [1]}
        assert (await jobs.row(held.id)).input == {"items": [1]}
