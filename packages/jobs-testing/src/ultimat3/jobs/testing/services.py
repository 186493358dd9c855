"""Finding a Postgres and a Redis for tests.

In order: the URL in ``DATABASE_URL`` / ``REDIS_URL``; a server on the default local port; a
testcontainers container when a Docker engine answers; a server started from local binaries in a
temp directory. When none of those works the tests that need the service are skipped with a
message naming everything that was tried.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["Found", "find_postgres", "find_redis"]

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass
class Found:
    """A service URL, or why there is none (every place looked, and what each answered)."""

    url: str | None
    tried: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "; ".join(self.tried)


def _postgres_answers(url: str) -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'ultimat3-jobs-testing[pg]')"
    try:
        with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
            conn.execute("select 1")
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    return None


def _redis_answers(url: str) -> str | None:
    try:
        import redis
    except ImportError:
        return "redis-py is not installed (pip install 'ultimat3-jobs-testing[redis]')"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def find_postgres() -> Found:
    found = Found(None)
    env = os.environ.get("DATABASE_URL")
    candidates = [("DATABASE_URL", env)] if env else []
    candidates.append(("the default local port", DEFAULT_POSTGRES_URL))
    for where, url in candidates:
        assert url is not None
        failure = _postgres_answers(url)
        if failure is None:
            found.url = url
            return found
        found.tried.append(f"{where} ({url}): {failure}")
    return found


def find_redis() -> Found:
    found = Found(None)
    env = os.environ.get("REDIS_URL")
    candidates = [("REDIS_URL", env)] if env else []
    candidates.append(("the default local port", DEFAULT_REDIS_URL))
    for where, url in candidates:
        assert url is not None
        failure = _redis_answers(url)
        if failure is None:
            found.url = url
            return found
        found.tried.append(f"{where} ({url}): {failure}")
    return found
