"""The event bus: what ``step.wait_for_event`` matches, on the bus's one clock.

The bus may stamp events with its server's clock rather than the suite's, so these rules read
time only through ``bus.now()`` and never move it.
"""

from __future__ import annotations

from datetime import timedelta

from ultimat3.jobs.core.constants import DEFAULT_EVENT_TTL_S

from .target import Conformance

__all__ = ["EventBusRules"]

_TICK = timedelta(milliseconds=1)


class EventBusRules:
    async def test_publish_stamps_the_event_on_the_bus_clock(self, jobs: Conformance) -> None:
        bus = jobs.events
        before = await bus.now()
        record = await bus.publish("invoice.paid", {"invoice": "i-1"})
        after = await bus.now()
        assert before <= record.published_at <= after
        assert (record.event, record.payload) == ("invoice.paid", {"invoice": "i-1"})
        assert record.expires_at == record.published_at + timedelta(seconds=DEFAULT_EVENT_TTL_S)

    async def test_publish_honours_a_ttl(self, jobs: Conformance) -> None:
        record = await jobs.events.publish("e", {}, ttl=60)
        assert record.expires_at == record.published_at + timedelta(seconds=60)

    async def test_lookup_finds_an_event_published_since(self, jobs: Conformance) -> None:
        bus = jobs.events
        since = await bus.now()
        record = await bus.publish("invoice.paid", {"invoice": "i-1"})
        assert await bus.lookup("invoice.paid", since=since) == record

    async def test_lookup_counts_an_event_published_at_since(self, jobs: Conformance) -> None:
        record = await jobs.events.publish("e", {"n": 1})
        assert await jobs.events.lookup("e", since=record.published_at) == record

    async def test_lookup_ignores_events_published_before_since(self, jobs: Conformance) -> None:
        record = await jobs.events.publish("e", {"n": 1})
        assert await jobs.events.lookup("e", since=record.published_at + _TICK) is None

    async def test_lookup_counts_an_event_published_at_until(self, jobs: Conformance) -> None:
        bus = jobs.events
        since = await bus.now()
        first = await bus.publish("e", {"n": 1})
        await bus.publish("e", {"n": 2})
        assert await bus.lookup("e", since=since, until=first.published_at) == first

    async def test_lookup_ignores_events_published_after_until(self, jobs: Conformance) -> None:
        bus = jobs.events
        since = await bus.now()
        record = await bus.publish("e", {"n": 1})
        assert await bus.lookup("e", since=since, until=record.published_at - _TICK) is None

    async def test_lookup_ignores_other_event_names(self, jobs: Conformance) -> None:
        since = await jobs.events.now()
        await jobs.events.publish("invoice.voided", {"invoice": "i-1"})
        assert await jobs.events.lookup("invoice.paid", since=since) is None

    async def test_lookup_matches_by_json_containment(self, jobs: Conformance) -> None:
        bus = jobs.events
        since = await bus.now()
        await bus.publish("paid", {"invoice": "i-1", "org": "o-1"})
        wanted = await bus.publish(
            "paid", {"invoice": "i-2", "org": "o-1", "lines": [{"sku": "a"}, {"sku": "b"}]}
        )
        assert await bus.lookup("paid", since=since, match={"invoice": "i-2"}) == wanted
        assert await bus.lookup("paid", since=since, match={"lines": [{"sku": "b"}]}) == wanted
        assert await bus.lookup("paid", since=since, match={"invoice": "i-3"}) is None
        assert await bus.lookup("paid", since=since, match={"missing": None}) is None

    async def test_lookup_answers_the_earliest_match(self, jobs: Conformance) -> None:
        bus = jobs.events
        since = await bus.now()
        first = await bus.publish("e", {"n": 1})
        await bus.publish("e", {"n": 2})
        assert await bus.lookup("e", since=since) == first

    async def test_an_expired_event_is_not_found(self, jobs: Conformance) -> None:
        since = await jobs.events.now()
        await jobs.events.publish("e", {"n": 1}, ttl=0)
        assert await jobs.events.lookup("e", since=since) is None

    async def test_purge_removes_only_expired_events(self, jobs: Conformance) -> None:
        bus = jobs.events
        since = await bus.now()
        await bus.publish("e", {"n": 1}, ttl=0)
        await bus.publish("e", {"n": 2}, ttl=0)
        kept = await bus.publish("e", {"n": 3})
        assert await bus.purge_expired() == 2
        assert await bus.purge_expired() == 0
        assert await bus.lookup("e", since=since) == kept

    async def test_payloads_round_trip_as_json(self, jobs: Conformance) -> None:
        payload = {"a": [1, 2.5, None, True, "ü"], "b": {"c": {}}}
        since = await jobs.events.now()
        await jobs.events.publish("e", payload)
        found = await jobs.events.lookup("e", since=since)
        assert found is not None
        assert found.payload == payload
