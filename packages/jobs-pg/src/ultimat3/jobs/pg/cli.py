"""What this package adds to the ``ujobs`` command line: Postgres URLs, and ``ujobs migrate``.

Registered through entry points (see pyproject.toml): ``driver_from_url`` under
``ultimat3.jobs.drivers`` for the ``postgres://`` and ``postgresql://`` schemes, and
``register_commands`` under ``ultimat3.jobs.commands``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any
from urllib.parse import urlsplit

from ultimat3.jobs.core.errors import DriverUnavailableError
from ultimat3.jobs.core.protocol import JobDriver

from .driver import postgres_job_driver
from .executor import connection_refused
from .install import install

__all__ = ["driver_from_url", "register_commands"]

_SCHEMES = ("postgres", "postgresql")
"""The URL schemes this package registers under ``ultimat3.jobs.drivers`` (pyproject.toml)."""


async def driver_from_url(url: str) -> JobDriver:
    """The Postgres driver for ``url``, once one connection to it succeeded (it opens its pool
    on first use; close it when done). The one attempt makes a wrong URL or a server that is
    down fail at once and name the cause, where the pool would retry for its open timeout."""
    await _reachable(url)
    return postgres_job_driver(url)


async def _reachable(url: str) -> None:
    refused = await connection_refused(url)
    if refused is not None:
        raise DriverUnavailableError(
            f"could not connect to Postgres: {refused}; check the URL and that the server is up"
        )


def register_commands(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Add ``migrate`` to ``ujobs``: ``ujobs migrate --database-url URL`` (or ``--url``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "migrate",
        parents=[common],
        help="create the Postgres tables of ultimat3-jobs (idempotent)",
        description=(
            "Apply SQL_JOBS_TABLE: every table and index the Postgres driver, its outbox, event "
            "bus, scheduler state and backfill ledger use. Safe to run on every deploy."
        ),
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="the database to migrate (default: ujobs --url, then $DATABASE_URL)",
    )
    parser.set_defaults(handler=_migrate)


async def _migrate(args: argparse.Namespace) -> int:
    url = args.database_url or getattr(args, "url", None) or os.environ.get("DATABASE_URL")
    if not url:
        raise DriverUnavailableError("pass --database-url URL (or --url), or set DATABASE_URL")
    scheme = urlsplit(url).scheme.split("+", 1)[0] if "://" in url else None
    if scheme is not None and scheme not in _SCHEMES:
        # (a key=value conninfo, "host=… dbname=…", has no scheme and is psycopg's to read)
        raise DriverUnavailableError(
            f"{scheme}:// is not a Postgres URL; the tables to create are Postgres's "
            "(postgresql://user@host/db)",
            meta={"scheme": scheme},
        )
    await _reachable(url)
    await install(url)
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps({"migrated": True}) + "\n")
    else:
        sys.stdout.write("ujobs migrate: the ultimat3-jobs tables are in place\n")
    return 0
