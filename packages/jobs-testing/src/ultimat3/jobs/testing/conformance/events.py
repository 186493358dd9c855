"""The event bus: what ``step.wait_for_event`` matches, on the bus's one clock.

The bus may stamp events with its server's clock rather than the suite's, so these rules read
time only through ``bus.now()`` and never move it.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

import pytest

from ultimat3.jobs.core import InvariantError
from ultimat3.jobs.core.constants import DEFAULT_EVENT_TTL_S

from .target import Conformance, exactly

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

    async def test_lookup_matches_a_nested_object_by_containment(self, jobs: Conformance) -> None:
        bus = jobs.events
        since = await bus.now()
        wanted = await bus.publish("paid", {"customer": {"id": 1, "name": "x"}})
        assert await bus.lookup("paid", since=since, match={"customer": {"id": 1}}) == wanted
        assert await bus.lookup("paid", since=since, match={"customer": {"id": 2}}) is None

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

    async def test_an_event_is_found_until_its_ttl_passes(self, jobs: Conformance) -> None:
        """A bus on the suite's clock sees it move; one on its server's sees real time pass."""
        bus = jobs.events
        since = await bus.now()
        record = await bus.publish("e", {"n": 1}, ttl=2)
        assert await bus.lookup("e", since=since) == record
        jobs.advance(3)
        async with asyncio.timeout(10):
            while await bus.now() <= record.expires_at:
                await asyncio.sleep(0.05)
        assert await bus.lookup("e", since=since) is None

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
        assert exactly(found.payload) == exactly(payload)  # True stays true, 2.5 a float

    async def test_a_payload_with_no_json_form_is_refused_alike(self, jobs: Conformance) -> None:
        """A NaN, an object JSON cannot write: X_INVARIANT on every bus, before anything is
        stored."""
        bus = jobs.events
        since = await bus.now()
        for payload in ({"ratio": math.nan}, {"at": object()}):
            with pytest.raises(InvariantError):
                await bus.publish("e", payload)
        assert await bus.lookup("e", since=since) is None

    async def test_text_no_bus_stores_is_refused_alike(self, jobs: Conformance) -> None:
        """A NUL character or a lone surrogate, in the name or anywhere in the payload or the
        match: Postgres's jsonb keeps neither, so no bus does, and each says so the same way."""
        bus = jobs.events
        for name, payload in [
            ("e\x00", {}),
            ("\ud800", {}),
            ("e", {"s": "a\x00b"}),
            ("e", {"k\x00": 1}),
            ("e", {"list": ["\udfff"]}),
        ]:
            with pytest.raises(InvariantError):
                await bus.publish(name, payload)
        with pytest.raises(InvariantError):
            await bus.lookup("e", since=await bus.now(), match={"s": "\x00"})
