"""The backfill ledger: one row per pass, adopted by the run that opened it."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from ultimat3.jobs.core import InvariantError
from ultimat3.jobs.core.model import BackfillRow

from .target import Conformance

__all__ = ["BackfillRules"]


class BackfillRules:
    async def test_begin_opens_a_running_pass(self, jobs: Conformance) -> None:
        row = await jobs.backfills.begin(
            name="rewrite-slugs", run_id="run-1", checksum="c1", app_version="1.2.3"
        )
        assert row == BackfillRow(
            name="rewrite-slugs",
            run_id="run-1",
            checksum="c1",
            status="running",
            started_at=jobs.now(),
            app_version="1.2.3",
        )
        assert await jobs.backfills.latest("rewrite-slugs") == row

    async def test_begin_again_adopts_the_pass_of_that_run(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        first = await ledger.begin(name="b", run_id="run-1", checksum="c1")
        await ledger.checkpoint("run-1", rows=500, cursor={"id": 500})
        jobs.advance(60)
        adopted = await ledger.begin(name="b", run_id="run-1", checksum="c2")
        assert (adopted.started_at, adopted.checksum) == (first.started_at, "c1")
        assert (adopted.rows, adopted.cursor, adopted.status) == (500, {"id": 500}, "running")

    async def test_a_retry_adopting_a_failed_pass_puts_it_in_flight_again(
        self, jobs: Conformance
    ) -> None:
        ledger = jobs.backfills
        first = await ledger.begin(name="b", run_id="run-1", checksum="c1")
        await ledger.checkpoint("run-1", rows=500, cursor={"id": 500})
        await ledger.fail("run-1", "X_BOOM: the table is locked")
        jobs.advance(60)
        adopted = await ledger.begin(name="b", run_id="run-1", checksum="c1")
        assert (adopted.status, adopted.error, adopted.started_at) == (
            "running",
            None,
            first.started_at,
        )
        assert (adopted.rows, adopted.cursor) == (500, {"id": 500})
        assert await ledger.latest("b") == adopted

    async def test_a_completed_pass_adopted_again_stays_completed(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-1", checksum="c1")
        await ledger.complete("run-1", rows=10, cursor=None)
        adopted = await ledger.begin(name="b", run_id="run-1", checksum="c1")
        assert (adopted.status, adopted.rows) == ("completed", 10)

    async def test_checkpoint_records_rows_and_cursor(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-1", checksum="c1")
        await ledger.checkpoint("run-1", rows=1000, cursor={"after": [17, "x"]})
        row = await ledger.latest("b")
        assert row is not None
        assert (row.rows, row.cursor, row.status) == (1000, {"after": [17, "x"]}, "running")

    async def test_complete_closes_the_pass(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-1", checksum="c1")
        jobs.advance(90)
        await ledger.complete("run-1", rows=1234, cursor=None)
        row = await ledger.latest("b")
        assert row is not None
        assert (row.status, row.completed_at, row.rows, row.cursor) == (
            "completed",
            jobs.now(),
            1234,
            None,
        )

    async def test_fail_records_the_error(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-1", checksum="c1")
        await ledger.fail("run-1", "X_BOOM: the table is locked")
        row = await ledger.latest("b")
        assert row is not None
        assert (row.status, row.error) == ("failed", "X_BOOM: the table is locked")

    async def test_writes_for_an_unknown_run_change_nothing(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        await ledger.checkpoint("nobody", rows=1, cursor=1)
        await ledger.complete("nobody", rows=1, cursor=1)
        await ledger.fail("nobody", "boom")
        assert await ledger.list() == []

    async def test_latest_is_the_newest_pass_in_any_status(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-1", checksum="c1")
        await ledger.complete("run-1", rows=1, cursor=None)
        jobs.advance(60)
        await ledger.begin(name="b", run_id="run-2", checksum="c1")
        await ledger.fail("run-2", "boom")
        await ledger.begin(name="other", run_id="run-3", checksum="c9")
        latest = await ledger.latest("b")
        assert latest is not None
        assert (latest.run_id, latest.status) == ("run-2", "failed")

    async def test_latest_of_an_unknown_name_is_none(self, jobs: Conformance) -> None:
        assert await jobs.backfills.latest("never-ran") is None

    async def test_list_is_newest_first_filtered_and_bounded(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        for run_id, name in [("r1", "a"), ("r2", "b"), ("r3", "a"), ("r4", "a")]:
            await ledger.begin(name=name, run_id=run_id, checksum="c")
            jobs.advance(1)
        await ledger.complete("r3", rows=0, cursor=None)
        assert [r.run_id for r in await ledger.list()] == ["r4", "r3", "r2", "r1"]
        assert [r.run_id for r in await ledger.list(name="a")] == ["r4", "r3", "r1"]
        assert [r.run_id for r in await ledger.list(status="running")] == ["r4", "r2", "r1"]
        assert [r.run_id for r in await ledger.list(name="a", limit=2)] == ["r4", "r3"]

    async def test_passes_begun_at_one_instant_are_newest_first_in_the_order_they_began(
        self, jobs: Conformance
    ) -> None:
        """Under a frozen clock passes share ``started_at``: the pass begun last is the newest,
        whatever its run id sorts as, so ``latest`` is the first row ``list`` answers."""
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-m", checksum="c")
        jobs.advance(1)
        for run_id in ("run-z", "run-a", "run-q"):
            await ledger.begin(name="b", run_id=run_id, checksum="c")
        await ledger.begin(name="other", run_id="run-o", checksum="c")
        await ledger.fail("run-z", "boom")
        await ledger.begin(name="b", run_id="run-z", checksum="c")  # adopted: it keeps its place
        newest_first = ["run-q", "run-a", "run-z", "run-m"]
        assert [r.run_id for r in await ledger.list(name="b")] == newest_first
        assert [r.run_id for r in await ledger.list(name="b", limit=2)] == newest_first[:2]
        assert [r.run_id for r in await ledger.list()] == ["run-o", *newest_first]
        latest = await ledger.latest("b")
        assert latest is not None
        assert latest.run_id == "run-q"

    async def test_a_cursor_is_kept_in_its_json_form_apart_from_the_callers_value(
        self, jobs: Conformance
    ) -> None:
        """As a server stores bytes: a keyset tuple reads back as a list, a time as its ISO
        text, and changing the value passed in, or the one read back, changes nothing stored."""
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-1", checksum="c1")
        at = datetime(2026, 1, 1, tzinfo=UTC)
        cursor: dict[str, Any] = {"after": (17, "x"), "page": {"n": 1}, "at": at}
        await ledger.checkpoint("run-1", rows=1, cursor=cursor)
        cursor["page"]["n"] = 99
        stored = {"after": [17, "x"], "page": {"n": 1}, "at": at.isoformat()}
        row = await ledger.latest("b")
        assert row is not None
        assert row.cursor == stored
        assert isinstance(row.cursor, dict)
        row.cursor["page"]["n"] = 42
        again = await ledger.latest("b")
        assert again is not None
        assert again.cursor == stored

    async def test_what_no_ledger_stores_is_refused_alike(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-1", checksum="c1")
        cursors: list[object] = [
            math.nan,
            {"after": object()},
            {"after": "a\x00b"},
            ["lone \udcff"],
        ]
        for cursor in cursors:
            with pytest.raises(InvariantError):
                await ledger.checkpoint("run-1", rows=1, cursor=cursor)
        for rows in (1.5, -1, True, "3"):
            with pytest.raises(InvariantError):
                await ledger.complete("run-1", rows=rows, cursor=None)  # type: ignore[arg-type]
        for name in ("", "b\x00", "b\udcff", "b" * 501):
            with pytest.raises(InvariantError):
                await ledger.begin(name=name, run_id="run-2", checksum="c1")
            with pytest.raises(InvariantError):
                await ledger.begin(name="b", run_id=name, checksum="c1")
        for limit in (0, -1, 2.0):
            with pytest.raises(InvariantError):
                await ledger.list(limit=limit)  # type: ignore[arg-type]
        row = await ledger.latest("b")
        assert row is not None
        assert (row.run_id, row.rows, row.cursor, row.status) == ("run-1", 0, None, "running")
        assert [r.run_id for r in await ledger.list()] == ["run-1"]

    async def test_a_name_no_ledger_stores_names_no_pass(self, jobs: Conformance) -> None:
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-1", checksum="c1")
        for unstorable in ("b\x00", "run-1\x00", "b\udcff"):
            assert await ledger.latest(unstorable) is None
            assert await ledger.list(name=unstorable) == []
            assert await ledger.list(status=unstorable) == []
            await ledger.checkpoint(unstorable, rows=5, cursor=5)
            await ledger.complete(unstorable, rows=5, cursor=5)
            await ledger.fail(unstorable, "boom")
        row = await ledger.latest("b")
        assert row is not None
        assert (row.rows, row.cursor, row.status) == (0, None, "running")

    async def test_a_failures_text_is_kept_with_what_no_ledger_stores_spelled_out(
        self, jobs: Conformance
    ) -> None:
        ledger = jobs.backfills
        await ledger.begin(name="b", run_id="run-1", checksum="c1")
        await ledger.fail("run-1", "bad row \x00 at \udcff é")
        row = await ledger.latest("b")
        assert row is not None
        assert row.error == "bad row \\x00 at \\udcff é"
