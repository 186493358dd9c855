"""The driver on a live Redis Cluster, started here from the local binaries (3 primaries on free
ports): scripts load on every primary, each call reaches the node owning the namespace's slot,
and the wake hears announcements through any one node."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis as syncredis
import redis.asyncio as aioredis
from redis.asyncio import RedisCluster

from ultimat3.jobs.core import (
    AckOptions,
    EnqueueRequest,
    FrozenClock,
    JobFilter,
    JobState,
    StepRecord,
)
from ultimat3.jobs.redis import RedisJobDriver, redis_job_driver, start_queue_wake
from ultimat3.jobs.redis.scripts import script

RequestBuilder = Callable[..., EnqueueRequest]

pytestmark = pytest.mark.slow


@pytest.fixture
async def cluster_driver(
    redis_cluster: list[str], clock: FrozenClock
) -> AsyncIterator[RedisJobDriver]:
    """A driver on the cluster, on a namespace of the test's own, emptied after."""
    client = RedisCluster.from_url(redis_cluster[0], decode_responses=True)
    driver = redis_job_driver(client, prefix=f"cluster-{uuid.uuid4().hex[:12]}", clock=clock)
    yield driver
    await driver.clear()
    await driver.close()
    await client.aclose()


async def test_a_job_runs_its_whole_course_on_a_cluster(
    cluster_driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    driver = cluster_driver
    queued = await driver.enqueue(new_request())
    (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert await driver.save_step(job.id, job.claim, job.run_id, StepRecord("s", 0, {"ok": 1}))
    assert await driver.ack(job.id, AckOptions(job.claim.worker_id, job.claim.claim))
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.state is JobState.DONE
    assert [step.name for step in detail.steps] == ["s"]
    page = await driver.introspect.list(JobFilter(state=JobState.DONE))
    assert [row.id for row in page.rows] == [queued.id]


async def test_a_cluster_that_lost_its_scripts_gets_them_again(
    cluster_driver: RedisJobDriver, redis_cluster: list[str], new_request: RequestBuilder
) -> None:
    await cluster_driver.stats()  # every script loaded
    for url in redis_cluster:
        node = syncredis.Redis.from_url(url)
        try:
            node.script_flush()
        finally:
            node.close()
    assert not (await cluster_driver.enqueue(new_request())).deduped


async def test_the_wake_hears_a_cluster_through_any_one_node(
    cluster_driver: RedisJobDriver, redis_cluster: list[str], new_request: RequestBuilder
) -> None:
    subscriber = aioredis.Redis.from_url(redis_cluster[-1], decode_responses=True)
    wake = start_queue_wake(cluster_driver, subscriber=subscriber)
    try:
        assert await wake.wait_live(10), "the probe never came back"
        heard: asyncio.Queue[str] = asyncio.Queue()
        wake.subscribe(heard.put_nowait)
        await cluster_driver.enqueue(new_request(queue="emails"))
        assert await asyncio.wait_for(heard.get(), 5) == "emails"
    finally:
        await wake.close()
        await subscriber.aclose()


async def test_a_script_that_must_not_run_twice_is_sent_to_its_node_by_name(
    cluster_driver: RedisJobDriver, new_request: RequestBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster client sends a command again after a broken connection unless it was given the
    node; an enqueue must reach its caller as the error instead, while a read may be repeated."""
    client = cluster_driver.client
    await cluster_driver.stats()
    targets: dict[str, object] = {}
    sent = client.execute_command

    async def spy(*args: Any, **options: Any) -> Any:
        targets[args[1]] = options.get("target_nodes")
        return await sent(*args, **options)

    monkeypatch.setattr(client, "execute_command", spy)
    await cluster_driver.enqueue(new_request())
    await cluster_driver.stats()
    owner = client.get_node_from_key(cluster_driver.namespace.base)
    assert targets == {script("enqueue").sha: owner, script("stats").sha: None}
