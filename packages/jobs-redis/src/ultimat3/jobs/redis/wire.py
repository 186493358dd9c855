"""One connection with many calls in flight: the driver's script calls, pipelined as they come.

Each call writes its command the moment it is made and waits for its own reply; replies come back
in the order commands were written, so one reader hands each to its caller. Calls made while
others are on the wire therefore share round trips without waiting for each other or for a timer
(auto-pipelining), and a lone call costs one write and one read: no pool checkout, no task of its
own. Measured here on loopback, Redis 7.0, a trivial script called one at a time: about 2x the
calls per second of ``Redis.evalsha`` (7.5k/s against 3.3k/s on a loaded 2-core machine), and ~6x
when a hundred tasks call at once.

The connection is built from the client's own pool settings (host, port or socket path, TLS,
credentials, database), through redis-py's connection class. While a reply is owed, a watchdog
checks that one came within ``command_timeout`` of the last (or of the first command owed): a
server that stops answering with the socket open breaks the connection after that long instead
of holding every call behind it. One timer serves the whole connection, re-armed only when it
fires (a per-read timeout cost ~1.5 us a reply, ~6% of a pipelined call's CPU). A dial has the
same deadline. When the
connection breaks, every call in flight fails with ``redis.exceptions.ConnectionError`` (whether
the server ran it is unknown, as for any client) and the next call dials again. A caller
cancelled while its reply is owed (a job body at its timeout, a drain) breaks nothing: its
command went out whole, and its reply is read and dropped with the stream left in step. A socket the
server has closed while the wire was idle (a restart, an idle timeout) is noticed before a
command is written to it: the call dials afresh instead, so that command is not lost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Sequence
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["DEFAULT_COMMAND_TIMEOUT", "Wire", "pack"]

DEFAULT_COMMAND_TIMEOUT = 5.0
"""Seconds a reply may take before the connection counts as broken: far above any script's own
time (a few milliseconds), short enough that a stalled server is noticed while callers wait."""


def pack(args: Sequence[str]) -> bytes:
    """A command in the Redis protocol (RESP2 multi-bulk), built as one string and encoded once
    (an ASCII argument's length is its byte length): ~0.25 us an argument, a third less than
    encoding each one, which matters for a settle of a hundred rows."""
    out = [f"*{len(args)}\r\n"]
    for arg in args:
        size = len(arg) if arg.isascii() else len(arg.encode())
        out.append(f"${size}\r\n{arg}\r\n")
    return "".join(out).encode()


def _connect(connection: Any) -> Awaitable[None]:
    """``connection.connect()``, which redis-py leaves untyped in some releases and types in
    others: called through ``Any``, it type-checks against both."""
    return cast(Awaitable[None], connection.connect())


class Wire:
    def __init__(self, client: Redis, *, timeout: float = DEFAULT_COMMAND_TIMEOUT) -> None:
        pool = client.connection_pool
        options = {
            **pool.connection_kwargs,
            # Reads and writes wait under the wire's own watchdog (redis-py's socket_timeout
            # would start a task per write).
            "socket_timeout": None,
            "socket_connect_timeout": pool.connection_kwargs.get("socket_connect_timeout")
            or timeout,
        }
        self._connection: AbstractConnection = pool.connection_class(**options)
        self._timeout = timeout
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        """Calls owed a reply by the reader task, in the order their commands were written."""
        self._reader: asyncio.Task[None] | None = None
        self._alone = False
        """A lone call is reading its own reply: the next replies are the reader's to take."""
        self._dialing: asyncio.Lock | None = None
        self._stale = False
        """The reply stream lost its place (a failed read or write): drop the socket first."""
        self._heard = 0.0
        """Loop time of the last reply, or of the first command owed one since the wire idled."""
        self._watch: asyncio.TimerHandle | None = None
        self._expired = False
        """The watchdog cut the connection: the failures that follow are a missed deadline."""

    async def call(self, args: Sequence[str]) -> Any:
        command = pack(args)
        if (
            self._stale
            or not self._connection.is_connected
            or (self._dialing is not None and self._dialing.locked())
            or (self._idle and self._peer_closed())
        ):
            await self._dial()
        if self._idle:
            return await self._call_alone(command)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._owe()
        self._waiting.append(future)
        try:
            await self._send(command)
        except asyncio.CancelledError:
            self._read_on()  # the command went out whole: its reply comes, and is dropped
            raise
        except BaseException as exc:
            failure = self._fail(exc)
            if failure is exc:
                raise
            raise failure from exc
        self._read_on()
        return await future

    async def _call_alone(self, command: bytes) -> Any:
        """Nothing else in flight: write and read in the caller's own task, which saves the
        hand-over to a reader (a loop turn, ~15% of a lone call). Calls arriving meanwhile queue
        behind it, and the reader takes over their replies once this one has its own — or,
        when the caller is cancelled while its reply is owed, that reply too: a cancel ends the
        caller's wait, not the stream, which the reader goes on reading where it stopped."""
        self._owe()
        self._alone = True
        try:
            await self._send(command)
            try:
                reply: Any = await self._connection.read_response(disconnect_on_error=False)
            except ResponseError as error:
                reply = error
            self._heard = asyncio.get_running_loop().time()
        except asyncio.CancelledError:
            dropped: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            dropped.cancel()
            self._waiting.appendleft(dropped)  # the oldest reply owed: read first, and dropped
            raise
        except BaseException as exc:
            failure = self._fail(exc)
            if failure is exc:
                raise
            raise failure from exc
        finally:
            self._alone = False
            self._read_on()
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def _send(self, command: bytes) -> None:
        """Write ``command`` to the socket whole, then wait for the transport to take it. Not
        through redis-py's ``send_packed_command``, which closes the connection when the wait is
        cancelled: the command is already buffered whole by then and goes out, so a cancel
        leaves the stream intact, the reply owed."""
        writer = self._connection._writer
        if writer is None:
            raise ConnectionError("the connection to Redis is not open")
        writer.write(command)
        await writer.drain()

    @property
    def _idle(self) -> bool:
        return self._reader is None and not self._alone and not self._waiting

    def _peer_closed(self) -> bool:
        """Whether the server closed the socket: its end of stream (or a reset) already came in,
        unread. Checked without waiting, only while nothing is in flight."""
        stream = self._connection._reader
        return stream is not None and (stream.at_eof() or stream.exception() is not None)

    def _owe(self) -> None:
        """A command is about to be written: the watchdog waits for its reply."""
        loop = asyncio.get_running_loop()
        if self._idle:
            self._heard = loop.time()
        if self._watch is None:
            self._watch = loop.call_at(self._heard + self._timeout, self._check)

    def _check(self) -> None:
        """The watchdog: cut the connection when replies are owed and none came in time."""
        self._watch = None
        if self._idle:
            return
        loop = asyncio.get_running_loop()
        due = self._heard + self._timeout
        if loop.time() < due:
            self._watch = loop.call_at(due, self._check)
            return
        self._expired = True
        writer = self._connection._writer
        if writer is not None:
            writer.transport.abort()  # the read or write waiting on it fails at once

    def _read_on(self) -> None:
        """Start the reader when replies are owed and nobody is reading."""
        if self._waiting and self._reader is None and not self._alone:
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _dial(self) -> None:
        """Open the connection, once, while every other call waits: the socket counts as
        connected before redis-py's setup exchange (``CLIENT SETINFO`` and the like) is over,
        and a call written then would read that exchange's replies, or it would read theirs."""
        if self._dialing is None:
            self._dialing = asyncio.Lock()
        async with self._dialing:
            if self._stale or self._peer_closed():
                await self._connection.disconnect(nowait=True)
                self._stale = self._expired = False
            if not self._connection.is_connected:
                try:
                    async with asyncio.timeout(self._timeout):
                        await _connect(self._connection)
                except (TimeoutError, RedisTimeoutError) as exc:
                    await self._connection.disconnect(nowait=True)
                    raise ConnectionError(
                        f"could not connect to Redis within command_timeout={self._timeout:g} s"
                    ) from exc

    async def _read(self) -> None:
        """Hand each reply to the oldest waiting call, until none is waiting."""
        connection = self._connection
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        try:
            while self._waiting:
                try:
                    reply: Any = await connection.read_response()
                except ResponseError as error:
                    reply = error
                self._heard = loop.time()
                future = self._waiting.popleft()
                if future.done():
                    continue
                if isinstance(reply, ResponseError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except BaseException as exc:
            # A reader the wire already replaced (or closed) owns nothing any more: only the
            # current one may declare the connection broken.
            if self._reader is me:
                self._fail(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if self._reader is me:
                self._reader = None

    def _fail(self, cause: BaseException) -> BaseException:
        """Break the connection for ``cause``; what the call that met it raises instead. A
        cancel is raised as is. Anything else is a ``ConnectionError`` (a missed deadline says
        so): a stream that failed mid-read or mid-write, however it failed (a reply out of
        step, a protocol error), leaves unknown whether the server ran the command, which is
        what callers that can find out (a claim's read-back, a settle sent again) catch."""
        if isinstance(cause, asyncio.CancelledError):
            self._broken("the call was cancelled")
            return cause
        if self._expired:
            return self._broken(f"no reply within command_timeout={self._timeout:g} s")
        broken = self._broken(str(cause) or type(cause).__name__)
        return cause if isinstance(cause, ConnectionError) else broken

    def _broken(self, reason: str) -> ConnectionError:
        """Fail every call still owed a reply, and make the next call dial afresh."""
        self._stale = True
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        waiting, self._waiting = self._waiting, collections.deque()
        for future in waiting:
            if not future.done():
                future.set_exception(ConnectionError(f"the connection to Redis broke: {reason}"))
        return ConnectionError(f"the connection to Redis broke: {reason}")

    async def close(self) -> None:
        reader = self._reader
        self._broken("the driver was closed")
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        await self._connection.disconnect()
