"""pytest fixtures for Postgres and Redis: a fresh database or key prefix per test.

Registered as a pytest plugin by the ``ultimat3-jobs-testing`` distribution, so any project that
installs it can ask for ``postgres_url``/``pg_database_url`` and ``redis_url``/``redis_prefix``.
Each server is looked for once per session (see ``services``); one this session started is
stopped when the session ends. A test whose server is nowhere is skipped with the reason, unless
``UJOBS_REQUIRE_SERVICES=1``: then it fails with it (CI sets it, so a run cannot pass green with
every server test skipped).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import NoReturn

import pytest

from .services import Found, find_postgres, find_redis, scratch_database

__all__ = ["pg_database_url", "postgres_url", "redis_prefix", "redis_url"]


@pytest.fixture(scope="session")
def _postgres_found() -> Iterator[Found]:
    found = find_postgres()
    try:
        yield found
    finally:
        found.close()


@pytest.fixture(scope="session")
def _redis_found() -> Iterator[Found]:
    found = find_redis()
    try:
        yield found
    finally:
        found.close()


@pytest.fixture(scope="session")
def postgres_url(_postgres_found: Found) -> str:
    """A URL of a Postgres server the tests may create databases on."""
    if _postgres_found.url is None:
        _missing(f"no PostgreSQL server found: {_postgres_found.reason}")
    return _postgres_found.url


@pytest.fixture
def pg_database_url(postgres_url: str) -> Iterator[str]:
    """A fresh, empty database for one test, dropped after it."""
    with scratch_database(postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
def redis_url(_redis_found: Found) -> str:
    """A URL of a Redis server the tests may write prefixed keys to."""
    if _redis_found.url is None:
        _missing(f"no Redis server found: {_redis_found.reason}")
    return _redis_found.url


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix no other test uses; its keys are deleted after the test."""
    import redis

    prefix = f"ujobs-test-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(redis_url)
        try:
            keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pg: needs a PostgreSQL server")
    config.addinivalue_line("markers", "redis: needs a Redis server")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that asks for a server, however deep the fixture asking for it, so
    ``-m "not pg and not redis"`` selects exactly the tests that need neither."""
    for item in items:
        needs = set(getattr(item, "fixturenames", ()))
        if "postgres_url" in needs:
            item.add_marker(pytest.mark.pg)
        if "redis_url" in needs:
            item.add_marker(pytest.mark.redis)


REQUIRE_SERVICES = "UJOBS_REQUIRE_SERVICES"


def _missing(reason: str) -> NoReturn:
    """Skip the test for want of its server, or fail it when the run requires every server."""
    if os.environ.get(REQUIRE_SERVICES) == "1":
        pytest.fail(f"{reason} ({REQUIRE_SERVICES}=1)", pytrace=False)
    pytest.skip(reason)
