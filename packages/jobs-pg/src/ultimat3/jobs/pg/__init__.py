"""ultimat3-jobs on PostgreSQL: the default driver, its operator surface, fleet leases, the
backfill ledger and the LISTEN/NOTIFY wake.

    from ultimat3.jobs.core import set_job_driver
    from ultimat3.jobs.pg import install, postgres_job_driver

    await install(DATABASE_URL)                  # or: ujobs migrate --database-url URL
    set_job_driver(postgres_job_driver(DATABASE_URL))

Every statement the driver runs is a named constant in a ``sql_*`` module, readable and runnable
by an operator; ``SQL_JOBS_TABLE`` is the whole schema.
"""

from .backfills import PostgresBackfillLedger
from .batching import Coalescer
from .driver import PostgresJobDriver, postgres_job_driver
from .executor import PgExecutor, PgTarget, pg_executor
from .install import install, truncate_tables
from .introspect import PostgresIntrospection
from .leases import PostgresLeaseStore
from .sql_enqueue import WAKE_CHANNEL
from .sql_schema import SQL_JOBS_TABLE
from .wake import PgQueueWake, start_queue_wake

__all__ = [
    "SQL_JOBS_TABLE",
    "WAKE_CHANNEL",
    "Coalescer",
    "PgExecutor",
    "PgQueueWake",
    "PgTarget",
    "PostgresBackfillLedger",
    "PostgresIntrospection",
    "PostgresJobDriver",
    "PostgresLeaseStore",
    "install",
    "pg_executor",
    "postgres_job_driver",
    "start_queue_wake",
    "truncate_tables",
]
