"""Finding Postgres and Redis for tests: the environment, the default port, a container, local
binaries, else a skip naming everything tried."""

from __future__ import annotations

import socket

import psycopg
import pytest
import redis

from ultimat3.jobs.testing.services import (
    DEFAULT_REDIS_URL,
    docker_engine,
    find_postgres,
    find_redis,
    postgres_binaries,
    redis_server_binary,
)

pytest_plugins = ["pytester"]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _nowhere_postgres() -> str:
    return f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres"


def _nowhere_redis() -> str:
    return f"redis://127.0.0.1:{_closed_port()}/0"


def test_the_environment_url_comes_first(postgres_url: str) -> None:
    found = find_postgres({"DATABASE_URL": postgres_url}, default_url=_nowhere_postgres())
    assert found.url == postgres_url
    assert found.stop is None


def test_the_default_port_answers_when_the_environment_names_nothing() -> None:
    found = find_redis({}, containers=False, binaries=False)
    if found.url is None:
        pytest.skip(f"no Redis on the default port: {found.reason}")
    assert found.url == DEFAULT_REDIS_URL
    assert found.tried == ["REDIS_URL unset"]


def test_a_dead_environment_url_is_not_replaced_by_another_server(redis_url: str) -> None:
    dead = _nowhere_redis()
    environ = {"REDIS_URL": dead, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    found = find_redis(environ, default_url=redis_url)
    assert found.url is None
    assert found.stop is None


def test_a_dead_environment_url_is_named_in_the_reason() -> None:
    dead = _nowhere_postgres()
    found = find_postgres({"DATABASE_URL": dead}, containers=False, binaries=False)
    assert found.reason.startswith(f"DATABASE_URL is set to {dead} and it does not answer")


def test_a_test_needing_a_dead_environment_url_is_skipped_naming_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _nowhere_redis()
    monkeypatch.setenv("REDIS_URL", dead)
    monkeypatch.delenv("UJOBS_REQUIRE_SERVICES", raising=False)
    pytester.makepyfile("def test_needs_redis(redis_url):\n    pass\n")
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-o", "asyncio_default_fixture_loop_scope=function", "-rs"
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*no Redis server found: REDIS_URL is set to {dead} and it*"])


def test_a_run_requiring_its_services_fails_a_test_whose_server_is_nowhere(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _nowhere_redis()
    monkeypatch.setenv("REDIS_URL", dead)
    monkeypatch.setenv("UJOBS_REQUIRE_SERVICES", "1")
    pytester.makepyfile("def test_needs_redis(redis_url):\n    pass\n")
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-o", "asyncio_default_fixture_loop_scope=function"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no Redis server found: REDIS_URL is set to*"])


def test_an_absent_docker_engine_is_found_absent_at_once() -> None:
    assert docker_engine({"DOCKER_HOST": f"tcp://127.0.0.1:{_closed_port()}"}) is None
    assert docker_engine({"DOCKER_HOST": "unix:///nonexistent/docker.sock"}) is None


def test_nothing_found_names_every_place_looked() -> None:
    environ = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    found = find_postgres(environ, default_url=_nowhere_postgres(), binaries=False)
    assert found.url is None
    assert "DATABASE_URL unset" in found.reason
    assert "the default local port (postgresql://postgres@127.0.0.1:" in found.reason
    assert "no Docker engine answers (DOCKER_HOST=unix:///nonexistent/docker.sock)" in (
        found.reason
    )


@pytest.mark.slow
def test_postgres_starts_from_local_binaries_and_stops() -> None:
    if postgres_binaries() is None:
        pytest.skip("no initdb/pg_ctl on this machine")
    environ = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    found = find_postgres(environ, default_url=_nowhere_postgres())
    assert found.url is not None, found.reason
    try:
        with psycopg.connect(found.url, autocommit=True) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        found.close()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(found.url, connect_timeout=2)


def test_redis_starts_from_local_binaries_and_stops() -> None:
    if redis_server_binary() is None:
        pytest.skip("no redis-server on this machine")
    environ = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    found = find_redis(environ, default_url=_nowhere_redis())
    assert found.url is not None, found.reason
    assert "no Docker engine answers" in found.reason
    try:
        assert redis.Redis.from_url(found.url).ping()
    finally:
        found.close()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(found.url, socket_connect_timeout=1).ping()


def test_pg_database_url_is_a_fresh_database(pg_database_url: str, postgres_url: str) -> None:
    with psycopg.connect(pg_database_url, autocommit=True) as conn:
        name = conn.execute("select current_database()").fetchone()
        tables = conn.execute(
            "select count(*) from information_schema.tables where table_schema = 'public'"
        ).fetchone()
    assert name is not None
    assert name[0].startswith("ujobs_test_")
    assert tables == (0,)


def test_redis_prefix_is_unused(redis_url: str, redis_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match=f"*{redis_prefix}*")) == []
    finally:
        client.close()
