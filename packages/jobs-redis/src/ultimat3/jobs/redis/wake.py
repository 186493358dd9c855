"""The blocking wake: idle workers hear a queue name the moment another process enqueues.

The enqueue script PUBLISHes the queue of a row due within a second on ``{prefix}:wake`` — once
per claim, not once per row: it stays silent while an earlier announcement for that queue is
still unclaimed (``q:<queue>:woken``). Requeue, promote and resume announce too. Each worker
process holds ONE subscriber connection; a message is pushed to it by the server, so nothing
polls and pickup costs a single network hop.

The wake is PROVEN before it counts: a probe published through the ordinary connection has to
come back on the subscriber (``jobs.wake.live``), and is sent again every few seconds, so a
subscription that silently stopped delivering is noticed. A lost connection or an unanswered
probe clears ``live`` (``jobs.wake.lost``, and ``signal_wake_lost``) and the subscriber re-dials,
with a backoff that starts over once a probe proves the new subscription, until the server answers
again; meanwhile the worker's poll starts the jobs. Messages published while the subscriber was
away are lost with it, which is why the poll stays the guarantee.

Probe timing and re-dial backoff run on the event loop's real time: they are about a socket, not
about any time the queue reasons over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from ultimat3.jobs.core.errors import InvariantError
from ultimat3.jobs.core.ids import new_id
from ultimat3.jobs.core.logs import log_event
from ultimat3.jobs.core.wake import Backoff, signal_wake_lost

from .driver import RedisJobDriver
from .namespace import RedisClient

__all__ = ["RedisQueueWake", "start_queue_wake"]

_PROBE = "\x00probe:"
"""Probe messages start with a NUL, which no queue name does; every subscriber ignores others'."""
PROBE_EVERY_S = 10.0
PROBE_WAIT_S = 3.0
_REDIAL_FIRST_S = 0.1
_REDIAL_MAX_S = 5.0


class _ProbeUnansweredError(Exception):
    pass


class RedisQueueWake:
    """``client`` publishes the probes. The subscription holds a connection of its own, from
    ``subscriber`` (a plain client to any node of a Cluster: PUBLISH reaches every node), else
    one built from ``client``'s settings and named ``<channel>`` in ``CLIENT LIST``."""

    def __init__(
        self, client: RedisClient, channel: str, *, subscriber: Redis | None = None
    ) -> None:
        self._client = client
        self._channel = channel
        self._owns_subscriber = subscriber is None
        if subscriber is None:
            if not isinstance(client, Redis):
                raise InvariantError(
                    "a Cluster client cannot hold a subscription; pass subscriber= a "
                    "redis.asyncio.Redis client to any one node of the cluster",
                )
            pool = client.connection_pool
            options = {**pool.connection_kwargs, "client_name": channel}
            subscriber = Redis(
                connection_pool=ConnectionPool(connection_class=pool.connection_class, **options)
            )
        self._subscriber = subscriber
        self._listeners: list[Callable[[str], None]] = []
        self._live = False
        self._live_event = asyncio.Event()
        self._warned_unverified = False
        self._task: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        return self._live

    @property
    def hears_outbox(self) -> bool:
        """False: the outbox stages in Postgres and announces there, never on this channel."""
        return False

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def wait_live(self, timeout: float) -> bool:
        """Wait until a probe proved delivery (True), or ``timeout`` seconds (False)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._live_event.wait(), timeout)
        return self._live

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._set_live(False)
        if self._owns_subscriber:
            await self._subscriber.aclose()

    def _set_live(self, live: bool) -> None:
        was_live, self._live = self._live, live
        if live:
            if not was_live:
                log_event(logging.INFO, "jobs.wake.live", channel=self._channel)
            self._live_event.set()
        else:
            self._live_event.clear()
            if was_live:
                signal_wake_lost(self)

    async def _run(self) -> None:
        redial = Backoff(_REDIAL_FIRST_S, _REDIAL_MAX_S)
        while True:
            # Any: redis-py types PubSub.aclose in some releases and not in others.
            pubsub: Any = self._subscriber.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                await self._listen(pubsub, redial)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                retry_in = redial.next()
                if self._live:
                    log_event(
                        logging.WARNING,
                        "jobs.wake.lost",
                        channel=self._channel,
                        reason=repr(exc),
                        retry_in_s=retry_in,
                    )
                self._set_live(False)
                if isinstance(exc, _ProbeUnansweredError) and not self._warned_unverified:
                    self._warned_unverified = True
                    log_event(
                        logging.WARNING,
                        "jobs.wake.unverified",
                        channel=self._channel,
                        fix="a probe published on the server never came back to the "
                        "subscriber: a proxy between the worker and Redis may not carry "
                        "pub/sub; connect the worker to Redis directly",
                    )
                await asyncio.sleep(retry_in)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _listen(self, pubsub: Any, redial: Backoff) -> None:
        """Deliver, probing as it goes; a proof starts ``redial`` over. Returns only by raising."""
        loop = asyncio.get_running_loop()
        token: str | None = None
        sent_at = proven_at = 0.0
        while True:
            now = loop.time()
            if token is None and (not self._live or now - proven_at >= PROBE_EVERY_S):
                token = _PROBE + new_id()
                sent_at = now
                await self._client.publish(self._channel, token)
            deadline = sent_at + PROBE_WAIT_S if token is not None else proven_at + PROBE_EVERY_S
            message = await pubsub.get_message(
                ignore_subscribe_messages=True, timeout=max(0.01, deadline - loop.time())
            )
            if message is None:
                if token is not None and loop.time() >= sent_at + PROBE_WAIT_S:
                    raise _ProbeUnansweredError(f"no probe back within {PROBE_WAIT_S}s")
                continue
            data = message["data"]
            if data == token:
                token, proven_at = None, loop.time()
                redial.reset()
                self._set_live(True)
            elif not data.startswith(_PROBE):
                for listener in list(self._listeners):
                    listener(data)


def start_queue_wake(driver: RedisJobDriver, *, subscriber: Redis | None = None) -> RedisQueueWake:
    """Start the wake for ``driver``'s namespace (one subscriber connection, from a running
    event loop); hand it to ``job_worker(..., wake=...)`` and ``close()`` it on shutdown. On a
    Cluster, pass ``subscriber``: a plain client to any one node."""
    wake = RedisQueueWake(driver.client, driver.wake_channel, subscriber=subscriber)
    wake.start()
    return wake
