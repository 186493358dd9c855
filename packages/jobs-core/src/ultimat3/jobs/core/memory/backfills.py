"""The backfill ledger in one heap: one row per pass."""

from __future__ import annotations

from dataclasses import replace

from ..clock import Clock
from ..model import BackfillRow, JsonValue

__all__ = ["MemoryBackfillLedger"]


class MemoryBackfillLedger:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._rows: dict[str, BackfillRow] = {}

    async def begin(
        self, *, name: str, run_id: str, checksum: str, app_version: str | None = None
    ) -> BackfillRow:
        held = self._rows.get(run_id)
        if held is not None:
            if held.status == "failed":  # this run's next attempt: the pass is in flight again
                held = self._rows[run_id] = replace(held, status="running", error=None)
            return held
        row = BackfillRow(
            name=name,
            run_id=run_id,
            checksum=checksum,
            status="running",
            started_at=self._clock.now(),
            app_version=app_version,
        )
        self._rows[run_id] = row
        return row

    async def checkpoint(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        held = self._rows.get(run_id)
        if held is not None:
            self._rows[run_id] = replace(held, rows=rows, cursor=cursor)

    async def complete(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        held = self._rows.get(run_id)
        if held is not None:
            self._rows[run_id] = replace(
                held, rows=rows, cursor=cursor, status="completed", completed_at=self._clock.now()
            )

    async def fail(self, run_id: str, error: str) -> None:
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
        rows = [
            row
            for row in reversed(self._rows.values())
            if (name is None or row.name == name) and (status is None or row.status == status)
        ]
        return sorted(rows, key=lambda row: row.started_at, reverse=True)[:limit]
