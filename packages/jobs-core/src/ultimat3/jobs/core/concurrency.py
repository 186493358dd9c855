"""Fleet-wide concurrency: a job's ``concurrency`` held as slots in the driver's lease store.

Every run of a job that declares ``concurrency`` takes a slot under its lease key before its body
starts — ``job:<name>`` for a plain cap, ``job-key:<name>:<key>`` per key — renewed by the same loop
that renews the visibility lease and released when the run ends; a SIGKILLed worker's slot frees
itself when its TTL (the visibility timeout) passes.

A slot is held per CLAIM (``<job id>:<claim token>``), so a redelivered run never shares the slot
its previous claim may still be holding. When the key is busy:

=============================================  ==========================================
the key is busy, ``when_busy='wait'``          handed back: ready again, no attempt burned
another run holds it, ``when_busy='fail'``     refused: failed with ``X_JOB_KEY_BUSY``
only this run's own earlier claims hold it     handed back — never failed by its leftovers
busy at the acquire, free a moment later       handed back, claimed again next poll
the key cannot be computed (``key`` raised,    the attempt fails on the ordinary retry path,
or the stored input no longer parses)          its body never started
=============================================  ==========================================

The decision is taken at every claim, so a retry or a resumed run takes its key again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from .errors import ConcurrencyUnenforceableError, JobKeyBusyError
from .job import AnyJobHandle
from .logs import log_event
from .model import ClaimedJob
from .protocol import LeaseStore

__all__ = ["FleetSlots", "SlotDecision", "require_lease_store", "slot_holder"]


def slot_holder(claimed: ClaimedJob) -> str:
    """Who holds a slot: one claim of one job."""
    return f"{claimed.id}:{claimed.claim.claim}"


def require_lease_store(handles: Iterable[AnyJobHandle], leases: LeaseStore | None) -> None:
    """Refuse to boot a worker that would serve a capped job it cannot cap."""
    if leases is not None:
        return
    capped = sorted(handle.name for handle in handles if handle.concurrency is not None)
    if capped:
        raise _unenforceable(capped)


def _unenforceable(capped: list[str]) -> ConcurrencyUnenforceableError:
    return ConcurrencyUnenforceableError(
        f"{', '.join(capped)} declare(s) concurrency, but this driver has no lease store, so "
        "no fleet-wide cap could be held; use a driver with leases (postgres, memory) or "
        "remove the declaration",
        meta={"jobs": capped},
    )


@dataclass(frozen=True, slots=True)
class SlotDecision:
    """What a claimed run may do about its job's concurrency.

    ``run``: uncapped. ``held``: the slot ``key``/``holder`` is this run's until released.
    ``wait``: hand the run back. ``refuse``: settle it refused with ``error``. ``invalid``: fail
    the attempt with ``error`` without starting the body.
    """

    kind: Literal["run", "held", "wait", "refuse", "invalid"]
    key: str = ""
    holder: str = ""
    limit: int = 0
    value: Any = None
    error: BaseException | None = None


_RUN = SlotDecision("run")
_WAIT = SlotDecision("wait")


class FleetSlots:
    """Takes, renews and releases the slots of one worker's runs."""

    def __init__(self, leases: LeaseStore | None, *, ttl: float) -> None:
        self._leases = leases
        self._ttl = ttl

    async def take(self, handle: AnyJobHandle | None, claimed: ClaimedJob) -> SlotDecision:
        if handle is None or handle.concurrency is None:
            return _RUN
        if self._leases is None:
            # A capped job the worker's boot check did not see (a row enqueued with queue= on a
            # queue its declaration does not name): its cap cannot be held, so it does not run.
            return SlotDecision("invalid", error=_unenforceable([handle.name]))
        try:
            value = handle.codec.parse(claimed.input)
            lease = handle.concurrency_lease(value)
        except Exception as exc:
            return SlotDecision("invalid", error=exc)
        assert lease is not None
        key, limit, when_busy = lease
        holder = slot_holder(claimed)
        try:
            if await self._leases.acquire(key, holder, limit=limit, ttl=self._ttl):
                return SlotDecision("held", key=key, holder=holder, limit=limit)
            if when_busy == "wait":
                return _WAIT
            holders = await self._leases.holders(key)
        except Exception as exc:
            log_event(
                logging.WARNING,
                "jobs.worker.slot-unavailable",
                job=claimed.name,
                job_id=claimed.id,
                key=key,
                error=repr(exc),
            )
            return _WAIT
        own = f"{claimed.id}:"
        others = [held for held in holders if not held.startswith(own)]
        if len(others) < limit:
            return _WAIT
        return SlotDecision(
            "refuse",
            key=key,
            value=value,
            error=JobKeyBusyError(
                f"{handle.name}: {len(others)} run(s) already hold concurrency key {key!r} "
                f"(limit {limit}), so this run was refused (when_busy='fail'). See them with "
                f"`ujobs jobs list --name {handle.name} --state running --json`; "
                "`ujobs jobs retry <id>` queues this one again",
                meta={"job": handle.name, "key": key, "limit": limit},
            ),
        )

    async def renew(self, slot: SlotDecision, *, ended: Callable[[], bool]) -> bool:
        """Keep ``slot``; a slot that lapsed but nobody took is taken again. False: lost.

        ``ended()`` says the run is over: its slot is never taken again then, and one taken again
        while the run was ending is handed straight back — a late renewal must not leave a ghost
        holder keeping the key busy for a whole TTL."""
        assert self._leases is not None
        if await self._leases.renew(slot.key, slot.holder, ttl=self._ttl):
            return True
        if ended():
            return False
        taken = await self._leases.acquire(slot.key, slot.holder, limit=slot.limit, ttl=self._ttl)
        if taken and ended():
            await self.release(slot)
            return False
        return taken

    async def release(self, slot: SlotDecision) -> None:
        assert self._leases is not None
        try:
            await self._leases.release(slot.key, slot.holder)
        except Exception as exc:
            log_event(
                logging.WARNING,
                "jobs.worker.slot-release-failed",
                key=slot.key,
                holder=slot.holder,
                error=repr(exc),
                fix="the slot frees itself when its TTL (the visibility timeout) passes",
            )
