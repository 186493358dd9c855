"""The Postgres outbox store as the conformance suite needs it."""

from __future__ import annotations

from ultimat3.jobs.core import EnqueueRequest
from ultimat3.jobs.core.clock import Clock
from ultimat3.jobs.pg import PostgresOutboxStore, current_tx, jobs_transaction
from ultimat3.jobs.pg.executor import PgExecutor

__all__ = ["StagingInItsOwnTransaction"]


class StagingInItsOwnTransaction(PostgresOutboxStore):
    """The suite stages outside any transaction, which the store refuses (it stages only in the
    caller's): here each stage is the caller's transaction of one statement."""

    def __init__(self, executor: PgExecutor, clock: Clock) -> None:
        super().__init__(executor=executor, tx_executor=current_tx, clock=clock)
        self._connections = executor

    async def stage(self, request: EnqueueRequest) -> None:
        async with self._connections.connection() as conn, jobs_transaction(conn):
            await super().stage(request)
