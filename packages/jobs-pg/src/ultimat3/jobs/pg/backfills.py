"""The backfill ledger on Postgres (``BackfillLedger`` over ``x_backfills``)."""

from __future__ import annotations

from ultimat3.jobs.core.clock import Clock
from ultimat3.jobs.core.jsonvalue import json_text
from ultimat3.jobs.core.model import BackfillRow, JsonValue

from .executor import PgExecutor
from .rows import backfill_row
from .sql_backfills import (
    SQL_BACKFILL_BEGIN,
    SQL_BACKFILL_CHECKPOINT,
    SQL_BACKFILL_COMPLETE,
    SQL_BACKFILL_FAIL,
    SQL_BACKFILL_LATEST,
    SQL_BACKFILL_LIST,
)

__all__ = ["PostgresBackfillLedger"]


class PostgresBackfillLedger:
    """One row per backfill pass; a report, never a resume source (the steps are that)."""

    def __init__(self, executor: PgExecutor, clock: Clock) -> None:
        self._executor = executor
        self._clock = clock

    def __repr__(self) -> str:
        return f"PostgresBackfillLedger({self._executor!r})"

    async def begin(
        self, *, name: str, run_id: str, checksum: str, app_version: str | None = None
    ) -> BackfillRow:
        rows = await self._executor.fetch(
            SQL_BACKFILL_BEGIN,
            {
                "name": name,
                "run_id": run_id,
                "checksum": checksum,
                "app_version": app_version,
                "now": self._clock.now(),
            },
            idempotent=True,  # a repeat adopts the row the first one opened
        )
        return backfill_row(rows[0])

    async def checkpoint(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        await self._executor.fetch(
            SQL_BACKFILL_CHECKPOINT,
            {"run_id": run_id, "rows": rows, "cursor": json_text(cursor)},
            idempotent=True,
        )

    async def complete(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        await self._executor.fetch(
            SQL_BACKFILL_COMPLETE,
            {"run_id": run_id, "rows": rows, "cursor": json_text(cursor), "now": self._clock.now()},
            idempotent=True,
        )

    async def fail(self, run_id: str, error: str) -> None:
        await self._executor.fetch(
            SQL_BACKFILL_FAIL, {"run_id": run_id, "error": error}, idempotent=True
        )

    async def latest(self, name: str) -> BackfillRow | None:
        rows = await self._executor.fetch(SQL_BACKFILL_LATEST, {"name": name}, idempotent=True)
        return backfill_row(rows[0]) if rows else None

    async def list(
        self, *, name: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[BackfillRow]:
        rows = await self._executor.fetch(
            SQL_BACKFILL_LIST,
            {"name": name, "status": status, "max_rows": limit},
            idempotent=True,
        )
        return [backfill_row(row) for row in rows]
