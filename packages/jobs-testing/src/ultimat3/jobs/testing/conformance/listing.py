"""The operator's reads: ``list`` pages (bounds, cursors, filters) and ``get``."""

from __future__ import annotations

from typing import cast

import pytest

from ultimat3.jobs.core import (
    DEFAULT_JOB_PAGE,
    MAX_JOB_PAGE,
    JobFilter,
    JobPageInvalidError,
    JobState,
    job_cursor,
)

from .target import Conformance

__all__ = ["ListingRules"]


async def _queued_one_second_apart(jobs: Conformance, count: int) -> list[str]:
    """``count`` rows created a second apart; their ids, oldest first."""
    ids = []
    for _ in range(count):
        ids.append((await jobs.enqueue()).id)
        jobs.advance(1)
    return ids


async def _ids(jobs: Conformance, filter: JobFilter) -> list[str]:
    return [row.id for row in (await jobs.introspect.list(filter)).rows]


class ListingRules:
    async def test_list_pages_newest_first(self, jobs: Conformance) -> None:
        ids = await _queued_one_second_apart(jobs, 3)
        assert await _ids(jobs, JobFilter()) == ids[::-1]

    async def test_list_breaks_created_at_ties_by_id(self, jobs: Conformance) -> None:
        ids = ["0190a000-0000-7000-8000-00000000000" + digit for digit in "2913"]
        for job_id in ids:
            await jobs.enqueue(id=job_id)
        assert await _ids(jobs, JobFilter()) == sorted(ids, reverse=True)

    async def test_list_pages_default_to_the_default_page(self, jobs: Conformance) -> None:
        await jobs.driver.enqueue_many([jobs.request() for _ in range(DEFAULT_JOB_PAGE + 1)])
        page = await jobs.introspect.list(JobFilter())
        assert (len(page.rows), page.limit, page.last) == (
            DEFAULT_JOB_PAGE,
            DEFAULT_JOB_PAGE,
            False,
        )

    async def test_list_serves_a_page_of_the_maximum_size(self, jobs: Conformance) -> None:
        await jobs.driver.enqueue_many([jobs.request() for _ in range(MAX_JOB_PAGE + 1)])
        page = await jobs.introspect.list(JobFilter(limit=MAX_JOB_PAGE))
        assert len(page.rows) == MAX_JOB_PAGE

    async def test_a_limit_over_the_maximum_is_refused(self, jobs: Conformance) -> None:
        with pytest.raises(JobPageInvalidError) as refused:
            await jobs.introspect.list(JobFilter(limit=MAX_JOB_PAGE + 1))
        assert refused.value.code == "X_JOB_PAGE_INVALID"

    async def test_a_limit_below_one_is_refused(self, jobs: Conformance) -> None:
        with pytest.raises(JobPageInvalidError):
            await jobs.introspect.list(JobFilter(limit=0))

    async def test_a_page_shorter_than_its_limit_is_the_last(self, jobs: Conformance) -> None:
        await _queued_one_second_apart(jobs, 2)
        assert (await jobs.introspect.list(JobFilter(limit=2))).last is False
        assert (await jobs.introspect.list(JobFilter(limit=3))).last is True

    async def test_an_empty_backend_lists_one_empty_last_page(self, jobs: Conformance) -> None:
        page = await jobs.introspect.list(JobFilter())
        assert (list(page.rows), page.last) == ([], True)

    async def test_after_pages_to_older_rows(self, jobs: Conformance) -> None:
        ids = (await _queued_one_second_apart(jobs, 5))[::-1]
        first = (await jobs.introspect.list(JobFilter(limit=2))).rows
        second = (await jobs.introspect.list(JobFilter(limit=2, after=job_cursor(first[-1])))).rows
        third = await jobs.introspect.list(JobFilter(limit=2, after=job_cursor(second[-1])))
        assert [r.id for r in [*first, *second, *third.rows]] == ids
        assert third.last

    async def test_before_pages_back_to_the_nearest_newer_rows(self, jobs: Conformance) -> None:
        ids = (await _queued_one_second_apart(jobs, 5))[::-1]
        rows = (await jobs.introspect.list(JobFilter(limit=5))).rows
        before = job_cursor(rows[3])
        assert await _ids(jobs, JobFilter(limit=2, before=before)) == ids[1:3]

    async def test_before_the_newest_row_is_an_empty_page(self, jobs: Conformance) -> None:
        await _queued_one_second_apart(jobs, 2)
        newest = (await jobs.introspect.list(JobFilter(limit=1))).rows[0]
        assert await _ids(jobs, JobFilter(before=job_cursor(newest))) == []

    async def test_a_cursor_outlives_its_row(self, jobs: Conformance) -> None:
        ids = (await _queued_one_second_apart(jobs, 3))[::-1]
        middle = (await jobs.introspect.list(JobFilter(limit=2))).rows[1]
        assert await jobs.introspect.remove(middle.id)
        assert await _ids(jobs, JobFilter(after=job_cursor(middle))) == ids[2:]

    async def test_after_and_before_together_are_refused(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        row = (await jobs.introspect.list(JobFilter())).rows[0]
        with pytest.raises(JobPageInvalidError):
            await jobs.introspect.list(JobFilter(after=job_cursor(row), before=job_cursor(row)))

    async def test_a_foreign_after_cursor_is_refused_naming_after(self, jobs: Conformance) -> None:
        with pytest.raises(JobPageInvalidError) as refused:
            await jobs.introspect.list(JobFilter(after="not-a-cursor"))
        assert refused.value.meta.get("cursor") == "after"
        assert "after" in refused.value.message

    async def test_a_foreign_before_cursor_is_refused_naming_before(
        self, jobs: Conformance
    ) -> None:
        with pytest.raises(JobPageInvalidError) as refused:
            await jobs.introspect.list(JobFilter(before="bm90LWEtY3Vyc29y"))
        assert refused.value.meta.get("cursor") == "before"
        assert "before" in refused.value.message

    async def test_a_foreign_cursor_is_refused_beside_a_filter_no_row_can_match(
        self, jobs: Conformance
    ) -> None:
        """A queue holding NUL matches nothing on any backend; the cursor is still checked."""
        with pytest.raises(JobPageInvalidError) as refused:
            await jobs.introspect.list(JobFilter(queue="a\x00b", after="not-a-cursor"))
        assert refused.value.meta.get("cursor") == "after"

    async def test_list_filters_by_queue(self, jobs: Conformance) -> None:
        mail = await jobs.enqueue(queue="mail")
        await jobs.enqueue(queue="billing")
        assert await _ids(jobs, JobFilter(queue="mail")) == [mail.id]

    async def test_list_filters_by_name(self, jobs: Conformance) -> None:
        await jobs.enqueue(name="one")
        two = await jobs.enqueue(name="two")
        assert await _ids(jobs, JobFilter(name="two")) == [two.id]

    async def test_list_filters_by_state(self, jobs: Conformance) -> None:
        await jobs.enqueue()
        delayed = await jobs.enqueue(delay=60)
        assert await _ids(jobs, JobFilter(state=JobState.DELAYED)) == [delayed.id]

    async def test_a_state_named_by_its_string_filters_as_the_state(
        self, jobs: Conformance
    ) -> None:
        """A filter built from a CLI argument or JSON names its state as a string."""
        await jobs.enqueue()
        delayed = await jobs.enqueue(delay=60)
        assert await _ids(jobs, JobFilter(state=cast(JobState, "delayed"))) == [delayed.id]

    async def test_list_filters_by_tenant(self, jobs: Conformance) -> None:
        await jobs.enqueue(tenant="org-a")
        b = await jobs.enqueue(tenant="org-b")
        await jobs.enqueue(tenant=None)
        assert await _ids(jobs, JobFilter(tenant_id="org-b")) == [b.id]

    async def test_list_filters_by_id_prefix(self, jobs: Conformance) -> None:
        wanted = await jobs.enqueue(id="0190a000-aaaa-7000-8000-000000000001")
        await jobs.enqueue(id="0190a000-bbbb-7000-8000-000000000002")
        assert await _ids(jobs, JobFilter(id_prefix="0190a000-aaaa")) == [wanted.id]

    async def test_created_from_is_inclusive_and_created_to_exclusive(
        self, jobs: Conformance
    ) -> None:
        ids = await _queued_one_second_apart(jobs, 4)
        window = JobFilter(created_from=jobs.at(-3), created_to=jobs.at(-1))
        assert await _ids(jobs, window) == [ids[2], ids[1]]

    async def test_list_filters_combine(self, jobs: Conformance) -> None:
        await jobs.enqueue(queue="mail", tenant="org-a")
        wanted = await jobs.enqueue(queue="mail", tenant="org-b")
        await jobs.enqueue(queue="billing", tenant="org-b")
        assert await _ids(jobs, JobFilter(queue="mail", tenant_id="org-b")) == [wanted.id]

    async def test_filters_page_with_cursors(self, jobs: Conformance) -> None:
        mail = []
        for _ in range(3):
            mail.append((await jobs.enqueue(queue="mail")).id)
            await jobs.enqueue(queue="billing")
            jobs.advance(1)
        first = (await jobs.introspect.list(JobFilter(queue="mail", limit=2))).rows
        rest = await _ids(jobs, JobFilter(queue="mail", limit=2, after=job_cursor(first[-1])))
        assert [row.id for row in first] + rest == mail[::-1]

    async def test_get_of_an_unknown_id_answers_none(self, jobs: Conformance) -> None:
        assert await jobs.introspect.get("0190a000-0000-7000-8000-0000000000ff") is None

    async def test_get_answers_the_row_as_listed(self, jobs: Conformance) -> None:
        queued = await jobs.enqueue(tenant="org-a")
        listed = (await jobs.introspect.list(JobFilter())).rows[0]
        detail = await jobs.detail(queued.id)
        assert (detail.row, list(detail.steps)) == (listed, [])
