"""What this package adds to the ``ujobs`` command line: Postgres URLs, and ``ujobs migrate``.

Registered through entry points (see pyproject.toml): ``driver_from_url`` under
``ultimat3.jobs.drivers`` for the ``postgres://`` and ``postgresql://`` schemes, and
``register_commands`` under ``ultimat3.jobs.commands``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ultimat3.jobs.core.protocol import JobDriver

from .driver import postgres_job_driver
from .install import install

__all__ = ["driver_from_url", "register_commands"]


async def driver_from_url(url: str) -> JobDriver:
    """The Postgres driver for ``url`` (it opens its pool on first use; close it when done)."""
    return postgres_job_driver(url)


def register_commands(subparsers: Any) -> None:
    """Add ``migrate`` to ``ujobs``: ``ujobs migrate --database-url URL``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "migrate",
        help="create the Postgres tables of ultimat3-jobs (idempotent)",
        description=(
            "Apply SQL_JOBS_TABLE: every table and index the Postgres driver, its outbox, event "
            "bus, scheduler state and backfill ledger use. Safe to run on every deploy."
        ),
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="the database to migrate (default: $DATABASE_URL)",
    )
    parser.set_defaults(handler=_migrate)


async def _migrate(args: argparse.Namespace) -> int:
    url = args.database_url or os.environ.get("DATABASE_URL")
    if not url:
        sys.stderr.write("ujobs migrate: pass --database-url URL or set DATABASE_URL\n")
        return 2
    await install(url)
    sys.stdout.write("ujobs migrate: the ultimat3-jobs tables are in place\n")
    return 0
