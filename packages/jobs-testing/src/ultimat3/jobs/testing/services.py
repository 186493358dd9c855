"""Finding a Postgres and a Redis for tests.

A URL set in ``DATABASE_URL`` / ``REDIS_URL`` is the only place looked: when it does not answer,
the tests that need the service are skipped with a reason naming it, and no other server is tried
(a mistyped CI URL must not run the tests against whatever listens on the default port).
Unset, in order: a server on the default local port; a testcontainers container when a Docker
engine answers; a server started from local binaries in a temp directory. When none of those
works the tests that need the service are skipped with a message naming everything tried.
A server this process started is stopped by ``Found.stop()`` (the plugin calls it at the end of
the session) and, failing that, at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = [
    "DEFAULT_POSTGRES_URL",
    "DEFAULT_REDIS_URL",
    "Found",
    "docker_engine",
    "find_postgres",
    "find_redis",
    "postgres_binaries",
    "redis_server_binary",
    "scratch_database",
    "start_local_postgres",
    "start_local_redis",
]

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DOCKER_SOCKETS = ("/var/run/docker.sock", "~/.docker/run/docker.sock")
POSTGRES_IMAGE = "postgres:16-alpine"
REDIS_IMAGE = "redis:7-alpine"
_START_TIMEOUT_S = 30.0
_PROBE_TIMEOUT_S = 1.0


@dataclass
class Found:
    """A service URL, or why there is none (every place looked, and what each answered)."""

    url: str | None
    tried: list[str] = field(default_factory=list)
    stop: Callable[[], None] | None = None
    """Tears down the server this process started for the URL; None when it was already
    running."""
    restart: Callable[[], None] | None = None
    """Restarts the server this process started from local binaries (a fast shutdown, then the
    same data on the same port); None for any other."""
    crash: Callable[[], None] | None = None
    """Stops that server at once, as a crash would (an immediate shutdown: no checkpoint, the
    WAL not yet written lost), and starts it again through crash recovery; None for any other.
    The cluster runs with ``synchronous_commit=off``: a test of what a crash keeps sets it back
    on for its database (``alter database … set synchronous_commit = on``)."""

    @property
    def reason(self) -> str:
        return "; ".join(self.tried)

    def close(self) -> None:
        stop, self.stop = self.stop, None
        if stop is not None:
            stop()


class _UnavailableError(Exception):
    """One place to look came up empty; the message says what it answered."""


# -- probing --------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _postgres_answers(url: str) -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'ultimat3-jobs-testing[pg]')"
    try:
        with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
            conn.execute("select 1")
    except Exception as exc:
        return _first_line(exc)
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
        return _first_line(exc)
    return None


def docker_engine(environ: Mapping[str, str] | None = None) -> str | None:
    """Where a Docker engine answers (a socket path or ``host:port``), or None — decided by a
    one-second connect, never by waiting on a client library's retries."""
    environ = os.environ if environ is None else environ
    host = environ.get("DOCKER_HOST", "")
    if host.startswith("tcp://"):
        parsed = urlparse(host)
        address = (parsed.hostname or "127.0.0.1", parsed.port or 2375)
        return f"{address[0]}:{address[1]}" if _connects(socket.AF_INET, address) else None
    paths = [host.removeprefix("unix://")] if host.startswith("unix://") else list(DOCKER_SOCKETS)
    for path in (os.path.expanduser(p) for p in paths):
        if os.path.exists(path) and _connects(socket.AF_UNIX, path):
            return path
    return None


def _connects(family: int, address: Any) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(_PROBE_TIMEOUT_S)
        try:
            probe.connect(address)
        except OSError:
            return False
    return True


def _docker_missing(environ: Mapping[str, str]) -> str:
    host = environ.get("DOCKER_HOST")
    where = f"DOCKER_HOST={host}" if host else "DOCKER_HOST unset, " + ", ".join(DOCKER_SOCKETS)
    return f"testcontainers: no Docker engine answers ({where})"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# -- containers -----------------------------------------------------------------------------


def _postgres_container() -> Found:
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError as exc:
        raise _UnavailableError("testcontainers is not installed ([containers] extra)") from exc
    container = PostgresContainer(
        POSTGRES_IMAGE, username="postgres", password="postgres", dbname="postgres", driver=None
    )
    try:
        container.start()
    except Exception as exc:
        raise _UnavailableError(f"testcontainers ({POSTGRES_IMAGE}): {_first_line(exc)}") from exc
    return Found(str(container.get_connection_url()), stop=_once(container.stop))


