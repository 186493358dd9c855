"""Driver behaviour beyond the shared suite: batched settles, script reloads, construction."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis.exceptions

from ultimat3.jobs.core import (
    AckOptions,
    BulkFilter,
    BulkResult,
    EnqueueRequest,
    FrozenClock,
    JobFilter,
    JobState,
    NackOptions,
    StepRecord,
    memory_job_driver,
)
from ultimat3.jobs.core.constants import MAX_BULK_ROWS
from ultimat3.jobs.core.counters import bucket_start, rollup
from ultimat3.jobs.core.cursor import job_cursor
from ultimat3.jobs.core.errors import DriverUnavailableError, InvariantError
from ultimat3.jobs.core.model import CounterBucket
from ultimat3.jobs.redis import RedisJobDriver, redis_job_driver, scripts
from ultimat3.jobs.redis.cli import driver_from_url
from ultimat3.jobs.redis.codec import to_us
from ultimat3.jobs.redis.introspect import _BULK_CHUNK

RequestBuilder = Callable[..., EnqueueRequest]


def _count_scripts(driver: RedisJobDriver, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    calls: Counter[str] = Counter()
    namespace = driver.namespace
    original = namespace.call

    async def counted(name: str, *args: Any, **options: Any) -> Any:
        calls[name] += 1
        return await original(name, *args, **options)

    monkeypatch.setattr(namespace, "call", counted)
    return calls


async def test_concurrent_acks_travel_as_one_script_call_each_fenced(
    driver: RedisJobDriver, new_request: RequestBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    await driver.enqueue_many([new_request() for _ in range(50)])
    jobs = (await driver.claim(worker_id="w", slots={"q": 50}, visibility_timeout=30)).jobs
    calls = _count_scripts(driver, monkeypatch)
    stale = AckOptions("w", "not-this-claim")
    answers = await asyncio.gather(
        driver.ack(jobs[0].id, stale),
        *(driver.ack(j.id, AckOptions(j.claim.worker_id, j.claim.claim)) for j in jobs),
    )
    assert answers == [False] + [True] * 50
    assert calls == {"settle": 1}
    assert (await driver.stats())[0].done == 50


async def test_concurrent_heartbeats_travel_as_one_script_call(
    driver: RedisJobDriver, new_request: RequestBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    await driver.enqueue_many([new_request() for _ in range(20)])
    jobs = (await driver.claim(worker_id="w", slots={"q": 20}, visibility_timeout=30)).jobs
    calls = _count_scripts(driver, monkeypatch)
    answers = await asyncio.gather(*(driver.heartbeat(j.id, j.claim, 60) for j in jobs))
    assert answers == [True] * 20
    assert calls == {"heartbeat": 1}


async def test_a_server_that_lost_its_scripts_gets_them_again(
    driver: RedisJobDriver, new_request: RequestBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    await driver.stats()  # every script loaded
    held = scripts.script("enqueue")
    variant = f"{held.source}\n-- {new_request().id}"
    never_loaded = scripts.Script(
        held.name, variant, scripts.hashlib.sha1(variant.encode()).hexdigest()
    )
    monkeypatch.setitem(scripts._SCRIPTS, "enqueue", never_loaded)
    queued = await driver.enqueue(new_request())
    assert not queued.deduped
    assert await driver.client.script_exists(never_loaded.sha) == [True]


async def test_steps_stored_before_steps_carried_their_kind_come_back_kindless(
    driver: RedisJobDriver, new_request: RequestBuilder
) -> None:
    """A run in flight across the upgrade keeps the steps it stored in the older form, which any
    kind of step replays; an output that starts like a kind is still all output."""
    await driver.enqueue(new_request())
    (held,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    older_form = {"charge": '0 1 "run charged"', "paid": '1 0 {"since":"t0"}', "n": "2 1 7"}
    await driver.client.hset(driver.namespace.key(f"steps:{held.run_id}"), mapping=older_form)
    assert await driver.nack(held.id, NackOptions(held.claim.worker_id, held.claim.claim))
    (again,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert again.steps == {
        "charge": StepRecord("charge", 0, "run charged"),
        "paid": StepRecord("paid", 1, {"since": "t0"}, completed=False),
        "n": StepRecord("n", 2, 7),
    }


async def test_driver_from_url_answers_a_driver_on_that_server(redis_url: str) -> None:
    driver = await driver_from_url(redis_url)
    try:
        assert isinstance(driver, RedisJobDriver)
        assert driver.prefix == "ujobs"
    finally:
        await driver.close()


async def test_driver_from_url_reads_the_namespace_from_the_query(redis_url: str) -> None:
    driver = await driver_from_url(f"{redis_url}?prefix=shop")
    try:
        assert isinstance(driver, RedisJobDriver)
        assert driver.prefix == "shop"
    finally:
        await driver.close()


async def test_driver_from_url_says_so_when_the_server_does_not_answer() -> None:
    with pytest.raises(DriverUnavailableError, match="did not answer"):
        await driver_from_url("redis://127.0.0.1:1/0")


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:notaport/0", "redis://127.0.0.1:6379/0?socket_timeout=abc"]
)
async def test_driver_from_url_says_so_when_redis_py_cannot_read_the_url(url: str) -> None:
    with pytest.raises(DriverUnavailableError, match="not a Redis URL redis-py can read"):
        await driver_from_url(url)


@pytest.mark.parametrize(
    "operation",
    [
        lambda d, new: d.enqueue(new()),
        lambda d, new: d.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30),
        lambda d, new: d.ack("some-id", AckOptions("w", "c")),
        lambda d, new: d.introspect.list(JobFilter()),
        lambda d, new: d.leases.holders("key"),
        lambda d, new: d.events.now(),
    ],
    ids=["enqueue", "claim", "ack", "list", "leases", "events"],
)
async def test_a_server_that_does_not_answer_is_x_driver_unavailable(
    operation: Callable[[RedisJobDriver, RequestBuilder], Any], new_request: RequestBuilder
) -> None:
    """As on every driver, so code written against the protocol catches it without naming the
    backend; it is still redis-py's ConnectionError for code written against that."""
    driver = redis_job_driver(url="redis://127.0.0.1:1/0")
    try:
        with pytest.raises(DriverUnavailableError, match="Redis did not answer") as caught:
            await operation(driver, new_request)
        assert isinstance(caught.value, redis.exceptions.ConnectionError)
    finally:
        await driver.close()


