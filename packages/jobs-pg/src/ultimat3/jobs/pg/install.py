"""Applying the DDL, and emptying the tables (tests, benchmarks)."""

from __future__ import annotations

from .executor import PgTarget, pg_executor
from .sql_reset import SQL_RESET
from .sql_schema import SQL_JOBS_TABLE

__all__ = ["install", "truncate_tables"]


async def install(pool_or_url: PgTarget) -> None:
    """Create every table and index this package uses, if missing. Safe to run on every boot and
    from several processes at once; ``ujobs migrate --database-url URL`` runs the same DDL."""
    executor = pg_executor(pool_or_url)
    try:
        # Several commands in one simple-protocol query: one implicit transaction, so the
        # advisory lock at its head is held until every table exists.
        await executor.fetch(SQL_JOBS_TABLE, idempotent=True, prepare=False)
    finally:
        if executor is not pool_or_url:
            await executor.close()


async def truncate_tables(pool_or_url: PgTarget) -> None:
    """Delete every row of every table (``SQL_RESET``). For tests and benchmarks only."""
    executor = pg_executor(pool_or_url)
    try:
        await executor.fetch(SQL_RESET, idempotent=True, prepare=False)
    finally:
        if executor is not pool_or_url:
            await executor.close()
