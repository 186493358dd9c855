"""Cron resolution in real IANA zones, on the days their clocks change.

Both hemispheres, a one-hour and a thirty-minute shift, switches at 02:00, 01:00 UTC and midnight,
and zones whose offset is not a whole hour.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ultimat3.jobs.core import cron as cron_module
from ultimat3.jobs.core.cron import latest_occurrence, next_occurrence

ZONES = [
    "America/New_York",  # north, 02:00 local, one hour
    "Europe/London",  # north, 01:00 UTC
    "Australia/Sydney",  # south, one hour
    "Australia/Adelaide",  # south, +9:30/+10:30
    "Australia/Lord_Howe",  # south, a thirty-minute shift
    "America/Santiago",  # south, switches at midnight
    "Pacific/Chatham",  # +12:45/+13:45
    "Asia/Kolkata",  # +5:30, no DST at all
]


def local(instant: datetime, tz: str) -> str:
    return instant.astimezone(ZoneInfo(tz)).isoformat()


def fires(cron: str, tz: str, start: datetime, until: datetime) -> list[datetime]:
    zone, found, at = ZoneInfo(tz), [], start
    while (at := next_occurrence(cron, zone, at)) <= until:
        found.append(at)
    return found


def local_day(tz: str, day: date) -> tuple[datetime, datetime]:
    """From just before the local midnight that opens ``day`` to the one that closes it."""
    zone = ZoneInfo(tz)
    opens = datetime.combine(day, datetime.min.time(), zone) - timedelta(milliseconds=1)
    closes = datetime.combine(day + timedelta(days=1), datetime.min.time(), zone)
    return opens, closes - timedelta(milliseconds=1)


YEAR = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    ("tz", "cron"),
    [
        ("America/New_York", "30 2 * * *"),  # in the March gap
        ("America/New_York", "30 1 * * *"),  # in the November repeat
        ("Europe/London", "30 1 * * *"),  # both: gap in March, repeat in October
        ("Australia/Sydney", "30 2 * * *"),  # both, southern dates
        ("Australia/Adelaide", "15 2 * * *"),
        ("Australia/Lord_Howe", "15 2 * * *"),  # gap 02:00-02:30 in October
        ("Australia/Lord_Howe", "45 1 * * *"),  # repeat 01:30-02:00 in April
        ("America/Santiago", "30 0 * * *"),  # the midnight gap in September
        ("America/Santiago", "30 23 * * *"),  # the repeat before midnight in April
        ("Pacific/Chatham", "0 3 * * *"),  # gap 02:45-03:45, repeat 02:45-03:45
        ("Asia/Kolkata", "0 9 * * *"),
    ],
)
def test_a_daily_task_fires_exactly_once_per_local_day(tz: str, cron: str) -> None:
    start, end = YEAR
    days = Counter(at.astimezone(ZoneInfo(tz)).date() for at in fires(cron, tz, start, end))
    first = start.astimezone(ZoneInfo(tz)).date()
    last = end.astimezone(ZoneInfo(tz)).date()
    expected = {first + timedelta(days=i) for i in range((last - first).days + 1)}
    assert set(days) <= expected
    assert len(days) >= 364
    assert max(days.values()) == 1


@pytest.mark.parametrize(
    ("tz", "cron", "day", "fired"),
    [
        ("America/New_York", "30 2 * * *", date(2026, 3, 8), "2026-03-08T03:00:00-04:00"),
        ("Europe/London", "30 1 * * *", date(2026, 3, 29), "2026-03-29T02:00:00+01:00"),
        ("Australia/Sydney", "30 2 * * *", date(2026, 10, 4), "2026-10-04T03:00:00+11:00"),
        ("Australia/Adelaide", "15 2 * * *", date(2026, 10, 4), "2026-10-04T03:00:00+10:30"),
        ("Australia/Lord_Howe", "15 2 * * *", date(2026, 10, 4), "2026-10-04T02:30:00+11:00"),
        ("America/Santiago", "30 0 * * *", date(2026, 9, 6), "2026-09-06T01:00:00-03:00"),
        ("Pacific/Chatham", "0 3 * * *", date(2026, 9, 27), "2026-09-27T03:45:00+13:45"),
    ],
)
def test_an_occurrence_in_the_spring_gap_fires_at_the_first_instant_after_it(
    tz: str, cron: str, day: date, fired: str
) -> None:
    (occurrence,) = fires(cron, tz, *local_day(tz, day))
    assert local(occurrence, tz) == fired


@pytest.mark.parametrize(
    ("tz", "cron", "day", "fired"),
    [
        ("America/New_York", "30 1 * * *", date(2026, 11, 1), "2026-11-01T01:30:00-04:00"),
        ("Europe/London", "30 1 * * *", date(2026, 10, 25), "2026-10-25T01:30:00+01:00"),
        ("Australia/Sydney", "30 2 * * *", date(2026, 4, 5), "2026-04-05T02:30:00+11:00"),
        ("Australia/Adelaide", "15 2 * * *", date(2026, 4, 5), "2026-04-05T02:15:00+10:30"),
        ("Australia/Lord_Howe", "45 1 * * *", date(2026, 4, 5), "2026-04-05T01:45:00+11:00"),
        ("America/Santiago", "30 23 * * *", date(2026, 4, 4), "2026-04-04T23:30:00-03:00"),
        ("Pacific/Chatham", "0 3 * * *", date(2026, 4, 5), "2026-04-05T03:00:00+13:45"),
    ],
)
def test_an_occurrence_in_the_repeated_hour_fires_once_at_its_first_instance(
    tz: str, cron: str, day: date, fired: str
) -> None:
    (occurrence,) = fires(cron, tz, *local_day(tz, day))
    assert local(occurrence, tz) == fired


def test_occurrences_inside_one_gap_collapse_into_one_fire() -> None:
    start = datetime(2026, 3, 8, 6, 30, tzinfo=UTC)  # 01:30 EST
    found = fires("*/15 * * * *", "America/New_York", start, start + timedelta(hours=1))
    assert [local(at, "America/New_York") for at in found] == [
        "2026-03-08T01:45:00-05:00",
        "2026-03-08T03:00:00-04:00",  # 02:00, 02:15, 02:30, 02:45 and 03:00 itself: one fire
        "2026-03-08T03:15:00-04:00",
        "2026-03-08T03:30:00-04:00",
    ]


def test_an_hourly_task_fires_on_both_passes_of_the_repeated_hour() -> None:
    """A wildcard in the hour field keeps the pace through the repeated hour (Debian's rule)."""
    start = datetime(2026, 11, 1, 4, 30, tzinfo=UTC)  # 00:30 EDT
    found = fires("0 * * * *", "America/New_York", start, start + timedelta(hours=4))
    assert [local(at, "America/New_York") for at in found] == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T02:00:00-05:00",
        "2026-11-01T03:00:00-05:00",
    ]


