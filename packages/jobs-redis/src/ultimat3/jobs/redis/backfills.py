"""The backfill ledger on Redis: one hash per pass (``backfill:<run id>``), ordered by the
``backfills`` set in the order passes began (an adopting begin keeps a pass's place). A ledger
row is a report kept like a migration record: one per pass, never expired."""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Literal, cast

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

from .codec import fields, from_us, optional
from .namespace import Namespace
from .unavailable import reports_unavailable

__all__ = ["RedisBackfillLedger"]


@reports_unavailable
class RedisBackfillLedger:
    def __init__(self, ns: Namespace) -> None:
        self._ns = ns

    async def begin(
        self, *, name: str, run_id: str, checksum: str, app_version: str | None = None
    ) -> BackfillRow:
        row = await self._ns.call(
            "backfill",
            "begin",
            ledger_text(run_id, "run_id"),
            ledger_text(name, "name"),
            ledger_text(checksum, "checksum", empty=True),
            optional(
                None if app_version is None else ledger_text(app_version, "app_version", empty=True)
            ),
        )
        return _read(fields(row))

    async def checkpoint(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        swept = ("rows", str(ledger_rows(rows)), "cursor", json_text(ledger_cursor(cursor)))
        if names_a_pass(run_id):
            await self._ns.call("backfill", "update", run_id, "0", *swept)

    async def complete(self, run_id: str, *, rows: int, cursor: JsonValue) -> None:
        swept = ("rows", str(ledger_rows(rows)), "cursor", json_text(ledger_cursor(cursor)))
        if names_a_pass(run_id):
            await self._ns.call("backfill", "update", run_id, "1", "status", "completed", *swept)

    async def fail(self, run_id: str, error: str) -> None:
        failed = ("status", "failed", "error", ledger_error(error))
        if names_a_pass(run_id):
            await self._ns.call("backfill", "update", run_id, "0", *failed)

    async def _all(self) -> builtins.list[BackfillRow]:
        """Every pass, the last begun first (the ledger is one row per pass: small)."""
        runs = cast(
            list[str], await self._ns.client.zrange(self._ns.key("backfills"), 0, -1, desc=True)
        )
        rows = await self._ns.hashes([f"backfill:{run_id}" for run_id in runs])
        return [_read(row) for row in rows if row]

    async def latest(self, name: str) -> BackfillRow | None:
        rows = await self.list(name=name, limit=1)
        return rows[0] if rows else None

    async def list(
        self, *, name: str | None = None, status: str | None = None, limit: int = 100
    ) -> builtins.list[BackfillRow]:
        """Newest first by ``started_at``, ties the last begun first: the stable sort keeps the
        ``backfills`` order among passes that began at one instant."""
        limit = ledger_limit(limit)
        rows = [
            row
            for row in await self._all()
            if (name is None or row.name == name) and (status is None or row.status == status)
        ]
        return sorted(rows, key=_started, reverse=True)[:limit]


def _started(row: BackfillRow) -> datetime:
    return row.started_at


def _read(row: Mapping[str, str]) -> BackfillRow:
    status = cast(Literal["running", "completed", "failed"], row["status"])
    completed = row.get("completed")
    return BackfillRow(
        name=row["name"],
        run_id=row["run_id"],
        checksum=row["checksum"],
        status=status,
        started_at=from_us(row["started"]),
        rows=int(row["rows"]),
        cursor=json.loads(row["cursor"]),
        app_version=row.get("app_version"),
        completed_at=None if completed is None else from_us(completed),
        error=row.get("error"),
    )
