"""The transactional outbox: enqueue inside the caller's transaction, publish after it commits.

Without it, a job enqueued before a rollback runs against rows that never existed, and a commit
followed by a crash before the enqueue loses the job. With it:

- ``outbox_jobs_facade(store=, driver=, current_tx=)`` is installed with ``set_jobs_facade``.
  Inside an ambient transaction (``current_tx()`` answers one) an enqueue is STAGED in the store,
  in that transaction, with its job id and run id already allocated — so ``Enqueued`` names the
  job it will become. Outside one it publishes straight to the driver, or raises
  ``X_OUTBOX_NO_TX`` under ``mode="required"``.
- ``outbox_relay(store=, driver=)`` publishes committed rows: it CLAIMS a batch with a lease
  (``claim_lease``), publishes it through ``driver.enqueue_many`` under the staged ids, then
  marks it published. A crash between the two re-publishes, and the repeat meets the job the first
  publish made (an id that already names a row inserts nothing). Release and mark-published are
  fenced on the claimant, so a relay that stalls past its lease retires and releases nothing
  another relay re-claimed. A publish that fails stops the batch — later rows never overtake it —
  and hands it back at once. No claim takes a row staged after a batch another relay still holds
  (publishing it, or stuck with it until its lease lapses): relays take the outbox in turn, in
  staged order.

Handlers stay at-least-once (a lapsed visibility lease re-delivers), so write them idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from .clock import Clock
from .constants import OUTBOX_WAKE
from .durations import Duration
from .errors import InvariantError, OutboxNoTxError
from .facade import publish
from .ids import new_id
from .lifecycle import (
    LateDeadline,
    Wakeup,
    idle_ceiling,
    lifecycle_deadline,
    on_shutdown,
    positive_seconds,
)
from .logs import log_event
from .model import Enqueued, EnqueueRequest
from .protocol import JobDriver, OutboxStore, QueueWake
from .wake import on_wake_lost, signal_enqueued

__all__ = [
    "DEFAULT_CLAIM_LEASE_S",
    "OutboxJobsFacade",
    "OutboxRelay",
    "outbox_jobs_facade",
    "outbox_relay",
]

DEFAULT_CLAIM_LEASE_S = 30.0
"""How long the rows of a relay that died mid-batch wait before another relay may take them."""


class OutboxJobsFacade:
    """Stages enqueues in the ambient transaction; publishes directly outside one."""

    def __init__(
        self,
        *,
        store: OutboxStore,
        driver: JobDriver,
        current_tx: Callable[[], Any],
        mode: Literal["auto", "required"] = "auto",
    ) -> None:
        if mode not in ("auto", "required"):
            raise InvariantError(f"outbox mode must be 'auto' or 'required', got {mode!r}")
        self._store = store
        self._driver = driver
        self._current_tx = current_tx
        self._mode = mode

    def current_tx(self) -> Any:
        return self._current_tx()

    async def enqueue(self, request: EnqueueRequest) -> Enqueued:
        if self._current_tx() is not None:
            await self._store.stage(request)
            return Enqueued(request.id, request.run_id)
        if self._mode == "required":
            raise OutboxNoTxError(
                f"{request.name}: enqueued outside a transaction while the outbox is required; "
                "enqueue inside the transaction that writes the rows the job reads",
                meta={"job": request.name},
            )
        return await publish(self._driver, request)


def outbox_jobs_facade(
    *,
    store: OutboxStore,
    driver: JobDriver,
    current_tx: Callable[[], Any],
    mode: Literal["auto", "required"] = "auto",
) -> OutboxJobsFacade:
    """The facade to install with ``set_jobs_facade``. ``current_tx()`` answers the caller's
    open transaction, or None outside one."""
    return OutboxJobsFacade(store=store, driver=driver, current_tx=current_tx, mode=mode)


class OutboxRelay:
    """Publishes committed outbox rows onto the queue. Build it with ``outbox_relay()``."""

    def __init__(
        self,
        *,
        store: OutboxStore,
        driver: JobDriver,
        claim_lease: Duration,
        batch: int,
        interval: Duration,
        idle_poll_max: Duration | None,
        clock: Clock | None,
        drain_on_shutdown: bool,
        wake: QueueWake | None,
    ) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvariantError(f"batch must be a whole number >= 1, got {batch!r}")
        self._store = store
        self._driver = driver
        self._lease = positive_seconds(claim_lease, "claim_lease")
        if self._lease < 0.001:  # a store keeps its stamps to the microsecond, or the millisecond
            raise InvariantError(
                f"claim_lease must be at least 1 ms, got {claim_lease!r}: a shorter one lapses "
                "as it is stamped, and two relays could hold one batch",
                meta={"field": "claim_lease"},
            )
        self._batch = batch
        self._unretired: set[str] = set()
        """Ids this relay published whose retirement failed (a blip on the store): taken again,
        they are retired without a second publish. A first publish deduped against a live job
        inserted nothing under its id, and once that job finished a second one would insert a
        row, and run the job twice. (A relay that dies there leaves this to the next one, which
        publishes again: that case stays.)"""
        self._interval = positive_seconds(interval, "interval")
        self._idle_max = (
            None if idle_poll_max is None else positive_seconds(idle_poll_max, "idle_poll_max")
        )
        self._wake = wake
        self._clock = clock or driver.clock
        self._drain_on_shutdown = drain_on_shutdown
        self.id = f"relay-{new_id()}"
        self._running = False
        self._wakeup = Wakeup()
        self._deadline = LateDeadline(self._clock)
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._unregister: Callable[[], None] | None = None
        self._unsubscribe: list[Callable[[], None]] = []

    def start(self) -> None:
        """Begin relaying on the running event loop."""
        if self._loop_task is not None:
            raise InvariantError("this relay was already started; build a new one")
        self._running = True
        if self._wake is not None:
            self._unsubscribe += (
                self._wake.subscribe(self._on_wake),
                on_wake_lost(self._on_wake_lost),
            )
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        if self._drain_on_shutdown:
            self._unregister = on_shutdown(self._accept, self._close)

    async def stop(self, deadline: datetime | None = None) -> None:
        """Stop polling and join the pass in flight — await it before closing the database. The
        ``deadline`` binds late: a shutdown landing on this wait bounds it too; the earliest
        wins."""
        if deadline is not None:
            self._deadline.bind(deadline)
        self._accept("stop")
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(self._join())
        await asyncio.shield(self._stopping)

    def _accept(self, reason: str) -> None:
        self._running = False
        self._wakeup.ring()

    def _on_wake(self, queue: str) -> None:
        if queue == OUTBOX_WAKE and self._running:
            self._wakeup.ring()

    def _on_wake_lost(self, wake: QueueWake) -> None:
        """A pass now: what the lost session would have announced was lost with it, and a wait
        stretched to 5 s on its word would hold staged rows past the 2 s the poll promises."""
        if wake is self._wake and self._running:
            self._wakeup.ring()

    def _idle_ceiling(self) -> float:
        """A wake that never hears the outbox (Redis pub/sub: stages are announced in Postgres)
        proves nothing about staged rows: the relay polls as without one."""
        wake = self._wake
        # getattr: a wake written before the protocol named the member hears no outbox.
        heard = wake if wake is not None and getattr(wake, "hears_outbox", False) else None
        return idle_ceiling(self._idle_max, heard)

    async def _close(self, budget: float | None) -> None:
        budget = lifecycle_deadline() if budget is None else budget
        await self.stop(self._clock.now() + timedelta(seconds=budget))

    async def _join(self) -> None:
        task = self._loop_task
        if task is not None and not await self._deadline.wait_for(
            asyncio.gather(task, return_exceptions=True)
        ):
            log_event(
                logging.ERROR,
                "jobs.outbox.drain-abandoned",
                relay=self.id,
                fix="the batch in flight is published again once its claim lease lapses",
            )
        if self._unregister is not None:
            self._unregister()
            self._unregister = None
        for undo in self._unsubscribe:
            undo()
        self._unsubscribe.clear()

    async def _loop(self) -> None:
        idle = self._interval
        while self._running:
            try:
                published = await self.run_once()
            except Exception as exc:
                log_event(logging.ERROR, "jobs.outbox.tick-failed", relay=self.id, error=repr(exc))
                published = 0  # a failing store or driver gets the idle back-off, not a hot loop
            if published == self._batch:
                wait = 0.0  # a full batch: more is likely waiting
            elif published:
                wait = idle = self._interval
            else:  # the ceiling is read now: it drops when the wake stops being live
                ceiling = max(self._idle_ceiling(), self._interval)
                wait, idle = min(idle, ceiling), min(idle * 2, ceiling)
            if self._running:
                await self._wakeup.wait(self._clock, wait)

    async def run_once(self) -> int:
        """One pass: claim a batch, publish it in staged order, retire it. Answers the rows
        published. A failed publish hands the batch back at once and raises.

        Every pass claims as the relay itself (``self.id``): a batch a pass left claimed — its
        hand-back or its retirement was lost with the connection — is taken again by the next
        pass instead of fencing every later row off until its lease lapses. One relay's passes
        must not overlap (its loop runs them one after another)."""
        claimant = self.id
        records = await self._store.claim(claimant=claimant, limit=self._batch, lease=self._lease)
        if not records:
            return 0
        ids = [record.request.id for record in records]
        requests = [
            record.request for record in records if record.request.id not in self._unretired
        ]
        try:
            enqueued = await self._driver.enqueue_many(requests)
        except BaseException:
            await self._store.release(ids, claimant=claimant)
            raise
        try:
            await self._store.mark_published(ids, claimant=claimant)
        except BaseException:
            self._unretired.update(ids)
            raise
        self._unretired.difference_update(ids)
        for queue in {r.queue for r, e in zip(requests, enqueued, strict=True) if not e.deduped}:
            signal_enqueued(queue)
        return len(records)


def outbox_relay(
    *,
    store: OutboxStore,
    driver: JobDriver,
    claim_lease: Duration = DEFAULT_CLAIM_LEASE_S,
    batch: int = 100,
    interval: Duration = 0.2,
    idle_poll_max: Duration | None = None,
    clock: Clock | None = None,
    drain_on_shutdown: bool = True,
    wake: QueueWake | None = None,
) -> OutboxRelay:
    """A relay from ``store`` to ``driver``; ``relay.start()``, then ``await relay.stop()``.

    It polls every ``interval`` while there is work, doubling to ``idle_poll_max`` while idle
    (2 s; 5 s while ``wake`` is proven live). ``wake`` is a driver's ``QueueWake``: an
    ``OUTBOX_WAKE`` notification (a commit staged a row) brings a pass at once. ``start()``
    registers the process's shutdown hooks (``drain_on_shutdown=False`` opts out, for a caller
    that drives its own teardown).
    """
    return OutboxRelay(
        store=store,
        driver=driver,
        claim_lease=claim_lease,
        batch=batch,
        interval=interval,
        idle_poll_max=idle_poll_max,
        clock=clock,
        drain_on_shutdown=drain_on_shutdown,
        wake=wake,
    )
