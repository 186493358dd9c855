"""Fixtures for the Redis driver's own tests: a driver on a fresh key prefix and a frozen clock,
a builder of rows to enqueue, and servers of a test's own (a restartable one, a 3-node cluster)
started from the local ``redis-server`` on free ports, never touching the shared one."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis as syncredis
from redis.exceptions import RedisError
from support.markers import mark_folder

from ultimat3.jobs.core import EnqueueRequest, FrozenClock, new_id
from ultimat3.jobs.redis import RedisJobDriver, redis_job_driver
from ultimat3.jobs.testing.services import redis_server_binary


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
async def driver(
    redis_url: str, redis_prefix: str, clock: FrozenClock
) -> AsyncIterator[RedisJobDriver]:
    """A driver on a namespace no other test uses, on the frozen clock; emptied after."""
    built = redis_job_driver(url=redis_url, prefix=redis_prefix, clock=clock)
    yield built
    await built.clear()
    await built.close()


@pytest.fixture
def new_request(clock: FrozenClock) -> Callable[..., EnqueueRequest]:
    """``new_request(queue=, name=, key=, max_attempts=, delay=, input=)``: a row to enqueue,
    with fresh ids and key unless told, due ``delay`` seconds from the clock's now."""

    def build(
        *,
        queue: str = "q",
        name: str = "job",
        key: str | None = None,
        max_attempts: int = 3,
        delay: float = 0.0,
        input: Any = None,
    ) -> EnqueueRequest:
        return EnqueueRequest(
            id=new_id(),
            run_id=new_id(),
            name=name,
            queue=queue,
            input={"n": 1} if input is None else input,
            idempotency_key=key or f"key-{uuid.uuid4().hex}",
            tenant_id=None,
            max_attempts=max_attempts,
            run_at=clock.now() + timedelta(seconds=delay),
        )

    return build


# -- servers of a test's own -------------------------------------------------------------------

_CLUSTER_BUS_OFFSET = 10_000
"""A cluster node also listens on its port + 10000 (the cluster bus)."""
_START_TIMEOUT_S = 10.0


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port(*, with_bus: bool = False) -> int:
    """A free local port (and, for a cluster node, its bus port too)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if not with_bus:
            return port
        bus = port + _CLUSTER_BUS_OFFSET
        if bus < 65_536 and _bindable(bus):
            return port


class PrivateRedis:
    """A ``redis-server`` without persistence on a free local port, in ``home``."""

    def __init__(self, binary: str, home: Path, *options: str, cluster: bool = False) -> None:
        self.port = _free_port(with_bus=cluster)
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self._command = [binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        self._command += ["--save", "", "--appendonly", "no", "--dir", str(home)]
        self._command += ["--logfile", str(home / "log"), *options]
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def answers(self) -> bool:
        client = syncredis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=1)
        try:
            return bool(client.ping())
        except RedisError:
            return False
        finally:
            client.close()

    def start(self) -> None:
        self._process = subprocess.Popen(self._command)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self.answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = (self.home / "log").read_text() if (self.home / "log").exists() else ""
                raise RuntimeError(f"redis-server on port {self.port} did not start: {log[-500:]}")
            time.sleep(0.02)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        """Stop the server and start it again on the same port: without persistence it comes
        back empty, as after a crash."""
        self.stop()
        self.start()


def _binary() -> str:
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("needs a local redis-server binary (looked on PATH, /usr/bin, /usr/local/bin)")
    return binary


@pytest.fixture
def _private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(_binary(), tmp_path / "private-redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_redis_url(_private_redis: PrivateRedis) -> str:
    """A server only this test uses (no persistence), so it may be restarted."""
    return _private_redis.url


@pytest.fixture
def restart_private_redis(_private_redis: PrivateRedis) -> Callable[[], None]:
    """Stops ``private_redis_url``'s server and starts it again, empty, on the same port."""
    return _private_redis.restart


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """The URLs of a throwaway 3-node Redis Cluster (no replicas), every slot assigned, shared by
    a module's tests; skips with the reason when the local binaries cannot form one."""
    tmp_path = tmp_path_factory.mktemp("redis-cluster")
    binary, cli = _binary(), shutil.which("redis-cli")
    if cli is None:
        pytest.skip("forming a cluster needs redis-cli beside redis-server")
    options = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    nodes = [PrivateRedis(binary, tmp_path / f"node-{i}", *options, cluster=True) for i in range(3)]
    try:
        for node in nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        formed = subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if formed.returncode != 0:
            pytest.skip(f"redis-server could not form a cluster: {formed.stdout[-500:]}")
        if not _until_cluster_ok(nodes):
            pytest.skip("the cluster formed but never reported cluster_state:ok")
        yield [node.url for node in nodes]
    finally:
        for node in nodes:
            node.stop()


def _until_cluster_ok(nodes: list[PrivateRedis], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for node in nodes:
            client = syncredis.Redis(port=node.port, socket_timeout=1, decode_responses=True)
            try:
                states.append(client.cluster("INFO").get("cluster_state"))
            finally:
                client.close()
        if states == ["ok"] * len(nodes):
            return True
        time.sleep(0.1)
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of this folder needs a Redis server (some start their own of it), so
    ``-m "not redis"`` leaves them all out."""
    mark_folder(items, __file__, pytest.mark.redis)
