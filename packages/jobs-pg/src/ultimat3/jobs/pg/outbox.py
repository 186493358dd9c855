"""The transactional outbox on Postgres (``OutboxStore`` over ``x_outbox``).

``stage()`` runs on the CALLER's connection — the one ``jobs_transaction(conn)`` made ambient, or
whatever ``tx_executor`` answers — so the staged job commits or rolls back with the business rows
of that transaction. Everything else (the relay's claim, release, mark-published) runs on the
store's own ``executor``. Each statement is in ``sql_outbox.py`` with what it guarantees.

Wiring (see OUTBOX.md)::

    store = postgres_outbox_store(executor=driver.executor, clock=driver.clock)
    set_jobs_facade(outbox_jobs_facade(store=store, driver=driver, current_tx=current_tx))
    relay = outbox_relay(store=store, driver=driver)
    relay.start()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from psycopg import AsyncConnection, AsyncCursor
from psycopg.pq import TransactionStatus

from ultimat3.jobs.core.clock import SYSTEM_CLOCK, Clock
from ultimat3.jobs.core.durations import Duration, parse_duration
from ultimat3.jobs.core.errors import InvariantError, OutboxNoTxError
from ultimat3.jobs.core.model import EnqueueRequest, OutboxRecord

from .executor import SCHEMA_MISSING, PgTarget, pg_executor, schema_missing
from .rows import request_params, utc, utc_or_none
from .sql_outbox import (
    SQL_OUTBOX_CLAIM,
    SQL_OUTBOX_CLAIM_TURN,
    SQL_OUTBOX_MARK_PUBLISHED,
    SQL_OUTBOX_PURGE,
    SQL_OUTBOX_RELEASE,
    SQL_OUTBOX_RETAINED,
    SQL_OUTBOX_STAGE,
)
from .transaction import current_tx

__all__ = ["PostgresOutboxStore", "TxExecutor", "postgres_outbox_store", "stage_params"]

TxExecutor = Callable[[], "AsyncConnection[Any] | None"]
"""Answers the caller's open transaction — its psycopg connection — or None outside one."""