@pytest.mark.parametrize("cron", ["@hourly", "@HOURLY", "@Hourly"])
def test_the_hourly_macro_keeps_its_pace_in_any_case(cron: str) -> None:
    """croniter reads a macro in any case: so does the rule for the repeated hour."""
    start = datetime(2026, 11, 1, 4, 30, tzinfo=UTC)  # 00:30 EDT
    found = fires(cron, "America/New_York", start, start + timedelta(hours=2, minutes=30))
    assert [local(at, "America/New_York") for at in found] == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T02:00:00-05:00",
    ]


@pytest.mark.parametrize(
    ("cron", "tz", "start", "expected"),
    [
        (
            "*/30 2 * 10 0",  # Sundays of October only: the next first pass is a year away
            "Europe/Paris",
            datetime(2026, 10, 25, 0, 15, tzinfo=UTC),  # 02:15 CEST, the first pass
            ["2026-10-25T02:30:00+02:00", "2026-10-25T02:00:00+01:00", "2026-10-25T02:30:00+01:00"],
        ),
        (
            "*/15 1 1 11 *",  # the first of November only
            "America/New_York",
            datetime(2026, 11, 1, 5, 50, tzinfo=UTC),  # 01:50 EDT, the first pass
            [f"2026-11-01T01:{m:02d}:00-05:00" for m in (0, 15, 30, 45)],
        ),
    ],
)
def test_a_sparse_cron_fires_the_second_pass_of_the_repeated_hour(
    cron: str, tz: str, start: datetime, expected: list[str]
) -> None:
    """Its next first-pass match lies a season or a year on, where the offset is back to the
    summer one: the clocks going back in between were missed, and the second pass with them."""
    found = fires(cron, tz, start, start + timedelta(hours=3))
    assert [local(at, tz) for at in found] == expected


@pytest.mark.parametrize("tz", ["America/New_York", "Europe/London", "Australia/Lord_Howe"])
def test_a_quarter_hourly_task_never_pauses_on_the_autumn_switch_day(tz: str) -> None:
    zone = ZoneInfo(tz)
    switch = next(  # the 2026 instant the clocks go back
        at
        for name, at in TRANSITIONS
        if name == tz
        and at.astimezone(zone).utcoffset()
        < (at - timedelta(minutes=15)).astimezone(zone).utcoffset()
    )
    found = fires("*/15 * * * *", tz, switch - timedelta(hours=3), switch + timedelta(hours=3))
    assert max(b - a for a, b in pairwise(found)) == timedelta(minutes=15)


def test_a_task_starting_inside_the_second_pass_waits_for_the_wall_clock_to_move_on() -> None:
    inside = datetime(2026, 11, 1, 6, 10, tzinfo=UTC)  # 01:10 EST, the second 01:10
    zone = ZoneInfo("America/New_York")
    assert local(next_occurrence("30 1 * * *", zone, inside), "America/New_York") == (
        "2026-11-02T01:30:00-05:00"
    )


def test_a_zone_without_dst_keeps_its_half_hour_offset() -> None:
    found = fires("0 9 * * *", "Asia/Kolkata", *YEAR)
    assert {at.astimezone(UTC).strftime("%H:%M") for at in found} == {"03:30"}