async def test_a_cluster_that_cannot_route_a_call_is_x_driver_unavailable() -> None:
    """redis-py's cluster client raises ClusterError when it cannot route a call (the cluster
    down, a moving slot's retries spent): the driver's callers see X_DRIVER_UNAVAILABLE."""
    from ultimat3.jobs.redis.unavailable import reports_unavailable

    @reports_unavailable
    class Routed:
        async def call(self) -> None:
            raise redis.exceptions.ClusterError("TTL exhausted.")

    with pytest.raises(DriverUnavailableError, match="TTL exhausted"):
        await Routed().call()


def test_a_driver_without_a_url_reads_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(DriverUnavailableError, match="REDIS_URL"):
        redis_job_driver()


async def test_a_negative_done_ttl_is_refused(redis_url: str) -> None:
    with pytest.raises(Exception, match="negative"):
        redis_job_driver(url=redis_url, done_ttl=-1)


async def test_a_command_timeout_that_is_not_positive_is_refused(redis_url: str) -> None:
    with pytest.raises(InvariantError, match="command_timeout"):
        redis_job_driver(url=redis_url, command_timeout=0)


async def test_a_claim_that_cannot_fill_its_slots_buries_every_lapsed_final_attempt(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    # More lapsed rows than one read takes (1,000 + the free slots): the claim reads on.
    await driver.enqueue_many([new_request(max_attempts=1) for _ in range(1_100)])
    await driver.claim(worker_id="w", slots={"q": 1_100}, visibility_timeout=30)
    clock.advance(31)
    batch = await driver.claim(worker_id="w", slots={"q": 5}, visibility_timeout=30)
    assert (len(batch.jobs), len(batch.exhausted)) == (0, 1_100)


async def test_a_claim_examines_at_most_five_windows_of_lapsed_rows_the_next_goes_on(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    await driver.enqueue_many([new_request(max_attempts=1) for _ in range(5_100)])
    await driver.claim(worker_id="w", slots={"q": 5_100}, visibility_timeout=30)
    clock.advance(31)
    first = await driver.claim(worker_id="w", slots={"q": 5}, visibility_timeout=30)
    second = await driver.claim(worker_id="w", slots={"q": 5}, visibility_timeout=30)
    assert (len(first.exhausted), len(second.exhausted)) == (5 * 1_005, 5_100 - 5 * 1_005)


_MEMBERS = [(1, "a"), (1, "b"), (1, "m"), (1, "é"), (2, "c"), (2, "z"), (3, "k")]


def _after(position: tuple[int, str], direction: str) -> list[str]:
    """What a page from ``position`` holds, worked out here: (score, member bytes) order."""

    def key(entry: tuple[int, str]) -> tuple[int, bytes]:
        return entry[0], entry[1].encode()

    if direction == "asc":
        return [m for s, m in sorted(_MEMBERS, key=key) if key((s, m)) > key(position)]
    return [m for s, m in sorted(_MEMBERS, key=key, reverse=True) if key((s, m)) < key(position)]


async def test_a_page_starts_right_after_any_position_reading_only(
    driver: RedisJobDriver,
) -> None:
    """Positions that are members, that are not, and that sit between scores; the script runs
    as read-only (EVALSHA_RO), which refuses any write."""
    await driver.stats()  # every script loaded
    ns = driver.namespace
    key = ns.key("page-probe")
    await driver.client.zadd(key, {member: score for score, member in _MEMBERS})
    page = scripts.script("page")
    for score in range(5):
        for member in ("", "a", "b", "c", "m", "z", "é", "ö"):
            for direction in ("asc", "desc"):
                flat = await driver.client.evalsha_ro(
                    page.sha, 2, ns.base, key, "0", "0", "0", direction, str(score), member, "3"
                )
                expected = _after((score, member), direction)[:3]
                assert flat[::2] == expected, (score, member, direction)


async def test_times_round_trip_to_the_microsecond(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    clock.advance(0.123457)
    request = new_request(delay=0.000001)
    await driver.enqueue(request)
    detail = await driver.introspect.get(request.id)
    assert detail is not None
    assert (detail.row.run_at, detail.row.created_at) == (request.run_at, clock.now())
    assert detail.row.state is JobState.DELAYED


async def test_the_oldest_waiting_row_is_found_behind_pages_of_suspended_ones(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    """Suspended rows share the due index with the waiting ones: stats steps over them, page
    after page, to the first row that waits."""
    await driver.enqueue_many([new_request() for _ in range(250)])
    jobs = (await driver.claim(worker_id="w", slots={"q": 250}, visibility_timeout=30)).jobs
    for job in jobs:
        parked = NackOptions(job.claim.worker_id, job.claim.claim, run_at=clock.now(), park=True)
        assert await driver.nack(job.id, parked)
    clock.advance(1)
    waiting = new_request()
    await driver.enqueue(waiting)
    later = new_request(delay=60)
    await driver.enqueue(later)
    clock.advance(1)
    (stats,) = await driver.stats()
    assert (stats.suspended, stats.ready, stats.delayed) == (250, 1, 1)
    assert stats.oldest_ready_at == waiting.run_at


@pytest.mark.parametrize("tied", [False, True], ids=["apart", "one-instant"])
async def test_a_lookup_pages_through_every_event_since_to_the_match(
    driver: RedisJobDriver, tied: bool
) -> None:
    """Events that do not match fill pages ahead of the one that does; published in one
    instant, they share one score, and the pages must still go on past them."""
    bus = driver.events
    since = await bus.now()
    for n in range(250):
        await bus.publish("e", {"n": n})
    match = await bus.publish("e", {"n": "the one"})
    index = driver.namespace.key("evby:e")
    if tied:
        members = await driver.client.zrange(index, 0, -1)
        await driver.client.zadd(index, dict.fromkeys(members, float(int(to_us(since)) + 1)))
    assert await bus.lookup("e", since=since, match={"n": "the one"}) == match
    assert await bus.lookup("e", since=since, match={"n": "none"}) is None


async def test_a_removal_by_state_stops_walking_once_its_budget_is_spent(
    driver: RedisJobDriver, new_request: RequestBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What remains of a removal filtered on state (and queue) is the size of what it walks: a
    call reads the rows it removes, not every row left behind it."""
    await driver.enqueue_many([new_request() for _ in range(3 * MAX_BULK_ROWS)])
    calls = _count_scripts(driver, monkeypatch)
    ready = BulkFilter(state=JobState.READY, queue="q")
    assert await driver.introspect.remove_many(ready) == BulkResult(MAX_BULK_ROWS, 2000)
    assert calls["bulk"] == MAX_BULK_ROWS // _BULK_CHUNK
    named = BulkFilter(state=JobState.READY, name="job")
    assert await driver.introspect.remove_many(named) == BulkResult(MAX_BULK_ROWS, 1000)


async def test_a_created_window_pages_as_the_memory_driver_does(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    """The walk starts at a created_at window's edge and stops past its other one; every page,
    whichever the cursor, matches the executable specification's."""
    memory = memory_job_driver(clock=clock)
    for second in range(12):
        for _ in range(1 + second % 3):  # some rows share their created_at
            request = new_request(queue=f"q{second % 2}")
            await driver.enqueue(request)
            await memory.enqueue(request)
        clock.advance(1)
    start = clock.now() - timedelta(seconds=12)
    rows = (await memory.introspect.list(JobFilter(limit=100))).rows
    for low, high in ((2, 9), (0, 4), (5, 12), (7, 7)):
        for queue in (None, "q1"):
            window = JobFilter(
                queue=queue,
                created_from=start + timedelta(seconds=low),
                created_to=start + timedelta(seconds=high),
                limit=3,
            )
            for cursor in [None, *rows[::4]]:
                for page in (
                    window if cursor is None else replace(window, after=job_cursor(cursor)),
                    *([] if cursor is None else [replace(window, before=job_cursor(cursor))]),
                ):
                    ours = await driver.introspect.list(page)
                    theirs = await memory.introspect.list(page)
                    assert [r.id for r in ours.rows] == [r.id for r in theirs.rows], page


async def test_a_queue_listed_across_its_states_pages_as_the_memory_driver_does(
    driver: RedisJobDriver, clock: FrozenClock, new_request: RequestBuilder
) -> None:
    """Without a state, a queue's rows are merged from its state sets in one read per page: the
    merged order (created_at, then id bytes) and every page, whichever the cursor, are the
    executable specification's."""
    memory = memory_job_driver(clock=clock)
    for _ in range(4):
        for n in range(3):  # rows sharing their created_at
            request = new_request(delay=3600.0 if n == 2 else 0.0)
            await driver.enqueue(request)
            await memory.enqueue(request)
        clock.advance(1)
    for backend in (driver, memory):
        batch = await backend.claim(worker_id="w", slots={"q": 5}, visibility_timeout=60)
        for done in batch.jobs[:2]:
            assert await backend.ack(done.id, AckOptions("w", done.claim.claim))
    rows = (await memory.introspect.list(JobFilter(queue="q", limit=100))).rows
    assert {row.state for row in rows} == {
        JobState.READY,
        JobState.DELAYED,
        JobState.RUNNING,
        JobState.DONE,
    }
    for cursor in [None, *rows]:
        pages = [JobFilter(queue="q", limit=2)]
        if cursor is not None:
            pages = [
                replace(pages[0], after=job_cursor(cursor)),
                replace(pages[0], before=job_cursor(cursor)),
            ]
        for page in pages:
            ours = await driver.introspect.list(page)
            theirs = await memory.introspect.list(page)
            assert [r.id for r in ours.rows] == [r.id for r in theirs.rows], page


async def test_a_queue_listed_while_its_rows_change_state_answers_each_row_once(
    driver: RedisJobDriver, new_request: RequestBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim lands while the page is being read: a row moving from one state set to another
    must be answered once. Read one set after another, it was answered twice (claimed after the
    ready set was read) or not at all (retried after the ready set was read)."""
    first, second = new_request(), new_request()
    for request in (first, second):
        await driver.enqueue(request)
    real = driver._ns.call  # the hook between two reads of one page
    acted = False

    async def claim_after_the_first_page_read(name: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal acted
        answer = await real(name, *args, **kwargs)
        if name == "page" and not acted:
            acted = True
            claimed = await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=60)
            assert [job.id for job in claimed.jobs] == [first.id]
        return answer

    monkeypatch.setattr(driver._ns, "call", claim_after_the_first_page_read)
    page = await driver.introspect.list(JobFilter(queue="q"))
    assert acted
    assert [row.id for row in page.rows] == [second.id, first.id]


async def test_expired_lease_holders_go_however_many_expire_at_once(
    driver: RedisJobDriver, clock: FrozenClock
) -> None:
    leases = driver.leases
    many = 9000  # past what one Lua unpack() can spread
    assert all(
        await asyncio.gather(
            *(leases.acquire("k", f"h{n}", limit=many, ttl=5) for n in range(many))
        )
    )
    assert not await leases.acquire("k", "late", limit=many, ttl=5)
    clock.advance(6)
    assert await leases.acquire("k", "late", limit=1, ttl=5)
    assert await leases.holders("k") == ["late"]


async def test_a_lease_renewed_in_the_hash_alone_is_kept_until_the_hash_says_it_expired(
    driver: RedisJobDriver, clock: FrozenClock
) -> None:
    """An older driver renews a holder in the hash and leaves the expiry index as it was: the
    index only names candidates, and the hash decides, so the limit still holds."""
    leases = driver.leases
    assert await leases.acquire("k", "a", limit=1, ttl=5)
    later = to_us(clock.now() + timedelta(seconds=9))
    lease_key = driver.namespace.key("lease:k")
    order = (await driver.client.hget(lease_key, "a")).split()[1]
    await driver.client.hset(lease_key, "a", f"{later} {order}")
    clock.advance(6)
    assert not await leases.acquire("k", "b", limit=1, ttl=5)
    assert await leases.holders("k") == ["a"]
    clock.advance(4)
    assert await leases.acquire("k", "b", limit=1, ttl=5)


async def test_a_lease_keys_server_ttl_outlives_its_longest_holder_whoever_wrote_last(
    driver: RedisJobDriver, clock: FrozenClock
) -> None:
    """A short lease taken after a long one must not shorten the key's life below the long
    one's expiry: the server would drop the hash and free a slot still held."""
    leases = driver.leases
    assert await leases.acquire("k", "long", limit=2, ttl=7200)
    assert await leases.acquire("k", "short", limit=2, ttl=30)
    for suffix in ("lease:k", "leasexp:k"):
        assert await driver.client.pttl(driver.namespace.key(suffix)) > 7200 * 1000


async def test_a_rebuilt_lease_index_expires_with_its_hash(
    driver: RedisJobDriver, clock: FrozenClock
) -> None:
    leases = driver.leases
    assert await leases.acquire("k", "a", limit=2, ttl=5)
    await driver.client.delete(driver.namespace.key("leasexp:k"))
    assert await leases.holders("k") == ["a"]  # rebuilds the index, then answers
    assert await driver.client.pttl(driver.namespace.key("leasexp:k")) > 0


async def test_a_lease_holder_written_without_its_expiry_entry_still_expires(
    driver: RedisJobDriver, clock: FrozenClock
) -> None:
    """The hash is the record: a holder the expiry index does not know (written by an older
    driver, or left when the index's key expired first) is indexed again, and expires."""
    leases = driver.leases
    assert await leases.acquire("k", "a", limit=2, ttl=5)
    stale = to_us(clock.now() - timedelta(seconds=1))
    await driver.client.hset(driver.namespace.key("lease:k"), "old", f"{stale} 0")
    assert await leases.holders("k") == ["a"]
    assert await leases.acquire("k", "b", limit=2, ttl=5)
    await driver.client.delete(driver.namespace.key("leasexp:k"))
    clock.advance(6)
    assert await leases.acquire("k", "c", limit=1, ttl=5)
    assert await leases.holders("k") == ["c"]


async def test_calls_that_find_the_scripts_missing_load_them_once(
    redis_url: str,
    redis_prefix: str,
    clock: FrozenClock,
    new_request: RequestBuilder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst of first calls, or of calls the server answers NOSCRIPT, shares one load."""
    driver = redis_job_driver(url=redis_url, prefix=redis_prefix, clock=clock)
    runner = driver.namespace._run
    loads = 0
    load_all = runner._load_all

    async def counted() -> None:
        nonlocal loads
        loads += 1
        await load_all()

    monkeypatch.setattr(runner, "_load_all", counted)
    try:
        await asyncio.gather(*(driver.stats() for _ in range(50)))
        assert loads == 1
        held = scripts.script("stats")
        variant = f"{held.source}\n-- {new_request().id}"
        never_loaded = scripts.Script(
            held.name, variant, scripts.hashlib.sha1(variant.encode()).hexdigest()
        )
        monkeypatch.setitem(scripts._SCRIPTS, "stats", never_loaded)
        await asyncio.gather(*(driver.stats() for _ in range(50)))
        assert loads == 2
    finally:
        await driver.clear()
        await driver.close()


_TIED_IDS = [
    "b", "a", "ab", "aé", "A", "a-", "aa", "0", "zz", "é", "abcdef", "abcdeg", "abcdefg",
    "abcdef0", "abcdefghijklm", "abcdefghijkl", "abcdefghijklz", "~", "a\x7f", "a\u0100",
    "x" * 9000, "x" * 8999 + "y",  # longer than one Lua unpack() can spread
]  # fmt: skip


@pytest.mark.parametrize("due_beside", [False, True], ids=["lapsed-only", "with-due-rows"])
async def test_lapsed_rows_sharing_run_at_are_claimed_in_id_byte_order(
    driver: RedisJobDriver, clock: FrozenClock, due_beside: bool
) -> None:
    """Ties on run_at go by id, in byte order (as Python orders str), however the ids compare:
    prefixes, lengths across the six-byte steps the claim compares them in, non-ASCII."""
    at = clock.now()
    rows = [EnqueueRequest(i, f"run-{i}", "n", "q", None, f"k-{i}", None, 3, at) for i in _TIED_IDS]
    await driver.enqueue_many(rows)
    await driver.claim(worker_id="w", slots={"q": len(rows)}, visibility_timeout=5)
    clock.advance(10)
    waiting = [f"{i}+" for i in _TIED_IDS[::3]] if due_beside else []
    await driver.enqueue_many(
        [EnqueueRequest(i, f"run-{i}", "n", "q", None, f"k-{i}", None, 3, at) for i in waiting]
    )
    everything = len(rows) + len(waiting)
    batch = await driver.claim(worker_id="w2", slots={"q": everything}, visibility_timeout=5)
    expected = sorted([*_TIED_IDS, *waiting], key=lambda i: i.encode())
    assert [job.id for job in batch.jobs] == expected


async def test_a_counter_rollup_folds_a_long_history_as_the_core_rule_says(
    driver: RedisJobDriver, clock: FrozenClock
) -> None:
    """The rollup decodes only the buckets it folds and those they fold into; what it leaves
    must be what folding the whole history would."""
    now = clock.now()
    history = [
        CounterBucket(
            name="n",
            start=bucket_start(now - timedelta(minutes=minutes), width),
            width_s=width,
            done=minutes % 7 + 1,
            failed=minutes % 3,
            duration_ms=minutes,
        )
        for width, step, span in ((60, 7, 3000), (300, 31, 12000), (3600, 97, 50000))
        for minutes in range(0, span, step)
    ]
    merged: dict[tuple[int, datetime], CounterBucket] = {}
    for bucket in history:
        key = (bucket.width_s, bucket.start)
        merged[key] = merged[key].merged(bucket) if key in merged else bucket
    fields = {
        f"{b.width_s}:{int(b.start.timestamp())}:{kind}": str(count)
        for b in merged.values()
        for kind, count in (("done", b.done), ("failed", b.failed), ("ms", b.duration_ms))
        if count
    }
    await driver.client.hset(driver.namespace.key("ctr:n"), mapping=fields)
    await driver.client.sadd(driver.namespace.key("ctrnames"), "n")
    await driver.introspect.rollup_counters()
    since = now - timedelta(days=365)
    assert await driver.introspect.counters("n", since=since) == rollup(merged.values(), now)


async def test_a_call_refused_noscript_joins_only_a_load_started_after_it_sent(
    redis_url: str, redis_prefix: str, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load that began before a call's command went out may have run its SCRIPT LOADs before
    the cache loss that refused the call: that call starts a load of its own."""
    driver = redis_job_driver(url=redis_url, prefix=redis_prefix, clock=clock)
    runner = driver.namespace._run
    gate, started = asyncio.Event(), 0

    async def slow_load() -> None:
        nonlocal started
        started += 1
        await gate.wait()

    monkeypatch.setattr(runner, "_load_all", slow_load)
    try:
        first = asyncio.create_task(runner.load())  # load 1, in flight
        joined = asyncio.create_task(runner.load(started_after=0))  # sent before load 1 began
        for _ in range(3):
            await asyncio.sleep(0)
        assert started == 1
        fresh = asyncio.create_task(runner.load(started_after=1))  # sent after: a load of its own
        for _ in range(3):
            await asyncio.sleep(0)
        assert started == 2
        gate.set()
        await asyncio.gather(first, joined, fresh)
    finally:
        await driver.close()
