"""ultimat3-jobs on PostgreSQL: the default driver, its operator surface, fleet leases, the
backfill ledger, the LISTEN/NOTIFY wake, and the stores that share its database (the outbox, the
event bus, the scheduler's state and leader).

    from ultimat3.jobs.core import set_job_driver
    from ultimat3.jobs.pg import install, postgres_job_driver

    await install(DATABASE_URL)                  # or: ujobs migrate --database-url URL
    set_job_driver(postgres_job_driver(DATABASE_URL))

Every statement is a named constant in a ``sql_*`` module, readable and runnable by an operator;
``SQL_JOBS_TABLE`` is the whole schema.
"""

from .backfills import PostgresBackfillLedger
from .driver import PostgresJobDriver, postgres_job_driver
from .events import PostgresEventBus, postgres_event_bus
from .executor import PgExecutor, PgTarget, pg_executor
from .install import install, truncate_tables
from .introspect import PostgresIntrospection
from .leases import PostgresLeaseStore
from .outbox import PostgresOutboxStore, postgres_outbox_store
from .scheduler import (
    PostgresLeaseLeader,
    PostgresSchedulerState,
    postgres_lease_leader,
    postgres_scheduler_state,
)
from .sql_enqueue import WAKE_CHANNEL
from .sql_schema import SQL_JOBS_TABLE
from .transaction import current_tx, jobs_transaction
from .wake import PgQueueWake, start_queue_wake

__all__ = [
    "SQL_JOBS_TABLE",
    "WAKE_CHANNEL",
    "PgExecutor",
    "PgQueueWake",
    "PgTarget",
    "PostgresBackfillLedger",
    "PostgresEventBus",
    "PostgresIntrospection",
    "PostgresJobDriver",
    "PostgresLeaseLeader",
    "PostgresLeaseStore",
    "PostgresOutboxStore",
    "PostgresSchedulerState",
    "current_tx",
    "install",
    "jobs_transaction",
    "pg_executor",
    "postgres_event_bus",
    "postgres_job_driver",
    "postgres_lease_leader",
    "postgres_outbox_store",
    "postgres_scheduler_state",
    "start_queue_wake",
    "truncate_tables",
]
