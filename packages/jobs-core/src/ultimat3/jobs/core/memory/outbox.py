"""The outbox store in one heap, with the same claim, lease and fencing rules as the Postgres one.

For ``ujobs dev`` and tests. ``transaction()`` stands in for a database transaction: rows staged
inside it become claimable when the block exits cleanly and vanish when it raises — exactly the
property the outbox exists for. Pass ``store.current_tx`` to ``outbox_jobs_facade``.

A published row is dropped, so ``retained()`` is the relay's backlog, not a running total.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from ..clock import SYSTEM_CLOCK, Clock
from ..model import EnqueueRequest, OutboxRecord

__all__ = ["MemoryOutboxStore", "MemoryOutboxTransaction", "memory_outbox_store"]


@dataclass(eq=False)
class MemoryOutboxTransaction:
    """Rows staged inside one ``transaction()`` block, not yet committed."""

    staged: list[OutboxRecord] = field(default_factory=list)


class MemoryOutboxStore:
    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._rows: dict[str, OutboxRecord] = {}
        self._leases: dict[str, datetime] = {}
        """Row id -> when its claim lapses."""
        self._tx: contextvars.ContextVar[MemoryOutboxTransaction | None] = contextvars.ContextVar(
            f"memory_outbox_tx_{id(self)}", default=None
        )

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryOutboxTransaction]:
        """Stage inside the block; commit on a clean exit, discard on an exception."""
        if self._tx.get() is not None:
            raise RuntimeError("memory outbox transactions do not nest")
        tx = MemoryOutboxTransaction()
        token = self._tx.set(tx)
        try:
            yield tx
        finally:
            self._tx.reset(token)
        for record in tx.staged:
            self._rows.setdefault(record.request.id, record)

    def current_tx(self) -> MemoryOutboxTransaction | None:
        """The transaction open in this context, for ``outbox_jobs_facade(current_tx=…)``."""
        return self._tx.get()

    async def stage(self, request: EnqueueRequest) -> None:
        record = OutboxRecord(request=request, staged_at=self._clock.now())
        tx = self._tx.get()
        if tx is not None:
            tx.staged.append(record)
        else:
            self._rows.setdefault(request.id, record)  # an id already staged keeps its row

    async def claim(self, *, claimant: str, limit: int, lease: float) -> list[OutboxRecord]:
        now = self._clock.now()
        free: list[OutboxRecord] = []
        for record in sorted(self._rows.values(), key=lambda r: (r.staged_at, r.request.id)):
            if len(free) == limit:
                break
            if record.claimed_by in (None, claimant) or self._leases[record.request.id] <= now:
                free.append(record)  # a claimant asking again re-takes its own
            else:
                break  # another relay's live batch: nothing staged after it may overtake it
        claimed: list[OutboxRecord] = []
        for record in free:
            held = replace(record, claimed_by=claimant, claimed_at=now)
            self._rows[record.request.id] = held
            self._leases[record.request.id] = now + timedelta(seconds=lease)
            claimed.append(held)
        return claimed

    def _held(self, ids: Sequence[str], claimant: str) -> list[str]:
        return [
            row_id
            for row_id in ids
            if (record := self._rows.get(row_id)) is not None and record.claimed_by == claimant
        ]

    async def release(self, ids: Sequence[str], *, claimant: str) -> int:
        held = self._held(ids, claimant)
        for row_id in held:
            self._rows[row_id] = replace(self._rows[row_id], claimed_by=None, claimed_at=None)
            del self._leases[row_id]
        return len(held)

    async def mark_published(self, ids: Sequence[str], *, claimant: str) -> int:
        held = self._held(ids, claimant)
        for row_id in held:
            del self._rows[row_id]
            del self._leases[row_id]
        return len(held)

    def retained(self) -> list[OutboxRecord]:
        """Rows staged and not yet published, in staged order."""
        return sorted(self._rows.values(), key=lambda r: (r.staged_at, r.request.id))


def memory_outbox_store(*, clock: Clock = SYSTEM_CLOCK) -> MemoryOutboxStore:
    return MemoryOutboxStore(clock)
