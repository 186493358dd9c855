"""The ambient transaction an outbox enqueue joins: the caller's own psycopg connection.

::

    async with pool.connection() as conn, jobs_transaction(conn):
        await conn.execute("insert into invoices ...")
        await charge_card.enqueue(...)     # staged on conn: commits or rolls back with the invoice

``jobs_transaction(conn)`` opens a transaction on ``conn`` (a savepoint when one is already open
there) and makes ``conn`` this task's ambient transaction for the block. ``current_tx()`` answers
it: hand it to ``outbox_jobs_facade(current_tx=...)``; the Postgres outbox store reads it too, so
``stage()`` runs on that connection and never on a pool connection of its own.

The connection is held in a ``ContextVar``, so it follows the task that opened the block (and the
tasks it starts inside it) and no other: two requests served at once each join their own.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection

__all__ = ["current_tx", "jobs_transaction"]

_ambient: contextvars.ContextVar[AsyncConnection[Any] | None] = contextvars.ContextVar(
    "ultimat3_jobs_pg_transaction", default=None
)


@asynccontextmanager
async def jobs_transaction(conn: AsyncConnection[Any]) -> AsyncIterator[AsyncConnection[Any]]:
    """A transaction on ``conn`` that outbox enqueues inside the block join.

    Committed when the block exits cleanly, rolled back when it raises — together with every job
    staged inside it. Nested inside another transaction on ``conn`` it is a savepoint, and the
    jobs it staged live or die with that savepoint.
    """
    async with conn.transaction():
        token = _ambient.set(conn)
        try:
            yield conn
        finally:
            _ambient.reset(token)


def current_tx() -> AsyncConnection[Any] | None:
    """The connection of the ``jobs_transaction`` block this task is in, or None outside one."""
    return _ambient.get()
