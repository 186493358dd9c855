"""The wake: LISTEN on ``x_jobs_wake`` so a job another process committed starts at once.

One session per process holds ``LISTEN x_jobs_wake`` and hands each notification's payload (a
queue name) to the subscribers — the worker rings its claim loop with it. The same session
listens on ``x_outbox_wake`` and hands its notifications on as core's ``OUTBOX_WAKE`` (the empty
name, which no queue has): the outbox relay's cue that a commit staged a row. The enqueue statement
throttles its NOTIFY (not while a row of the queue from the same WAKE_SLOT_S slot still waits,
only rows due within WAKE_DUE_WITHIN_S, never for a dedupe), so the wake costs the enqueuers
almost nothing.

The wake is PROVEN before anyone relies on it: after each LISTEN, a probe is sent through the
pool, and only its arrival on the session makes ``live`` true (``jobs.wake.live``) — which lets the
worker raise its idle poll ceiling from 2 s to 5 s. A probe that could not be sent or never arrived
is sent again, with a capped back-off, for as long as the session lasts: the pool's connections may
have died with the server that took the last session. The first such failure is logged once as
``jobs.wake.unverified`` with the usual cause: a transaction-pooling proxy (PgBouncer
``pool_mode = transaction``) hands the LISTEN connection back to its pool and delivers nothing.

A lost session (a restarted server, a terminated backend) makes ``live`` false, is logged as
``jobs.wake.lost`` and signalled (``signal_wake_lost``), and is dialled again with a capped
back-off; meanwhile the worker's poll is the guarantee, as it always is — a notification is lost
with the session that would have carried it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo

from ultimat3.jobs.core.clock import SYSTEM_CLOCK, Clock
from ultimat3.jobs.core.constants import OUTBOX_WAKE
from ultimat3.jobs.core.ids import new_id
from ultimat3.jobs.core.logs import log_event
from ultimat3.jobs.core.wake import Backoff, signal_wake_lost

from .executor import PgExecutor, PgTarget, pg_executor
from .sql_outbox import OUTBOX_WAKE_CHANNEL
from .sql_wake import SQL_LISTEN, SQL_LISTEN_OUTBOX, SQL_WAKE_PROBE

__all__ = ["PROBE_PREFIX", "Listener", "PgQueueWake", "start_queue_wake"]

PROBE_PREFIX = "x_jobs_wake_probe:"
"""Payloads starting with this are the wake's own probes, never handed to subscribers."""

Listener: TypeAlias = "str | Callable[[], Awaitable[AsyncConnection[Any]]]"
"""Where the LISTEN session comes from: a URL/conninfo to dial, or a coroutine function that
returns a fresh autocommit connection (called again after a session is lost)."""

_PROBE_TIMEOUT_S = 5.0
_REDIAL_FIRST_S = 0.25
"""The first wait before a re-dial, and before a probe sent again while the session is unproven."""
_REDIAL_MAX_S = 10.0
"""Where a re-dial's back-off stops."""
_REPROBE_MAX_S = 60.0
"""Where the probe's back-off stops: behind a transaction-pooling proxy no probe ever arrives,
and an idle worker there should send one statement a minute for it, not six."""
_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}
"""TCP keepalives on a dialled session: a peer that vanished without a reset is noticed in about
a minute instead of never."""


