"""Where the Postgres statements of this package run.

A ``PgExecutor`` wraps what the application hands over — a psycopg ``AsyncConnectionPool``, one
``AsyncConnection``, or a URL — behind one small surface: run a statement, get its rows. Built from
a URL it owns its pool, opens it on first use (so it can be constructed outside an event loop) and
closes it in ``close()``; a pool or connection handed in stays the caller's to close.

A statement that fails because the connection under it died (a restarted server, a backend
terminated by an operator, an idle connection a proxy dropped) is run once more on a fresh
connection from the pool: a pool keeps dead connections until it next hands them out, so the first
statement after a restart would otherwise fail for nothing. Every statement here is safe to run
again: writes are fenced on the claim or keyed by the row id, so a repeat lands nothing twice
(the one cost: a settle whose first try committed but whose answer was lost answers False).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.errors import DeadlockDetected, SerializationFailure, TransactionRollback
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from ultimat3.jobs.core.errors import DriverUnavailableError

__all__ = ["Params", "PgExecutor", "PgTarget", "on_the_wire", "pg_executor"]

PgTarget: TypeAlias = "AsyncConnectionPool[Any] | AsyncConnection[Any] | str | PgExecutor"
"""What the Postgres parts of this package accept: a pool, a connection, a URL, or an executor."""

Params: TypeAlias = Mapping[str, Any]
T = TypeVar("T")

_DEFAULT_POOL_MIN = 1
_DEFAULT_POOL_MAX = 8


class PgExecutor:
    """Runs statements on a pool, a single connection, or a pool it owns (built from a URL)."""

    def __init__(
        self,
        target: AsyncConnectionPool[Any] | AsyncConnection[Any] | str,
        *,
        pool_min: int = _DEFAULT_POOL_MIN,
        pool_max: int = _DEFAULT_POOL_MAX,
        open_timeout: float = 30.0,
    ) -> None:
        self._url: str | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._connection: AsyncConnection[Any] | None = None
        if isinstance(target, str):
            if not target:
                raise DriverUnavailableError(
                    "an empty database URL was given; pass DATABASE_URL "
                    "(postgresql://user@host/db) or a psycopg AsyncConnectionPool"
                )
            self._url = target
        elif isinstance(target, AsyncConnectionPool):
            self._pool = target
        elif isinstance(target, AsyncConnection):
            self._connection = target
        else:
            raise DriverUnavailableError(
                f"cannot run statements on {type(target).__name__}; pass a database URL, a psycopg "
                "AsyncConnectionPool or an AsyncConnection"
            )
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._open_timeout = open_timeout
        self._opening: asyncio.Lock | None = None
        self._closed = False

    @property
    def owns_pool(self) -> bool:
        return self._url is not None

    @property
    def url(self) -> str | None:
        """The URL this executor was built from (None when handed a pool or connection)."""
        return self._url

    def __repr__(self) -> str:
        if self._url is not None:
            return f"PgExecutor(owned pool, max={self._pool_max})"
        return f"PgExecutor({type(self._pool or self._connection).__name__})"

    async def _owned_pool(self) -> AsyncConnectionPool[Any]:
        if self._pool is not None:
            return self._pool
        if self._closed:
            raise DriverUnavailableError("this Postgres executor was closed; build a new driver")
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                assert self._url is not None
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self._url,
                    min_size=self._pool_min,
                    max_size=self._pool_max,
                    kwargs={"autocommit": True, "prepare_threshold": 0},
                    configure=_in_utc,
                    open=False,
                    name="ultimat3-jobs",
                )
                try:
                    await pool.open(wait=True, timeout=self._open_timeout)
                except Exception as exc:
                    await pool.close()
                    raise DriverUnavailableError(
                        f"could not connect to Postgres: {exc}; check DATABASE_URL and that "
                        "the server is up"
                    ) from exc
                self._pool = pool
        return self._pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection for one or more statements (the caller's own, or one from the pool).

        A connection not in autocommit mode gets a transaction around the block (a savepoint
        inside the caller's open one), so what the statements write is committed rather than
        left for the pool to roll back."""
        if self._connection is not None:
            async with _committing(self._connection):
                yield self._connection
            return
        pool = self._pool if self._pool is not None else await self._owned_pool()
        async with pool.connection() as conn:
            if conn.autocommit:  # the usual case, kept free of a second context manager
                yield conn
            else:
                async with conn.transaction():
                    yield conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection inside one transaction, committed when the block exits cleanly."""
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def fetch(
        self, query: str, params: Params | None = None, *, prepare: bool | None = True
    ) -> list[tuple[Any, ...]]:
        """Every row of ``query``, as tuples."""

        wire = on_the_wire(query)

        async def go(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            cursor = await conn.execute(wire, params, prepare=prepare)
            return await cursor.fetchall() if cursor.description else []

        return await self._retrying(go)

    async def fetch_dicts(self, query: str, params: Params | None = None) -> list[DictRow]:
        """Every row of ``query`` as a dict by column name (the operator surface's reads)."""

        wire = on_the_wire(query)

        async def go(conn: AsyncConnection[Any]) -> list[DictRow]:
            async with conn.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(wire, params, prepare=True)
                return await cursor.fetchall() if cursor.description else []

        return await self._retrying(go)

    async def run(self, statements: Sequence[tuple[str, Params | None]]) -> list[tuple[Any, ...]]:
        """Several statements in ONE transaction; the rows of the last. For the few operations
        that must hold a lock across statements (a lease slot, a counter rollup)."""

        async def go(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = []
            async with conn.transaction():
                for query, params in statements:
                    cursor = await conn.execute(on_the_wire(query), params, prepare=True)
                    rows = await cursor.fetchall() if cursor.description else []
            return rows

        return await self._retrying(go)

    async def _retrying(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        """``work`` on a connection; once more on another when the first died under it, or when
        the server rolled the statement back to break a deadlock."""
        async with self.connection() as conn:
            try:
                return await work(conn)
            except psycopg.OperationalError as exc:
                if not self._worth_retrying(conn, exc):
                    raise
        if self._pool is not None:
            # When one connection died the others most likely did too (a restart, a failover):
            # have the pool test its idle ones and replace the dead, so the retry gets a live one.
            await self._pool.check()
        async with self.connection() as conn:
            return await work(conn)

    def _worth_retrying(self, conn: AsyncConnection[Any], exc: psycopg.OperationalError) -> bool:
        if isinstance(exc, (TransactionRollback, DeadlockDetected, SerializationFailure)):
            return True  # deadlock or serialization failure: nothing was applied
        # A dead connection: only a pool can hand out another one.
        return self._connection is None and (conn.broken or conn.closed)

    async def close(self) -> None:
        """Close the pool this executor owns; a pool or connection handed in is left open."""
        self._closed = True
        if self._url is not None and self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()


_WIRE: dict[str, str] = {}


def on_the_wire(query: str) -> str:
    """``query`` as it is sent: the statement of its ``sql_*`` constant without the lines that
    are only comments. The comments are for the operator reading the module; sent, they would
    push the longest statements past what psycopg caches the conversion of (4,096 characters),
    and every call would parse the whole text again. Computed once per statement."""
    wire = _WIRE.get(query)
    if wire is None:
        wire = "\n".join(line for line in query.splitlines() if not line.lstrip().startswith("--"))
        _WIRE[query] = wire
    return wire


@asynccontextmanager
async def _committing(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    if conn.autocommit:
        yield
    else:
        async with conn.transaction():
            yield


async def _in_utc(conn: AsyncConnection[Any]) -> None:
    """Sessions of an owned pool speak UTC: timestamps then arrive as UTC datetimes, with no
    conversion per value."""
    await conn.execute("set timezone to 'UTC'")


def pg_executor(target: PgTarget, **options: Any) -> PgExecutor:
    """``target`` as an executor: an executor is used as it is, anything else is wrapped."""
    if isinstance(target, PgExecutor):
        return target
    return PgExecutor(target, **options)
