"""Keeping leases alive: ONE timer loop per worker renews every lease, slot and registry row due.

A job's visibility lease, its fleet concurrency slot and the worker's registry row each need a
renewal every ``interval``; a timer per job would cost a task per job for the many jobs that finish
long before their first renewal. Instead every renewal is an entry in one heap, and one loop wakes
at the earliest due entry and renews what is due.

What a renewal answers decides the signal, and none is given for an entry already cancelled — the
job finished and its ack moved the row, so the renewal that was on the wire comes back refused and
means nothing:

======================================  ==============================================
a renewal raised, the window has room   ``failed(error)`` — a warning
a renewal answered False                ``refused()`` — the thing is gone, at once
a whole window with none landing        ``lapsed()`` — presumed gone
======================================  ==============================================

The window is measured from the send time of the last renewal that landed, on this process's clock,
so a renewal that hangs is caught exactly like one that fails.

``stop()`` is terminal for the renewals already on the wire too: they report nothing, and it waits
for them to land (``STOP_GRACE_S`` at most, then cancels them), so none rewrites what its caller
tears down next — a worker's registry row renewed after ``remove_worker`` was listed again for a
whole visibility timeout.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from datetime import datetime, timedelta
from typing import Protocol

from .clock import Clock
from .lifecycle import Wakeup
from .logs import log_event

__all__ = ["STOP_GRACE_S", "Renewable", "Renewal", "RenewalLoop"]

STOP_GRACE_S = 1.0
"""How long ``stop()`` waits for the renewals on the wire: well past a healthy round trip, short
against a drain's budget. Real time, not the clock's: it bounds a socket, not a lease."""


class Renewable(Protocol):
    """What a ``RenewalLoop`` keeps alive: an object, so a run costs no closures."""

    async def renew(self) -> bool:
        """Extend it; False when it is no longer this process's to extend."""
        ...

    def refused(self) -> None: ...

    def lapsed(self) -> None: ...

    def failed(self, error: BaseException) -> None: ...


class Renewal:
    """One ``Renewable`` in a ``RenewalLoop``; ``RenewalLoop.drop()`` it when it is done."""

    __slots__ = ("active", "in_flight", "landed_at", "target")

    def __init__(self, target: Renewable, landed_at: datetime) -> None:
        self.target = target
        self.landed_at = landed_at
        self.active = True
        self.in_flight = False


class _Dropped:
    """What a dropped entry renews: nothing. Nothing calls it either; every visit and every
    landing checks ``active`` first."""

    async def renew(self) -> bool:
        return False

    def refused(self) -> None:
        return None

    def lapsed(self) -> None:
        return None

    def failed(self, error: BaseException) -> None:
        return None


_DROPPED = _Dropped()


class RenewalLoop:
    """Renews each entry every ``interval`` and gives it up ``window`` after the last landing."""

    def __init__(self, clock: Clock, *, interval: float, window: float) -> None:
        self._clock = clock
        self._interval = timedelta(seconds=interval)
        self._window = timedelta(seconds=window)
        self._heap: list[tuple[datetime, int, Renewal]] = []
        self._seq = itertools.count()
        self._cancelled = 0
        self._wakeup = Wakeup()
        self._task: asyncio.Task[None] | None = None
        self._renewing: set[asyncio.Task[None]] = set()

    def add(self, target: Renewable, now: datetime | None = None) -> Renewal:
        """Start renewing ``target``, taken (or last renewed) at ``now``; the first renewal is
        due one interval after it. A caller adding a batch reads the clock once for all."""
        if now is None:
            now = self._clock.now()
        entry = Renewal(target, now)
        due = now + self._interval
        if not self._heap or due < self._heap[0][0]:
            self._wakeup.ring()
        heapq.heappush(self._heap, (due, next(self._seq), entry))
        return entry

    def drop(self, entry: Renewal) -> None:
        """Cancel ``entry``; its slot in the heap is reclaimed lazily. The entry lets go of its
        target at once: a finished job's whole run would otherwise stay reachable from the heap
        until that slot came up, up to an interval later, long enough to be promoted to the
        oldest generation and cost full garbage collections (a third of a busy worker's CPU)."""
        if entry.active:
            entry.active = False
            entry.target = _DROPPED
            self._cancelled += 1
            if self._cancelled > 1024 and self._cancelled * 2 > len(self._heap):
                self._heap = [item for item in self._heap if item[2].active]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop renewing everything; wait for the renewals on the wire, then cancel what is left
        of them (a write already sent may still land)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for _, _, entry in self._heap:
            entry.active = False
        self._heap.clear()
        if self._renewing:
            _, late = await asyncio.wait(set(self._renewing), timeout=STOP_GRACE_S)
            for renewing in late:
                renewing.cancel()

    async def _run(self) -> None:
        while True:
            now = self._clock.now()
            while self._heap and self._heap[0][0] <= now:
                _, _, entry = heapq.heappop(self._heap)
                if not entry.active:
                    self._cancelled = max(0, self._cancelled - 1)
                    continue
                try:
                    self._visit(entry, now)
                except Exception as exc:  # one entry's hook throwing must not stop every renewal
                    log_event(logging.ERROR, "jobs.renewal.visit-failed", error=repr(exc))
            wait = (self._heap[0][0] - now).total_seconds() if self._heap else None
            await self._wakeup.wait(self._clock, wait)

    def _visit(self, entry: Renewal, now: datetime) -> None:
        lapses_at = entry.landed_at + self._window
        if now >= lapses_at:
            entry.active = False
            entry.target.lapsed()
            return
        if not entry.in_flight:
            entry.in_flight = True
            task = asyncio.get_running_loop().create_task(self._renew(entry))
            self._renewing.add(task)
            task.add_done_callback(self._renewing.discard)
        due = min(now + self._interval, entry.landed_at + self._window)
        heapq.heappush(self._heap, (due, next(self._seq), entry))

    async def _renew(self, entry: Renewal) -> None:
        sent_at = self._clock.now()
        try:
            landed = await entry.target.renew()
        except Exception as exc:
            if entry.active:
                entry.target.failed(exc)
            return
        finally:
            entry.in_flight = False
        if not entry.active:
            return
        if landed:
            entry.landed_at = max(entry.landed_at, sent_at)
        else:
            entry.active = False
            entry.target.refused()
