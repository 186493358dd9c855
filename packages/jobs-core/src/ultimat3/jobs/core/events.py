"""The event bus ``step.wait_for_event`` matches against, and the in-memory one.

Both sides pick their bus in one order (``resolve_event_bus``): a bus passed explicitly (a
worker's or ``execute_job``'s ``events=``), else the one ``set_event_bus`` installed, else the
driver's own (when it offers one), else this process's memory bus. ``publish_event`` passes no bus
and knows no driver but the installed one, so with the worker's driver installed
(``set_job_driver``) and no ``events=`` given anywhere, an answer and its wait share one bus.

``reset_event_bus`` is the test seam beside ``reset_job_driver``: an event stays matchable until
it expires, so one test's answer would otherwise resume the next test's wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from copy import deepcopy
from dataclasses import replace
from datetime import datetime, timedelta

from .clock import SYSTEM_CLOCK, Clock
from .constants import DEFAULT_EVENT_TTL_S
from .errors import InvariantError
from .facade import installed_driver
from .ids import new_id
from .jsonvalue import json_contains, storable_text, stored_json
from .model import EventRecord, JsonValue
from .protocol import EventBus, JobDriver

__all__ = [
    "MemoryEventBus",
    "event_bus",
    "event_json",
    "event_name",
    "memory_event_bus",
    "publish_event",
    "reset_event_bus",
    "resolve_event_bus",
    "set_event_bus",
]


def event_name(event: str) -> str:
    """``event``, refused (``X_INVARIANT``) unless every bus can store it: a non-empty string
    with no NUL character and no lone surrogate. Every bus checks, so all refuse alike."""
    if not isinstance(event, str) or not event or not storable_text(event):
        raise InvariantError(
            f"an event name must be a non-empty string with no NUL character and no lone "
            f"surrogate, got {event!r:.80}",
            meta={"field": "event"},
        )
    return event


def event_json(value: object, field: str) -> JsonValue:
    """A payload or match as every bus stores and compares it, refused (``X_INVARIANT``) where no
    bus stores it alike (``stored_json``)."""
    return stored_json(value, f"an event's {field}", field)


class MemoryEventBus:
    """Events in one process's heap, on one clock (the one it was given)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._events: list[EventRecord] = []

    async def publish(
        self, event: str, payload: JsonValue, *, ttl: float | None = None
    ) -> EventRecord:
        now = self._clock.now()
        record = EventRecord(
            id=new_id(),
            event=event_name(event),
            payload=event_json(payload, "payload"),
            published_at=now,
            expires_at=now + timedelta(seconds=DEFAULT_EVENT_TTL_S if ttl is None else ttl),
        )
        self._events.append(record)
        return replace(record, payload=deepcopy(record.payload))

    async def lookup(
        self,
        event: str,
        *,
        since: datetime,
        until: datetime | None = None,
        match: Mapping[str, JsonValue] | None = None,
    ) -> EventRecord | None:
        event_name(event)
        pattern = None if match is None else event_json(match, "match")  # as a payload is stored
        now = self._clock.now()
        for record in self._events:
            if (
                record.event == event
                and record.published_at >= since
                and (until is None or record.published_at <= until)
                and record.expires_at > now
                and (pattern is None or json_contains(record.payload, pattern))
            ):
                return replace(record, payload=deepcopy(record.payload))  # as a server's copy
        return None

    async def now(self) -> datetime:
        return self._clock.now()

    async def purge_expired(self) -> int:
        now = self._clock.now()
        kept = [record for record in self._events if record.expires_at > now]
        removed = len(self._events) - len(kept)
        self._events = kept
        return removed

    def clear(self) -> None:
        self._events.clear()


def memory_event_bus(clock: Clock = SYSTEM_CLOCK) -> MemoryEventBus:
    return MemoryEventBus(clock)


_installed: EventBus | None = None
_memory = MemoryEventBus()


def set_event_bus(bus: EventBus | None) -> None:
    global _installed
    _installed = bus


def resolve_event_bus(
    events: EventBus | None = None, *, driver: JobDriver | None = None
) -> EventBus:
    """The bus to publish on or wait on, the one order both sides use: ``events`` when given,
    else the bus ``set_event_bus`` installed, else ``driver``'s own (the installed driver's
    when ``driver`` is None or offers none), else this process's memory bus."""
    if events is not None:
        return events
    if _installed is not None:
        return _installed
    if driver is not None and driver.events is not None:
        return driver.events
    installed = installed_driver()
    if installed is not None and installed.events is not None:
        return installed.events
    return _memory


def event_bus() -> EventBus:
    """The bus ``publish_event`` goes to: see ``resolve_event_bus``."""
    return resolve_event_bus()


def reset_event_bus() -> None:
    """Forget the events of every in-memory bus this process publishes to, and un-install the
    bus ``set_event_bus`` installed (as ``reset_job_driver`` forgets the driver).

    Cleared: the process's memory bus, the installed bus and the installed driver's own bus,
    each only when it is a ``MemoryEventBus`` — so call it while the driver of the tests is
    still installed (before ``reset_job_driver``). A bus on a server (Postgres, Redis) keeps
    its events: other processes read it too, and only ``purge_expired`` removes them; tests on
    one give their events names or payloads of their own."""
    global _installed
    installed = installed_driver()
    for bus in (_installed, installed.events if installed is not None else None, _memory):
        if isinstance(bus, MemoryEventBus):
            bus.clear()
    _installed = None


async def publish_event(event: str, payload: JsonValue, *, ttl: float | None = None) -> EventRecord:
    """Publish on ``event_bus()``: the bus ``set_event_bus`` installed, else the installed
    driver's own, else this process's memory bus. A run's ``step.wait_for_event`` reads the
    same bus unless its worker (or ``execute_job``/``run_jobs``) was handed ``events=``."""
    return await event_bus().publish(event, payload, ttl=ttl)
