"""Cron occurrences in a task's own timezone, right on the days the clocks change.

A cron expression names WALL times (``0 3 * * *``: three o'clock on the clock on the wall).
Evaluated naively, a DST zone runs such a task twice on the autumn switch day and not at all on
the spring one. The resolution here maps every wall time the expression names to exactly one
instant:

======================================  ================================================
the wall time exists once               that instant
the wall time falls in the spring gap   the first instant after the gap — the moment the
(it never shows on the clock)           clocks jump (as Debian's cron runs it)
the wall time shows twice (autumn)      its first instance only — unless the expression
                                        has a ``*`` in its minute or hour field: then both
======================================  ================================================

so a daily task fires exactly once per local day, and several wall times inside one gap collapse
into the one instant after it. The exception is Debian's too: a schedule written with a wildcard
in its minute or hour (every minute, every quarter hour, hourly) keeps its pace through the
repeated hour instead of falling silent for it. Croniter iterates the wall times (naive
datetimes, so it applies no DST logic of its own); the mapping to instants is ours.

``latest_occurrence`` finds the last occurrence before an instant by bisection over the gap (about
25 cron evaluations for three hours, 35 for a year), which is what a ``skip`` catch-up fires.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from .clock import utc
from .errors import CronUnavailableError

__all__ = [
    "croniter_module",
    "instant_of",
    "latest_occurrence",
    "next_occurrence",
    "occurrence_ms",
]

_MS = timedelta(milliseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_REPEAT_MAX = timedelta(hours=3)
"""Longer than any autumn shift of a zone's clocks (an hour nearly everywhere)."""


def croniter_module() -> Any:
    """croniter, which task() needs, or a clear error naming the extra that brings it."""
    try:
        import croniter
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise CronUnavailableError(
            "task() needs croniter: pip install 'ultimat3-jobs-core[cron]'"
        ) from exc
    return croniter


def occurrence_ms(instant: datetime) -> int:
    """An occurrence's identity: epoch milliseconds, as rows and watermarks carry it (integer
    arithmetic: a float timestamp rounds some instants a millisecond short)."""
    return (utc(instant) - _EPOCH) // _MS


def instant_of(occurrence: int) -> datetime:
    return _EPOCH + occurrence * _MS


def next_occurrence(cron: str, zone: ZoneInfo, after: datetime) -> datetime:
    """The first occurrence of ``cron`` in ``zone`` strictly after the instant ``after``."""
    after = utc(after)
    # The instant a wall time maps to never decreases as the wall time grows, so no wall time
    # before ``after``'s own can map past it: the walk starts there.
    walls = croniter_module().croniter(cron, after.astimezone(zone).replace(tzinfo=None))
    while True:
        instant = _instant(walls.get_next(datetime), zone)
        if instant > after:
            break
    # A second pass after ``after`` starts within _REPEAT_MAX of it: the clocks must go back in
    # that window (not only by ``instant``, which a sparse cron may put a season or a year on,
    # where the offset is back to what it was).
    if _keeps_pace(cron) and _clocks_go_back(
        zone, after - _REPEAT_MAX, min(instant, after + _REPEAT_MAX)
    ):
        return _second_pass(cron, zone, after, instant) or instant
    return instant


def _keeps_pace(cron: str) -> bool:
    """Whether the schedule fires on both passes of a repeated hour: a ``*`` in its minute or
    hour field (``@hourly`` among the macros)."""
    if cron.startswith("@"):
        return cron.strip().lower() == "@hourly"  # croniter reads macros in any case
    minute, hour = cron.split()[:2]
    return "*" in minute or "*" in hour


def _clocks_go_back(zone: ZoneInfo, start: datetime, end: datetime) -> bool:
    """Whether ``zone``'s clocks are set back between the two instants (so wall times repeat)."""
    before, after = start.astimezone(zone).utcoffset(), end.astimezone(zone).utcoffset()
    assert before is not None  # an aware datetime in a ZoneInfo always has one
    assert after is not None
    return after < before


def _second_pass(cron: str, zone: ZoneInfo, after: datetime, bound: datetime) -> datetime | None:
    """The earliest second instance of a repeated wall time ``cron`` names, after ``after`` and
    before ``bound`` (the first-pass occurrence), or None."""
    start = (after - _REPEAT_MAX).astimezone(zone).replace(tzinfo=None)
    walls = croniter_module().croniter(cron, start)
    while True:
        wall: datetime = walls.get_next(datetime)
        first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        if first >= bound:
            return None
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        repeated = second != first and second.astimezone(zone).replace(tzinfo=None) == wall
        if repeated and after < second < bound:
            return second


def latest_occurrence(
    cron: str, zone: ZoneInfo, after: datetime, until: datetime
) -> datetime | None:
    """The last occurrence in ``(after, until]``, or None when there is none.

    Bisection keeps ``next_occurrence(low) <= until < next_occurrence(high)``; when the two are a
    millisecond apart, ``next_occurrence(low)`` is the last occurrence before ``until``.
    """
    until = utc(until)
    first = next_occurrence(cron, zone, after)
    if first > until:
        return None
    if next_occurrence(cron, zone, first) > until:
        return first
    low, high = first, until
    while high - low > _MS:
        middle = low + (high - low) / 2
        if next_occurrence(cron, zone, middle) <= until:
            low = middle
        else:
            high = middle
    return next_occurrence(cron, zone, low)


def _instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The one instant a wall time fires at (see the module's table)."""
    instant = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == wall:
        return instant  # it exists; fold=0 is the first of two instances in the autumn
    return _gap_end(wall, zone)


def _gap_end(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant the clocks jumped over ``wall``: the first whose wall time is later."""
    # fold=1 reads a skipped wall time with the offset after the jump, giving an instant before
    # it; fold=0 with the offset before, giving one after.
    low = math.floor(wall.replace(tzinfo=zone, fold=1).timestamp())
    high = math.ceil(wall.replace(tzinfo=zone, fold=0).timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).replace(tzinfo=None) > wall:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)