class PgQueueWake:
    """A ``QueueWake`` over one LISTEN session. Build it with ``start_queue_wake()``."""

    def __init__(
        self,
        *,
        listener: Listener,
        executor: PgExecutor,
        owns_executor: bool,
        clock: Clock,
        probe_timeout: float,
    ) -> None:
        self._dial = _dialer(listener)
        self._executor = executor
        self._owns_executor = owns_executor
        self._clock = clock
        self._probe_timeout = probe_timeout
        self._subscribers: list[Callable[[str], None]] = []
        self._live = False
        self._warned_unverified = False
        self._closed = False
        self._session: AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._probe: str | None = None
        self._probe_arrived = asyncio.Event()

    @property
    def live(self) -> bool:
        """True once a probe came back on the current session; false again when it is lost."""
        return self._live

    @property
    def hears_outbox(self) -> bool:
        """True: the session listens on the outbox's channel too."""
        return True

    def __repr__(self) -> str:
        return f"PgQueueWake(live={self._live}, subscribers={len(self._subscribers)})"

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        self._subscribers.append(listener)
        self.start()

        def unsubscribe() -> None:
            if listener in self._subscribers:
                self._subscribers.remove(listener)

        return unsubscribe

    def start(self) -> None:
        """Begin holding the session (idempotent; needs a running event loop)."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._hold_session(), name="ultimat3-jobs-wake"
            )

    async def close(self) -> None:
        self._closed = True
        self._lose_live()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._close_session()
        if self._owns_executor:
            await self._executor.close()

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(Exception):
                await session.close()

    def _lose_live(self) -> bool:
        """Clear ``live``, signalling the loss when it was set; answers whether it was."""
        was_live, self._live = self._live, False
        if was_live:
            signal_wake_lost(self)
        return was_live

    async def _hold_session(self) -> None:
        """Dial, LISTEN, probe, deliver — and dial again whenever the session dies."""
        redial = Backoff(_REDIAL_FIRST_S, _REDIAL_MAX_S)
        while not self._closed:
            try:
                self._session = await self._dial()
                await self._session.execute(SQL_LISTEN_OUTBOX)
                await self._session.execute(SQL_LISTEN)
                redial.reset()
                prover = asyncio.create_task(self._prove(), name="ultimat3-jobs-wake-probe")
                try:
                    await self._deliver(self._session)
                finally:
                    prover.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await prover
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                retry_in = redial.next()
                log_event(
                    logging.WARNING,
                    "jobs.wake.lost",
                    error=str(exc) or type(exc).__name__,
                    was_live=self._lose_live(),
                    retry_in_s=retry_in,
                )
                await self._close_session()
                if not self._closed:
                    await self._clock.sleep(retry_in)

    async def _deliver(self, session: AsyncConnection[Any]) -> None:
        async for notify in session.notifies():
            payload = OUTBOX_WAKE if notify.channel == OUTBOX_WAKE_CHANNEL else notify.payload
            if payload.startswith(PROBE_PREFIX):
                if payload == self._probe:
                    self._probe_arrived.set()
                continue
            for subscriber in list(self._subscribers):
                subscriber(payload)
        raise psycopg.OperationalError("the LISTEN session ended")

    async def _prove(self) -> None:
        """Probe until a probe arrives on the session, which makes the wake live; the session's
        end cancels it. One failed probe must not leave a whole session unproven."""
        again = Backoff(_REDIAL_FIRST_S, _REPROBE_MAX_S)
        while not await self._probe_once():
            await self._clock.sleep(again.next())
        self._live = True
        log_event(logging.INFO, "jobs.wake.live", channel="x_jobs_wake")

    async def _probe_once(self) -> bool:
        """Send a probe through the pool; True when it arrived on the session in time."""
        self._probe = f"{PROBE_PREFIX}{new_id()}"
        self._probe_arrived.clear()
        try:
            await self._executor.fetch(SQL_WAKE_PROBE, {"payload": self._probe}, idempotent=True)
        except Exception as exc:
            self._unverified(f"the probe could not be sent: {exc}")
            return False
        arrived = asyncio.create_task(self._probe_arrived.wait())
        deadline = asyncio.create_task(self._clock.sleep(self._probe_timeout))
        try:
            await asyncio.wait((arrived, deadline), return_when=asyncio.FIRST_COMPLETED)
        finally:
            arrived.cancel()
            deadline.cancel()
        if self._probe_arrived.is_set():
            return True
        self._unverified(f"a probe sent through the pool did not arrive in {self._probe_timeout} s")
        return False

    def _unverified(self, why: str) -> None:
        if self._warned_unverified:
            return
        self._warned_unverified = True
        log_event(
            logging.WARNING,
            "jobs.wake.unverified",
            why=why,
            fix=(
                "notifications do not reach this process, so jobs start on the poll (within 2 s). "
                "A transaction-pooling proxy (PgBouncer pool_mode=transaction) delivers none: give "
                "the worker a direct or session-pooled DATABASE_URL"
            ),
        )


def start_queue_wake(
    *,
    listener: Listener,
    executor: PgTarget,
    clock: Clock = SYSTEM_CLOCK,
    probe_timeout: float = _PROBE_TIMEOUT_S,
) -> PgQueueWake:
    """The wake of one worker process: hand it to ``job_worker(..., wake=...)``.

    ``listener`` is where the LISTEN session comes from — the database URL (dialled directly,
    never through a transaction-pooling proxy), or a coroutine function returning a fresh
    autocommit ``AsyncConnection``. ``executor`` is the pool the probe is sent through (the
    driver's ``executor``, a psycopg pool, or a URL). The session is dialled at once when called
    inside a running event loop, else when the first subscriber arrives; ``await wake.close()``
    ends it.
    """
    wake = PgQueueWake(
        listener=listener,
        executor=pg_executor(executor),
        owns_executor=isinstance(executor, str),
        clock=clock,
        probe_timeout=probe_timeout,
    )
    with contextlib.suppress(RuntimeError):  # no running loop: the first subscribe starts it
        asyncio.get_running_loop()
        wake.start()
    return wake


def _dialer(listener: Listener) -> Callable[[], Awaitable[AsyncConnection[Any]]]:
    if callable(listener):
        return listener
    url = listener

    async def dial() -> AsyncConnection[Any]:
        return await AsyncConnection.connect(make_conninfo(url, **_KEEPALIVES), autocommit=True)

    return dial