def test_the_next_occurrence_is_strictly_after_the_instant_given() -> None:
    at = datetime(2026, 5, 1, 3, 0, tzinfo=UTC)
    assert next_occurrence("0 3 * * *", ZoneInfo("UTC"), at) == at + timedelta(days=1)


def test_the_latest_occurrence_of_a_year_takes_about_thirty_five_evaluations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0
    real = cron_module.next_occurrence

    def counted(cron: str, zone: ZoneInfo, after: datetime) -> datetime:
        nonlocal calls
        calls += 1
        return real(cron, zone, after)

    monkeypatch.setattr(cron_module, "next_occurrence", counted)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    latest = latest_occurrence("0 3 * * *", ZoneInfo("UTC"), start, start + timedelta(days=365))
    assert latest == datetime(2026, 1, 1, 3, 0, tzinfo=UTC) - timedelta(days=1)
    assert calls <= 40


# -- properties against a brute-force reading of the rules --------------------------------------

TRANSITIONS: list[tuple[str, datetime]] = []
for _tz in ZONES:
    _zone, _at = ZoneInfo(_tz), datetime(2026, 1, 1, tzinfo=UTC)
    while _at < datetime(2027, 1, 1, tzinfo=UTC):
        _next = _at + timedelta(minutes=15)
        if _next.astimezone(_zone).utcoffset() != _at.astimezone(_zone).utcoffset():
            TRANSITIONS.append((_tz, _next))
        _at = _next
TRANSITIONS.append(("Asia/Kolkata", datetime(2026, 6, 1, tzinfo=UTC)))


@st.composite
def schedules(draw: st.DrawFn) -> tuple[str, str, set[int], set[int], datetime]:
    """A minute/hour cron, its zone, the sets it names, and an instant near a clock change."""
    tz, switch = draw(st.sampled_from(TRANSITIONS))
    minute_sets = [
        {draw(st.integers(0, 59))},
        set(range(0, 60, draw(st.sampled_from([5, 10, 15, 20, 30])))),
        set(draw(st.lists(st.integers(0, 59), min_size=2, max_size=4))),
    ]
    minutes = draw(st.sampled_from(minute_sets))
    hours = draw(
        st.sampled_from(
            [
                set(range(24)),
                {draw(st.integers(0, 23))},
                set(draw(st.lists(st.integers(0, 23), min_size=2, max_size=3))),
            ]
        )
    )

    def field(values: set[int], full: int) -> str:
        return "*" if len(values) == full else ",".join(map(str, sorted(values)))

    cron = f"{field(minutes, 60)} {field(hours, 24)} * * *"
    offset = draw(st.integers(-26 * 3600, 3 * 3600))
    return cron, tz, minutes, hours, switch + timedelta(seconds=offset)


def fires_at(instant: datetime, zone: ZoneInfo, minutes: set[int], hours: set[int]) -> bool:
    """The rules, read minute by minute: a wall time that shows fires at its first showing (at
    both, when a field is a wildcard); wall times the clocks jumped over fire at the instant of
    the jump."""

    def named(wall: datetime) -> bool:
        return wall.minute in minutes and wall.hour in hours

    shown = instant.astimezone(zone)
    keeps_pace = len(minutes) == 60 or len(hours) == 24  # a "*" in the minute or hour field
    if (shown.fold == 0 or keeps_pace) and named(shown.replace(tzinfo=None)):
        return True
    before = (instant - timedelta(minutes=1)).astimezone(zone).replace(tzinfo=None)
    wall, skipped = shown.replace(tzinfo=None), before + timedelta(minutes=1)
    while skipped < wall:
        if named(skipped):
            return True
        skipped += timedelta(minutes=1)
    return False


def reference_next(after: datetime, zone: ZoneInfo, minutes: set[int], hours: set[int]) -> datetime:
    at = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while not fires_at(at, zone, minutes, hours):
        at += timedelta(minutes=1)
    return at


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_the_next_occurrence_is_the_first_instant_the_rules_say_fires(
    schedule: tuple[str, str, set[int], set[int], datetime],
) -> None:
    cron, tz, minutes, hours, after = schedule
    zone = ZoneInfo(tz)
    assert next_occurrence(cron, zone, after) == reference_next(after, zone, minutes, hours)


@settings(max_examples=100, deadline=None)
@given(schedules(), st.integers(0, 3 * 86400))
def test_the_bisection_finds_the_same_latest_occurrence_as_a_walk(
    schedule: tuple[str, str, set[int], set[int], datetime], span: int
) -> None:
    cron, tz, _, _, after = schedule
    zone, until = ZoneInfo(tz), after + timedelta(seconds=span)
    walked, at = None, after
    while (at := next_occurrence(cron, zone, at)) <= until:
        walked = at
    assert latest_occurrence(cron, zone, after, until) == walked


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(ZONES), st.integers(0, 23), st.integers(0, 59))
def test_any_daily_time_fires_once_per_local_day_for_a_whole_year(
    tz: str, hour: int, minute: int
) -> None:
    days = Counter(
        at.astimezone(ZoneInfo(tz)).date() for at in fires(f"{minute} {hour} * * *", tz, *YEAR)
    )
    assert max(days.values()) == 1
    assert len(days) >= 364