class PostgresOutboxStore:
    """Staged enqueues in ``x_outbox``. Build it with ``postgres_outbox_store()``."""

    def __init__(self, *, executor: PgTarget, tx_executor: TxExecutor, clock: Clock) -> None:
        self._executor = pg_executor(executor)
        self._owns_executor = isinstance(executor, str)
        self._tx_executor = tx_executor
        self._clock = clock

    def __repr__(self) -> str:
        return f"PostgresOutboxStore({self._executor!r})"

    async def stage(self, request: EnqueueRequest) -> None:
        """Stage ``request`` in the caller's open transaction, and nowhere else.

        With no transaction (``tx_executor`` answers None, or a connection with none open) it is
        ``X_OUTBOX_NO_TX``, never a statement of its own on the pool: a facade whose
        ``current_tx`` saw a transaction the store's ``tx_executor`` cannot would otherwise
        publish a job whose transaction rolled back.
        """
        conn = self._tx_executor()
        if conn is None or (
            conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
        ):
            where = "no ambient connection" if conn is None else "the ambient connection"
            raise OutboxNoTxError(
                f"{request.name}: {where} has no open transaction, so the staged job would not "
                "commit with the caller's rows; enqueue inside `async with "
                "jobs_transaction(conn):`",
                meta={"job": request.name},
            )
        # A cursor of psycopg's own: the caller's connection may build raw ($1) cursors.
        async with AsyncCursor(conn) as cursor:
            try:
                await cursor.execute(SQL_OUTBOX_STAGE, stage_params(request, self._clock))
            except SCHEMA_MISSING as exc:
                raise schema_missing(exc) from exc

    async def claim(self, *, claimant: str, limit: int, lease: float) -> list[OutboxRecord]:
        now = self._clock.now()
        params = {
            "claimant": claimant,
            "now": now,
            "lapsed_before": now - timedelta(seconds=lease),
            "limit": limit,
        }
        rows = await self._executor.run(
            [(SQL_OUTBOX_CLAIM_TURN, None), (SQL_OUTBOX_CLAIM, params)],
            idempotent=True,  # a repeat by the same claimant takes the same rows again
        )
        return [_record(row) for row in rows]

    async def release(self, ids: Sequence[str], *, claimant: str) -> int:
        rows = await self._executor.fetch(
            SQL_OUTBOX_RELEASE,
            {"ids": list(ids), "claimant": claimant},
            idempotent=True,  # a repeat finds the rows handed back and moves nothing
        )
        return len(rows)

    async def mark_published(self, ids: Sequence[str], *, claimant: str) -> int:
        rows = await self._executor.fetch(
            SQL_OUTBOX_MARK_PUBLISHED,
            {"ids": list(ids), "claimant": claimant, "now": self._clock.now()},
            idempotent=True,  # a repeat finds the rows published and moves nothing
        )
        return len(rows)

    async def retained(self, *, limit: int = 1000) -> list[OutboxRecord]:
        """Rows staged and not yet published, in the order a relay takes them."""
        rows = await self._executor.fetch(SQL_OUTBOX_RETAINED, {"limit": limit}, idempotent=True)
        return [_record(row) for row in rows]

    async def purge_published(self, *, older_than: Duration) -> int:
        """Delete rows published more than ``older_than`` ago (the audit trail's retention);
        answers the rows removed. Unpublished rows are never touched."""
        age = parse_duration(older_than, field="older_than")
        if age < 0:  # "published before a moment still to come" is every published row
            raise InvariantError(
                f"older_than must not be negative, got {older_than!r}",
                meta={"field": "older_than"},
            )
        before = self._clock.now() - timedelta(seconds=age)
        rows = await self._executor.fetch(SQL_OUTBOX_PURGE, {"before": before})
        return int(rows[0][0])

    async def close(self) -> None:
        """Close the pool this store opened from a URL; a pool or executor handed in is left
        open."""
        if self._owns_executor:
            await self._executor.close()


def postgres_outbox_store(
    *,
    executor: PgTarget,
    tx_executor: TxExecutor | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> PostgresOutboxStore:
    """An outbox store on Postgres.

    ``executor`` runs the relay's statements: the driver's ``executor``, a psycopg pool, or a URL
    (the store then opens a pool of its own; ``close()`` it). ``tx_executor`` answers the
    caller's open transaction — by default ``current_tx``, the connection of the enclosing
    ``jobs_transaction(conn)`` block; pass your own to join transactions another layer opened.
    ``clock`` stamps ``staged_at`` and decides claim leases: give it the driver's.
    """
    return PostgresOutboxStore(
        executor=executor, tx_executor=tx_executor or current_tx, clock=clock
    )


def stage_params(request: EnqueueRequest, clock: Clock) -> dict[str, Any]:
    """What SQL_OUTBOX_STAGE takes to stage ``request`` now."""
    return {**request_params(request), "staged_at": clock.now()}


def _record(row: Sequence[Any]) -> OutboxRecord:
    """A row of SQL_OUTBOX_CLAIM / SQL_OUTBOX_RETAINED (columns in the statements' order)."""
    (
        job_id,
        run_id,
        name,
        queue,
        input,
        idempotency_key,
        tenant_id,
        max_attempts,
        run_at,
        enqueued_by,
        traceparent,
        staged_at,
        claimed_by,
        claimed_at,
    ) = row
    request = EnqueueRequest(
        id=job_id,
        run_id=run_id,
        name=name,
        queue=queue,
        input=input,
        idempotency_key=idempotency_key,
        tenant_id=tenant_id,
        max_attempts=max_attempts,
        run_at=utc(run_at),
        enqueued_by=enqueued_by,
        traceparent=traceparent,
    )
    return OutboxRecord(
        request=request,
        staged_at=utc(staged_at),
        claimed_by=claimed_by,
        claimed_at=utc_or_none(claimed_at),
    )
