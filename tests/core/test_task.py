"""task() declarations: cron and an IANA timezone, checked where they are written."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ultimat3.jobs.core import JobDeclarationInvalidError, JobFilter, job, task
from ultimat3.jobs.core.memory import MemoryJobDriver


@dataclass
class Day:
    day: str


@job(input=Day, idempotency_key=lambda i: f"digest:{i.day}", tenant="none")
async def send_digest_for_tasks(*, input: Day) -> None:
    return None


@pytest.mark.parametrize(
    "tz",
    [
        "Bogota",
        "",
        "UTC+5",
        "Mars/Olympus",
        "localtime",
        "Factory",
        "posixrules",
        "right/Europe/Paris",
        "right/UTC",
        "posix/Europe/Paris",
        "America",  # a directory of the zone database
        "America/Argentina",
        "A" * 300,  # a name no file system holds
    ],
)
def test_a_tz_that_is_not_an_iana_zone_is_refused(tz: str) -> None:
    with pytest.raises(JobDeclarationInvalidError, match="tz"):
        task(cron="0 3 * * *", tz=tz, enqueue=list)


def test_a_malformed_cron_is_refused() -> None:
    with pytest.raises(JobDeclarationInvalidError, match="cron"):
        task(cron="every night", tz="UTC", enqueue=list)


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6 *"])
def test_a_cron_naming_a_date_that_never_comes_is_refused_where_it_is_declared(
    cron: str,
) -> None:
    """It parses, and would stop the scheduler's every round when it looked for the next fire."""
    with pytest.raises(JobDeclarationInvalidError, match="never comes"):
        task(cron=cron, tz="UTC", enqueue=list)


@pytest.mark.parametrize("cron", ["R * * * *", "H * * * *", "0 H/4 * * *", "H(0-29) 3 * * *"])
def test_a_cron_that_picks_a_random_or_hashed_value_is_refused(cron: str) -> None:
    """Every computation of its next occurrence would pick its own minute: two nodes, or two
    rounds, would not agree on the instant that names the occurrence."""
    with pytest.raises(JobDeclarationInvalidError, match="random or hashed") as caught:
        task(cron=cron, tz="UTC", enqueue=list)
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"


@pytest.mark.parametrize("cron", ["0 9 * * THU", "0 9 1 MAR *", "0 9 * * MON-FRI"])
def test_day_and_month_names_are_not_taken_for_hashed_values(cron: str) -> None:
    assert task(cron=cron, tz="UTC", enqueue=list).cron == cron


def _keyword_only(*, day: int) -> list[object]:
    return []


def _two_positional(occurrence: int, other: int) -> list[object]:
    return []


@pytest.mark.parametrize("enqueue", [_keyword_only, _two_positional])
def test_an_enqueue_that_takes_neither_the_occurrence_nor_nothing_is_refused(
    enqueue: object,
) -> None:
    """Every describe() and every fire would raise TypeError, and each occurrence be passed over."""
    with pytest.raises(JobDeclarationInvalidError, match="must take the occurrence") as caught:
        task(cron="0 3 * * *", tz="UTC", enqueue=enqueue)  # type: ignore[call-overload]
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"


def _optional_occurrence(occurrence: int = 0) -> list[tuple[object, Day]]:
    return [(send_digest_for_tasks, Day(str(occurrence)))]


def _optional_keyword(*, occurrence: int = 0) -> list[tuple[object, Day]]:
    return [(send_digest_for_tasks, Day(str(occurrence)))]


def test_an_enqueue_that_may_take_the_occurrence_is_handed_it() -> None:
    declared = task(cron="0 3 * * *", tz="UTC", enqueue=_optional_occurrence)  # type: ignore[arg-type]
    assert declared.entries(7) == [(send_digest_for_tasks, Day("7"))]


def test_an_enqueue_that_cannot_take_it_positionally_is_called_with_nothing() -> None:
    declared = task(cron="0 3 * * *", tz="UTC", enqueue=_optional_keyword)  # type: ignore[arg-type]
    assert declared.entries(7) == [(send_digest_for_tasks, Day("0"))]