def _redis_container() -> Found:
    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError as exc:
        raise _UnavailableError("testcontainers is not installed ([containers] extra)") from exc
    container = RedisContainer(REDIS_IMAGE)
    try:
        container.start()
    except Exception as exc:
        raise _UnavailableError(f"testcontainers ({REDIS_IMAGE}): {_first_line(exc)}") from exc
    host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
    return Found(f"redis://{host}:{port}/0", stop=_once(container.stop))


def _once(stop: Callable[[], object]) -> Callable[[], None]:
    """``stop`` run at most once, now or at interpreter exit, whichever comes first."""
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            atexit.unregister(run)
            with contextlib.suppress(Exception):
                stop()

    atexit.register(run)
    return run


# -- local binaries -------------------------------------------------------------------------


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path))


def _postgres_bindirs() -> Iterator[tuple[str, str]]:
    """(where it came from, directory) for every place Postgres server binaries may live."""
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            bindir = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=5, check=True
            ).stdout.strip()
            yield "pg_config --bindir", bindir
    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        yield "/usr/lib/postgresql/*/bin", bindir
    initdb = shutil.which("initdb")
    if initdb is not None:
        yield "PATH", os.path.dirname(initdb)


def postgres_binaries() -> tuple[str, str] | None:
    """``(initdb, pg_ctl)`` of the first directory holding both, or None."""
    for _, bindir in _postgres_bindirs():
        initdb, pg_ctl = os.path.join(bindir, "initdb"), os.path.join(bindir, "pg_ctl")
        if os.access(initdb, os.X_OK) and os.access(pg_ctl, os.X_OK):
            return initdb, pg_ctl
    return None


