"""A pool whose connections fail on cue, for the tests of what the executor does then.

``Faults.lose_answers(n)``: the next ``n`` statements commit, then their connection drops before
the answer is read — what a server restart or a terminated backend does to a statement that just
committed. ``Faults.fail_before_sending(n)``: the next ``n`` statements find their connection
dropped before they are sent, so they never run — and their caller cannot tell the two apart.
``Faults.deadlock(n)``: the next ``n`` statements are refused as deadlock victims, unsent.
``Faults.abandon_next(once_blocked)``: the next statement is sent whole, and once
``once_blocked()`` returns its connection dies on the client's side only, while the server goes
on with it and commits it when it can. Every error the server raised is kept in
``Faults.errors``, a COPY's too.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import AsyncCopy, AsyncCursor
from psycopg_pool import AsyncConnectionPool

__all__ = ["Faults", "faulty_pool"]


@dataclass
class Faults:
    answers_to_lose: int = 0
    sends_to_fail: int = 0
    deadlocks: int = 0
    abandon: Callable[[], Awaitable[None]] | None = None
    errors: list[Exception] = field(default_factory=list)

    def lose_answers(self, count: int = 1) -> None:
        self.answers_to_lose = count

    def fail_before_sending(self, count: int = 1) -> None:
        self.sends_to_fail = count

    def deadlock(self, count: int = 1) -> None:
        self.deadlocks = count

    def abandon_next(self, once_blocked: Callable[[], Awaitable[None]]) -> None:
        self.abandon = once_blocked

    def cursor_class(self) -> type[AsyncCursor[Any]]:
        faults = self

        class FaultyCursor(AsyncCursor[Any]):
            async def execute(self, *args: Any, **kwargs: Any) -> FaultyCursor:
                if faults.abandon is not None:
                    once_blocked, faults.abandon = faults.abandon, None
                    running = asyncio.ensure_future(super().execute(*args, **kwargs))
                    await once_blocked()
                    # Shut the socket, not the connection: libpq sends no goodbye, and the
                    # server notices nothing until it has finished (and committed) the statement.
                    with socket.socket(fileno=os.dup(self.connection.fileno())) as sock:
                        sock.shutdown(socket.SHUT_RDWR)
                    await running  # the client reads the end of the stream: OperationalError
                    return self
                if faults.deadlocks > 0:
                    faults.deadlocks -= 1
                    raise psycopg.errors.DeadlockDetected("deadlock detected")
                if faults.sends_to_fail > 0:
                    faults.sends_to_fail -= 1
                    await self.connection.close()
                    raise psycopg.OperationalError("server closed the connection unexpectedly")
                try:
                    await super().execute(*args, **kwargs)
                except psycopg.Error as exc:
                    faults.errors.append(exc)
                    raise
                if faults.answers_to_lose > 0:
                    faults.answers_to_lose -= 1
                    await self.connection.close()
                    raise psycopg.OperationalError("server closed the connection unexpectedly")
                return self

            @asynccontextmanager
            async def copy(
                self, statement: Any, params: Any = None, *, writer: Any = None
            ) -> AsyncIterator[AsyncCopy]:
                try:
                    async with super().copy(statement, params, writer=writer) as copy:
                        yield copy
                except psycopg.Error as exc:
                    faults.errors.append(exc)
                    raise

        return FaultyCursor


@asynccontextmanager
async def faulty_pool(url: str, faults: Faults) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """An autocommit pool (every statement commits as it returns) with ``faults`` in it."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url,
        kwargs={"autocommit": True, "cursor_factory": faults.cursor_class()},
        min_size=1,
        max_size=4,
        open=False,
    )
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()