@pytest.mark.parametrize("cron", ["0 3 * * * *", "*/10 * * * * *", "0 0 3 * * * 2027"])
def test_a_cron_with_more_than_five_fields_is_refused(cron: str) -> None:
    """One parser reads a sixth field as seconds, another as years."""
    with pytest.raises(JobDeclarationInvalidError, match="five fields"):
        task(cron=cron, tz="UTC", enqueue=list)


@pytest.mark.parametrize(
    "cron", ["0 0 29 2 *", "0 0 31 1,2 *", "0 0 L * *", "@hourly", "5 4 * * 5#2"]
)
def test_unusual_but_real_dates_are_accepted(cron: str) -> None:
    assert task(cron=cron, tz="UTC", enqueue=list).cron == cron


def test_catch_up_and_max_catch_up_are_checked() -> None:
    with pytest.raises(JobDeclarationInvalidError):
        task(cron="0 3 * * *", tz="UTC", enqueue=list, catch_up="some")  # type: ignore[arg-type]
    with pytest.raises(JobDeclarationInvalidError):
        task(cron="0 3 * * *", tz="UTC", enqueue=list, max_catch_up=0)


async def _entries_later() -> list[object]:
    return []


class _AsyncEntries:
    async def __call__(self) -> list[object]:
        return []


@pytest.mark.parametrize("enqueue", [_entries_later, _AsyncEntries()], ids=["def", "__call__"])
def test_an_async_enqueue_is_refused_where_the_task_is_declared(enqueue: object) -> None:
    """describe() and every fire call it without awaiting: it would fail at each of them."""
    with pytest.raises(JobDeclarationInvalidError, match="not an async one") as caught:
        task(cron="0 3 * * *", tz="UTC", enqueue=enqueue)  # type: ignore[call-overload]
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"


def test_describe_lists_the_jobs_in_declaration_order() -> None:
    nightly = task(
        cron="0 3 * * *",
        tz="Europe/Paris",
        enqueue=lambda: [(send_digest_for_tasks, Day("a"))],
        catch_up="run-once",
        name="tests.nightly_digest",
    )
    described = nightly.describe()
    assert (described.kind, described.cron, described.tz, described.catch_up) == (
        "task",
        "0 3 * * *",
        "Europe/Paris",
        "run-once",
    )
    assert described.jobs == ["send_digest_for_tasks"]
    assert described.max_catch_up == 10


def test_the_decorator_form_takes_the_occurrence() -> None:
    @task(cron="*/5 * * * *", tz="UTC")
    def every_five(occurrence_ms: int) -> list[tuple[object, Day]]:
        return [(send_digest_for_tasks, Day(str(occurrence_ms)))]

    [(handle, value)] = every_five.entries(300_000)
    assert handle is send_digest_for_tasks
    assert value == Day("300000")


@pytest.mark.parametrize(
    "produced",
    [
        [("send_digest", {})],
        (send_digest_for_tasks, Day("1")),  # one pair, not a list of pairs
        [send_digest_for_tasks],
        [(send_digest_for_tasks, Day("1"), "extra")],
        None,
    ],
    ids=["a name, not a job", "one pair", "a bare job", "a triple", "nothing"],
)
def test_an_entry_that_is_not_a_job_input_pair_is_refused(produced: object) -> None:
    odd = task(cron="0 * * * *", tz="UTC", enqueue=lambda: produced)
    with pytest.raises(JobDeclarationInvalidError):
        odd.entries()


async def test_enqueue_fires_every_entry_now(driver: MemoryJobDriver) -> None:
    both = task(
        cron="0 3 * * *",
        tz="UTC",
        enqueue=lambda: [(send_digest_for_tasks, Day("x")), (send_digest_for_tasks, Day("y"))],
    )
    results = await both.enqueue()
    assert [r.deduped for r in results] == [False, False]
    page = await driver.introspect.list(JobFilter(name="send_digest_for_tasks"))
    assert sorted(row.input["day"] for row in page.rows) == ["x", "y"]


def test_a_scheduled_occurrence_is_keyed_apart_from_a_manual_fire(
    driver: MemoryJobDriver,
) -> None:
    nightly = task(cron="0 3 * * *", tz="UTC", enqueue=lambda: [(send_digest_for_tasks, Day("z"))])
    [request] = nightly.requests(86_400_000, clock=driver.clock)
    assert request.idempotency_key.endswith("digest:z")
    assert request.idempotency_key != "digest:z"
    assert "86400000" in request.idempotency_key