def _server_user() -> str | None:
    """The account a server runs as: ours, unless we are root (Postgres refuses root), then
    the ``postgres`` account when one exists."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise _UnavailableError(
            "local binaries: running as root and no 'postgres' account to start the server as"
        ) from None
    return "postgres"


def _run(command: Sequence[str], user: str | None, what: str) -> None:
    try:
        subprocess.run(command, user=user, capture_output=True, text=True, check=True, timeout=120)
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
        raise _UnavailableError(f"local binaries: {what} failed: {' | '.join(tail)}") from exc
    except (OSError, subprocess.SubprocessError) as exc:
        raise _UnavailableError(f"local binaries: {what} failed: {_first_line(exc)}") from exc


def start_local_postgres() -> Found:
    """A throwaway cluster from ``initdb``/``pg_ctl`` in a temp dir, on a free local port,
    trusting local connections as ``postgres``; ``stop()`` removes it."""
    binaries = postgres_binaries()
    if binaries is None:
        looked = ", ".join(bindir for _, bindir in _postgres_bindirs()) or "none found"
        raise _UnavailableError(
            "local binaries: no initdb beside pg_ctl in pg_config --bindir, "
            f"/usr/lib/postgresql/*/bin or on PATH (directories: {looked})"
        )
    initdb, pg_ctl = binaries
    user = _server_user()
    home = Path(tempfile.mkdtemp(prefix="ujobs-pg-"))
    if user is not None:
        shutil.chown(home, user=user)
    data, port = home / "data", _free_port()
    options = (
        f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={home} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    )

    def pg_ctl_run(action: str, *flags: str) -> None:
        log = str(home / "log")
        _run(
            [pg_ctl, "-D", str(data), "-o", options, "-l", log, *flags, action],
            user,
            f"pg_ctl {action}",
        )

    def stop() -> None:
        with contextlib.suppress(Exception):
            subprocess.run(
                [pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
                user=user,
                capture_output=True,
                timeout=30,
            )
        shutil.rmtree(home, ignore_errors=True)

    try:
        _run(
            [initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            user,
            "initdb",
        )
        pg_ctl_run("start", "-w", "-t", "30")
    except _UnavailableError:
        stop()
        raise
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    failure = _postgres_answers(url)
    if failure is not None:
        stop()
        raise _UnavailableError(f"local binaries: the started server does not answer: {failure}")
    return Found(
        url,
        stop=_once(stop),
        restart=lambda: pg_ctl_run("restart", "-m", "fast", "-w", "-t", "30"),
        crash=lambda: pg_ctl_run("restart", "-m", "immediate", "-w", "-t", "30"),
    )


def redis_server_binary() -> str | None:
    found = shutil.which("redis-server")
    if found is not None:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/local/bin/redis-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def start_local_redis() -> Found:
    """A ``redis-server`` without persistence on a free local port, in a temp dir."""
    binary = redis_server_binary()
    if binary is None:
        raise _UnavailableError(
            "local binaries: no redis-server (looked on PATH, /usr/bin, /usr/local/bin)"
        )
    home = Path(tempfile.mkdtemp(prefix="ujobs-redis-"))
    port = _free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    command += ["no", "--dir", str(home), "--daemonize", "no", "--logfile", str(home / "log")]
    try:
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as exc:
        shutil.rmtree(home, ignore_errors=True)
        raise _UnavailableError(f"local binaries: redis-server failed: {_first_line(exc)}") from exc

    def stop() -> None:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=10)
        if server.poll() is None:
            server.kill()
            server.wait()
        shutil.rmtree(home, ignore_errors=True)

    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + _START_TIMEOUT_S
    while (failure := _redis_answers(url)) is not None:
        if server.poll() is not None or time.monotonic() > deadline:
            stop()
            raise _UnavailableError(
                f"local binaries: the started redis-server does not answer: {failure}"
            )
        time.sleep(0.05)
    return Found(url, stop=_once(stop))


# -- the search -----------------------------------------------------------------------------


def _find(
    *,
    env_name: str,
    default_url: str,
    answers: Callable[[str], str | None],
    container: Callable[[], Found],
    binaries: Callable[[], Found],
    environ: Mapping[str, str] | None,
    use_containers: bool,
    use_binaries: bool,
) -> Found:
    environ = os.environ if environ is None else environ
    named = environ.get(env_name)
    if named:
        failure = answers(named)
        if failure is None:
            return Found(named)
        return Found(
            None,
            [
                f"{env_name} is set to {named} and it does not answer ({failure}); start that "
                f"server or correct {env_name} (unset, the tests look for a server themselves)"
            ],
        )
    tried = [f"{env_name} unset"]
    failure = answers(default_url)
    if failure is None:
        return Found(default_url, tried)
    tried.append(f"the default local port ({default_url}): {failure}")
    starters: list[Callable[[], Found]] = []
    if use_containers:
        if docker_engine(environ) is None:
            tried.append(_docker_missing(environ))
        else:
            starters.append(container)
    if use_binaries:
        starters.append(binaries)
    for start in starters:
        try:
            started = start()
        except _UnavailableError as exc:
            tried.append(str(exc))
            continue
        started.tried = tried
        return started
    return Found(None, tried)


def find_postgres(
    environ: Mapping[str, str] | None = None,
    *,
    default_url: str = DEFAULT_POSTGRES_URL,
    containers: bool = True,
    binaries: bool = True,
) -> Found:
    """A Postgres the tests may create databases on, or why there is none."""
    return _find(
        env_name="DATABASE_URL",
        default_url=default_url,
        answers=_postgres_answers,
        container=_postgres_container,
        binaries=start_local_postgres,
        environ=environ,
        use_containers=containers,
        use_binaries=binaries,
    )


def find_redis(
    environ: Mapping[str, str] | None = None,
    *,
    default_url: str = DEFAULT_REDIS_URL,
    containers: bool = True,
    binaries: bool = True,
) -> Found:
    """A Redis the tests may write prefixed keys to, or why there is none."""
    return _find(
        env_name="REDIS_URL",
        default_url=default_url,
        answers=_redis_answers,
        container=_redis_container,
        binaries=start_local_redis,
        environ=environ,
        use_containers=containers,
        use_binaries=binaries,
    )


@contextlib.contextmanager
def scratch_database(server_url: str, *, setup: str | None = None) -> Iterator[str]:
    """A new, empty database on ``server_url`` (with ``setup`` run in it, e.g. a schema) for the
    block; answers its URL and drops it, connections and all, when the block ends."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"ujobs_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = make_conninfo("", **{**conninfo_to_dict(server_url), "dbname": name})
    try:
        if setup is not None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(setup)
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')
