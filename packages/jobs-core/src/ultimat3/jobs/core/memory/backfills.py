"""The backfill ledger in one heap: one row per pass."""

from __future__ import annotations

from dataclasses import replace

from ..clock import Clock
from ..jsonvalue import json_roundtrip
from ..ledger import (
    ledger_cursor,
    ledger_error,
    ledger_limit,
    ledger_rows,
    ledger_text,
)
from ..model import BackfillRow, JsonValue

__all__ = ["MemoryBackfillLedger"]


class MemoryBackfillLedger:
    """Cursors go in and come out as copies of their JSON form, as a server stores bytes: a
    caller changing its value, before or after, changes nothing in the ledger."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._rows: dict[str, BackfillRow] = {}

    async def begin(
        self, *, name: str, run_id: str, checksum: str, app_version: str | None = None
    ) -> BackfillRow:
        name, run_id = ledger_text(name, "name"), ledger_text(run_id, "run_id")
        checksum = ledger_text(checksum, "checksum", empty=True)
        if app_version is not None:
            app_version = ledger_text(app_version, "app_version", empty=True)
        held = self._rows.get(run_id)
        if held is not None:
            if held.status == "failed":  # this run's next attempt: the pass is in flight again
                held = self._rows[run_id] = replace(held, status="running", error=None)
            return _copied(held)
        row = BackfillRow(
            name=name,
            run_id=run_id,
            checksum=checksum,
            status="running",
            started_at=self._clock.now(),
            app_version=app_version,
        )
        self._rows[run_id] = row
        return _copied(row)

    async def checkpoint(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        rows, cursor = ledger_rows(rows), ledger_cursor(cursor)
        held = self._rows.get(run_id)
        if held is not None:
            self._rows[run_id] = replace(held, rows=rows, cursor=cursor)

    async def complete(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        rows, cursor = ledger_rows(rows), ledger_cursor(cursor)
        held = self._rows.get(run_id)
        if held is not None:
            self._rows[run_id] = replace(
                held, rows=rows, cursor=cursor, status="completed", completed_at=self._clock.now()
            )

    async def fail(self, run_id: str, error: str) -> None:
        error = ledger_error(error)
        held = self._rows.get(run_id)
        if held is not None:
            self._rows[run_id] = replace(held, status="failed", error=error)

    async def latest(self, name: str) -> BackfillRow | None:
        rows = await self.list(name=name, limit=1)
        return rows[0] if rows else None

    async def list(
        self, *, name: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[BackfillRow]:
        """Newest first by ``started_at``, ties newest begun first: the dict keeps the order
        passes began (an adopting begin reassigns its key in place), so the stable sort of its
        reversal puts a later pass ahead of an earlier one it ties with."""
        limit = ledger_limit(limit)
        rows = [
            row
            for row in reversed(self._rows.values())
            if (name is None or row.name == name) and (status is None or row.status == status)
        ]
        rows.sort(key=lambda row: row.started_at, reverse=True)
        return [_copied(row) for row in rows[:limit]]


def _copied(row: BackfillRow) -> BackfillRow:
    return replace(row, cursor=json_roundtrip(row.cursor))
