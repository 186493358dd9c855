"""EXPLAIN of a statement as the driver runs it, for the tests that pin a statement's plan."""

from __future__ import annotations

import re
from typing import Any

from psycopg import AsyncClientCursor

from ultimat3.jobs.pg.executor import PgExecutor, on_the_wire

__all__ = ["as_prepared", "plan_of", "scans_run"]


async def plan_of(
    executor: PgExecutor, query: str, params: dict[str, Any], *, generic: bool
) -> str:
    """EXPLAIN of ``query``: the plan for these values, or the generic plan a prepared statement
    settles on after its first runs (the driver prepares every statement)."""
    if not generic:
        rows = await executor.fetch("explain " + query, params, prepare=False)
        return "\n".join(row[0] for row in rows)
    text, names = as_prepared(query)
    async with executor.connection() as conn:
        # Session-wide and undone by hand: a rollback would make psycopg deallocate every
        # statement this session prepared, "explained" among them.
        await conn.execute("set plan_cache_mode = force_generic_plan", prepare=False)
        await conn.execute(f"prepare explained as {text}", prepare=False)
        try:
            cursor = AsyncClientCursor(conn)
            await cursor.execute(
                f"explain execute explained({', '.join(['%s'] * len(names))})",
                [params[name] for name in names],
            )
            return "\n".join(row[0] for row in await cursor.fetchall())
        finally:
            await conn.execute("deallocate explained", prepare=False)
            await conn.execute("reset plan_cache_mode", prepare=False)


def as_prepared(query: str) -> tuple[str, list[str]]:
    """``query`` as the server holds it once prepared (``$n`` for each ``%(name)s``, numbered in
    order of first use, as psycopg sends it), and the parameter names in that order."""
    names: list[str] = []

    def number(found: re.Match[str]) -> str:
        if found[1] not in names:
            names.append(found[1])
        return f"${names.index(found[1]) + 1}"

    return re.sub(r"%\((\w+)\)s", number, on_the_wire(query)), names


async def scans_run(
    executor: PgExecutor, query: str, params: dict[str, Any], table: str
) -> list[tuple[str, int]]:
    """(node type, rows it read) for every scan of ``table`` that ran when ``query`` ran with
    ``params`` (rolled back), subplans and CTEs included: the rows it answered and the rows its
    filter dropped. A scan the plan holds but never started is left out."""

    def walk(node: dict[str, Any]) -> list[tuple[str, int]]:
        found = []
        ran = node.get("Actual Loops", 0)
        if node.get("Relation Name") == table and "Scan" in node["Node Type"] and ran:
            read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            found.append((node["Node Type"], read * ran))
        for child in node.get("Plans", []):
            found += walk(child)
        return found

    async with executor.connection() as conn, conn.transaction(force_rollback=True):
        cursor = await conn.execute("explain (analyze, format json) " + query, params)
        ((plan,),) = await cursor.fetchall()
    return walk(plan[0]["Plan"])
