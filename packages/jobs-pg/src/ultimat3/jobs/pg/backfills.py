"""The backfill ledger on Postgres (``BackfillLedger`` over ``x_backfills``)."""

from __future__ import annotations

from ultimat3.jobs.core.clock import Clock
from ultimat3.jobs.core.jsonvalue import json_text
from ultimat3.jobs.core.ledger import (
    ledger_cursor,
    ledger_error,
    ledger_limit,
    ledger_rows,
    ledger_text,
    names_a_pass,
)
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
                "name": ledger_text(name, "name"),
                "run_id": ledger_text(run_id, "run_id"),
                "checksum": ledger_text(checksum, "checksum", empty=True),
                "app_version": None
                if app_version is None
                else ledger_text(app_version, "app_version", empty=True),
                "now": self._clock.now(),
            },
            idempotent=True,  # a repeat adopts the row the first one opened
        )
        return backfill_row(rows[0])

    async def checkpoint(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        swept = {"run_id": run_id, "rows": ledger_rows(rows), "cursor": _cursor(cursor)}
        if names_a_pass(run_id):
            await self._executor.fetch(SQL_BACKFILL_CHECKPOINT, swept, idempotent=True)

    async def complete(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        swept = {"run_id": run_id, "rows": ledger_rows(rows), "cursor": _cursor(cursor)}
        if names_a_pass(run_id):
            await self._executor.fetch(
                SQL_BACKFILL_COMPLETE, {**swept, "now": self._clock.now()}, idempotent=True
            )

    async def fail(self, run_id: str, error: str) -> None:
        failed = {"run_id": run_id, "error": ledger_error(error)}
        if names_a_pass(run_id):
            await self._executor.fetch(SQL_BACKFILL_FAIL, failed, idempotent=True)

    async def latest(self, name: str) -> BackfillRow | None:
        if not names_a_pass(name):
            return None
        rows = await self._executor.fetch(SQL_BACKFILL_LATEST, {"name": name}, idempotent=True)
        return backfill_row(rows[0]) if rows else None

    async def list(
        self, *, name: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[BackfillRow]:
        limit = ledger_limit(limit)
        if not (names_a_pass(name) and names_a_pass(status)):
            return []
        rows = await self._executor.fetch(
            SQL_BACKFILL_LIST,
            {"name": name, "status": status, "max_rows": limit},
            idempotent=True,
        )
        return [backfill_row(row) for row in rows]


def _cursor(cursor: JsonValue) -> str:
    return json_text(ledger_cursor(cursor))
