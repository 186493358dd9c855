"""The Postgres outbox store itself: staging on the caller's connection, the wake it announces on
commit, and the published rows it keeps as an audit trail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pg.plans import plan_of, scans_run
from psycopg import AsyncConnection

from ultimat3.jobs.core import EnqueueRequest, FrozenClock, new_id
from ultimat3.jobs.core.errors import InvariantError, OutboxNoTxError
from ultimat3.jobs.pg import PostgresJobDriver
from ultimat3.jobs.pg.outbox import PostgresOutboxStore, postgres_outbox_store, stage_params
from ultimat3.jobs.pg.sql_outbox import (
    OUTBOX_WAKE_CHANNEL,
    SQL_OUTBOX_CLAIM,
    SQL_OUTBOX_MARK_PUBLISHED,
    SQL_OUTBOX_RELEASE,
    SQL_OUTBOX_STAGE,
)
from ultimat3.jobs.pg.transaction import current_tx, jobs_transaction

pytestmark = pytest.mark.pg

_MARKER = "marker"


class AbandonedError(Exception):
    """The application gave up on its transaction."""


@pytest.fixture
def store(driver: PostgresJobDriver, clock: FrozenClock) -> PostgresOutboxStore:
    return postgres_outbox_store(executor=driver.executor, clock=clock)


@pytest.fixture
async def app(pg_url: str) -> AsyncIterator[AsyncConnection[Any]]:
    """The application's own connection (autocommit, as a pool hands them out)."""
    async with await AsyncConnection.connect(pg_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def listener(pg_url: str) -> AsyncIterator[AsyncConnection[Any]]:
    """A session listening where a relay would."""
    async with await AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(f"listen {OUTBOX_WAKE_CHANNEL}")
        yield conn


def request(clock: FrozenClock, **fields: Any) -> EnqueueRequest:
    values: dict[str, Any] = {
        "id": new_id(),
        "run_id": new_id(),
        "name": "send-invoice",
        "queue": "invoices",
        "input": {"number": "INV-1", "lines": [1, 2.5, None, "ü"]},
        "idempotency_key": f"invoice:{new_id()}",
        "tenant_id": None,
        "max_attempts": 5,
        "run_at": clock.now(),
    }
    values.update(fields)
    return EnqueueRequest(**values)


async def wakes(listener: AsyncConnection[Any], pg_url: str) -> int:
    """How many outbox wakes were delivered for transactions committed before this call: a marker
    sent now arrives after all of them (notifications arrive in commit order)."""
    async with await AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("select pg_notify(%s, %s)", (OUTBOX_WAKE_CHANNEL, _MARKER))
    count = 0
    async for notify in listener.notifies(timeout=10):
        if notify.payload == _MARKER:
            return count
        count += 1
    raise AssertionError("the marker notification never arrived")


async def stage_committed(
    store: PostgresOutboxStore, app: AsyncConnection[Any], clock: FrozenClock
) -> EnqueueRequest:
    staged = request(clock)
    async with jobs_transaction(app):
        await store.stage(staged)
    return staged


async def test_a_claimed_row_carries_the_whole_request(
    store: PostgresOutboxStore, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    staged = request(clock, tenant_id="org-1", enqueued_by="user:7", traceparent="00-ab-cd-01")
    async with jobs_transaction(app):
        await store.stage(staged)
    (record,) = await store.claim(claimant="r1", limit=10, lease=30)
    assert record.request == staged
    assert (record.staged_at, record.claimed_by, record.claimed_at) == (
        clock.now(),
        "r1",
        clock.now(),
    )


async def test_a_rolled_back_savepoint_takes_its_staged_job_with_it(
    store: PostgresOutboxStore, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    kept, dropped = request(clock), request(clock)
    async with jobs_transaction(app):
        await store.stage(kept)
        with pytest.raises(AbandonedError):
            await stage_then_abandon(store, app, dropped)
    assert [record.request.id for record in await store.retained()] == [kept.id]


async def stage_then_abandon(
    store: PostgresOutboxStore, app: AsyncConnection[Any], staged: EnqueueRequest
) -> None:
    async with jobs_transaction(app):
        await store.stage(staged)
        raise AbandonedError()


async def test_a_tx_executor_joins_a_transaction_another_layer_opened(
    driver: PostgresJobDriver, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    store = postgres_outbox_store(executor=driver.executor, tx_executor=lambda: app, clock=clock)
    with pytest.raises(AbandonedError):
        await stage_in_plain_transaction(store, app, request(clock))
    assert await store.retained() == []


async def stage_in_plain_transaction(
    store: PostgresOutboxStore, app: AsyncConnection[Any], staged: EnqueueRequest
) -> None:
    async with app.transaction():
        await store.stage(staged)
        raise AbandonedError()


async def test_an_ambient_connection_with_no_open_transaction_is_refused(
    driver: PostgresJobDriver, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    store = postgres_outbox_store(executor=driver.executor, tx_executor=lambda: app, clock=clock)
    with pytest.raises(OutboxNoTxError):
        await store.stage(request(clock))
    assert await store.retained() == []


async def test_staging_with_no_ambient_transaction_is_refused_not_run_on_the_pool(
    store: PostgresOutboxStore, clock: FrozenClock
) -> None:
    """A store whose ``tx_executor`` sees no transaction stages nothing: a statement of its own
    would commit the job whatever became of the caller's transaction."""
    assert current_tx() is None
    with pytest.raises(OutboxNoTxError, match="no ambient connection"):
        await store.stage(request(clock))
    assert await store.retained() == []


async def test_staging_an_id_twice_keeps_the_first_row(
    store: PostgresOutboxStore, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    first = request(clock)
    async with jobs_transaction(app):
        await store.stage(first)
        await store.stage(request(clock, id=first.id, queue="elsewhere"))
    assert [record.request for record in await store.retained()] == [first]


async def test_a_stage_wakes_the_relay_when_it_commits(
    store: PostgresOutboxStore,
    app: AsyncConnection[Any],
    listener: AsyncConnection[Any],
    pg_url: str,
    clock: FrozenClock,
) -> None:
    async with jobs_transaction(app):
        await store.stage(request(clock))
        assert await wakes(listener, pg_url) == 0  # not before the commit
    assert await wakes(listener, pg_url) == 1


async def test_a_rolled_back_stage_wakes_nobody(
    store: PostgresOutboxStore,
    app: AsyncConnection[Any],
    listener: AsyncConnection[Any],
    pg_url: str,
    clock: FrozenClock,
) -> None:
    with pytest.raises(AbandonedError):
        await stage_then_abandon(store, app, request(clock))
    assert await wakes(listener, pg_url) == 0


async def test_a_stage_is_silent_while_an_unclaimed_row_already_waits(
    store: PostgresOutboxStore,
    app: AsyncConnection[Any],
    listener: AsyncConnection[Any],
    pg_url: str,
    clock: FrozenClock,
) -> None:
    await stage_committed(store, app, clock)
    await stage_committed(store, app, clock)
    assert await wakes(listener, pg_url) == 1
    await store.claim(claimant="r1", limit=10, lease=30)
    await stage_committed(store, app, clock)  # nothing waits unclaimed any more
    assert await wakes(listener, pg_url) == 1


async def test_a_published_row_stays_as_the_audit_trail(
    store: PostgresOutboxStore, app: AsyncConnection[Any], clock: FrozenClock, pg_url: str
) -> None:
    staged = await stage_committed(store, app, clock)
    await store.claim(claimant="r1", limit=10, lease=30)
    clock.advance(2)
    assert await store.mark_published([staged.id], claimant="r1") == 1
    assert await store.retained() == []
    cursor = await app.execute(
        "select claimed_by, published_at from x_outbox where id = %s", (staged.id,)
    )
    assert await cursor.fetchall() == [("r1", clock.now())]


async def test_purge_removes_only_rows_published_longer_ago_than_the_retention(
    store: PostgresOutboxStore, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    old, recent, waiting = [await stage_committed(store, app, clock) for _ in range(3)]
    await store.claim(claimant="r1", limit=2, lease=30)
    await store.mark_published([old.id], claimant="r1")
    clock.advance(timedelta(days=6))
    await store.mark_published([recent.id], claimant="r1")
    clock.advance(timedelta(days=2))
    assert await store.purge_published(older_than="7d") == 1
    assert await store.purge_published(older_than="7d") == 0
    cursor = await app.execute("select id from x_outbox order by staged_at, id")
    assert [row[0] for row in await cursor.fetchall()] == [recent.id, waiting.id]


@pytest.mark.parametrize("older_than", [-5, timedelta(days=-1)])
async def test_a_purge_of_a_negative_age_is_refused_and_removes_nothing(
    store: PostgresOutboxStore, app: AsyncConnection[Any], clock: FrozenClock, older_than: Any
) -> None:
    staged = await stage_committed(store, app, clock)
    await store.claim(claimant="r1", limit=1, lease=30)
    await store.mark_published([staged.id], claimant="r1")
    with pytest.raises(InvariantError, match="must not be negative"):
        await store.purge_published(older_than=older_than)
    cursor = await app.execute("select count(*) from x_outbox")
    assert await cursor.fetchall() == [(1,)]


def nodes_on(plan: dict[str, Any], table: str) -> list[str]:
    """The node type of every node of an EXPLAIN (FORMAT JSON) plan that reads or writes
    ``table``."""
    found = [plan["Node Type"]] if plan.get("Relation Name") == table else []
    for child in plan.get("Plans", []):
        found += nodes_on(child, table)
    return found


async def test_a_stage_under_an_older_view_than_its_statement_wakes_the_relay(
    store: PostgresOutboxStore,
    app: AsyncConnection[Any],
    listener: AsyncConnection[Any],
    pg_url: str,
    clock: FrozenClock,
) -> None:
    """A REPEATABLE READ transaction still sees a row waiting that a relay published after its
    first statement: were its stage silent for that, nothing would wake a relay for the row it
    commits."""
    waiting = await stage_committed(store, app, clock)
    assert await wakes(listener, pg_url) == 1
    async with jobs_transaction(app):
        await app.execute("set transaction isolation level repeatable read")
        await app.execute("select count(*) from x_outbox")  # the transaction's view, taken now
        await store.claim(claimant="r1", limit=10, lease=30)
        await store.mark_published([waiting.id], claimant="r1")
        await store.stage(request(clock))
    assert await wakes(listener, pg_url) == 1


async def test_a_stage_never_reads_the_audit_trail_to_decide_whether_to_wake(
    driver: PostgresJobDriver, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    """Statistics taken while rows waited, then all of them published: the stage's "does a row
    already wait?" must go to the waiting rows' index, not read every published row from the
    table's start (it did, inside the caller's transaction, when asked as NOT EXISTS)."""
    await app.execute(
        "insert into x_outbox (id, run_id, name, queue, input, idempotency_key, max_attempts,"
        " run_at, staged_at) select 'o' || g, 'r' || g, 'n', 'q', '{}', 'k' || g, 3, now(), now()"
        " from generate_series(1, 3000) g"
    )
    await app.execute("analyze x_outbox")
    await app.execute("update x_outbox set claimed_by = 'r1', published_at = now()")
    await app.execute("vacuum x_outbox")
    async with app.transaction(force_rollback=True):
        cursor = await app.execute(
            "explain (format json) " + SQL_OUTBOX_STAGE, stage_params(request(clock), clock)
        )
        ((plan,),) = await cursor.fetchall()
    scans = nodes_on(plan[0]["Plan"], "x_outbox")
    assert scans
    assert "Seq Scan" not in scans, scans


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_a_relay_finds_the_rows_it_names_by_id_whatever_the_statistics_say(
    driver: PostgresJobDriver, app: AsyncConnection[Any], clock: FrozenClock, generic: bool
) -> None:
    """Statistics taken while nothing waited (every row published), then a backlog: retiring or
    handing back a batch must look its rows up by id, not read the backlog through the pending
    index the statistics make look empty."""
    await app.execute(
        "insert into x_outbox (id, run_id, name, queue, input, idempotency_key, max_attempts,"
        " run_at, staged_at, claimed_by, published_at) select 'p' || g, 'r' || g, 'n', 'q',"
        " '{}', 'k' || g, 3, now(), now(), 'r0', now() from generate_series(1, 3000) g"
    )
    await app.execute("analyze x_outbox")
    await app.execute(
        "insert into x_outbox (id, run_id, name, queue, input, idempotency_key, max_attempts,"
        " run_at, staged_at, claimed_by, claimed_at) select 'w' || g, 'r' || g, 'n', 'q',"
        " '{}', 'k' || g, 3, now(), now(), 'r1', now() from generate_series(1, 3000) g"
    )
    named = {"ids": [f"w{n}" for n in range(1, 11)], "claimant": "r1", "now": clock.now()}
    for query in (SQL_OUTBOX_MARK_PUBLISHED, SQL_OUTBOX_RELEASE):
        plan = await plan_of(driver.executor, query, named, generic=generic)
        assert "x_outbox_pkey" in plan, plan
        assert "x_outbox_pending_idx" not in plan, plan


async def test_a_claim_stamps_its_batch_by_id_whatever_the_statistics_say(
    driver: PostgresJobDriver, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    """Statistics taken during a backlog: the generic plan of a claim guesses its batch at a
    tenth of the backlog, and stamped it by hashing the whole table, audit trail included."""
    await app.execute(
        "insert into x_outbox (id, run_id, name, queue, input, idempotency_key, max_attempts,"
        " run_at, staged_at, published_at) select 'o' || g, 'r' || g, 'n', 'q', '{}',"
        " 'k' || g, 3, now(), now(), case when g > 3000 then now() end"
        " from generate_series(1, 30000) g"
    )
    await app.execute("analyze x_outbox")
    claim = {"claimant": "r2", "now": clock.now(), "lapsed_before": clock.now(), "limit": 10}
    plan = await plan_of(driver.executor, SQL_OUTBOX_CLAIM, claim, generic=True)
    assert "Seq Scan on x_outbox" not in plan, plan


@pytest.mark.parametrize("held", [0, 100], ids=["none-held", "a-batch-held"])
async def test_a_claim_reads_its_batch_and_the_held_rows_not_the_backlog(
    driver: PostgresJobDriver, app: AsyncConnection[Any], clock: FrozenClock, held: int
) -> None:
    """A relay catching up a backlog of 20,000 rows: each pass reads the rows it takes and the
    rows another relay holds (the fence), never every unpublished row (it read them all, on
    every pass: 19 ms a pass beside 100,000 waiting rows)."""
    await app.execute(
        "insert into x_outbox (id, run_id, name, queue, input, idempotency_key, max_attempts,"
        " run_at, staged_at) select 'w' || lpad(g::text, 6, '0'), 'r' || g, 'n', 'q', '{}',"
        " 'k' || g, 3, now(), now() + g * interval '1 microsecond'"
        " from generate_series(1, 20000) g"
    )
    await app.execute(
        "update x_outbox set claimed_by = 'other', claimed_at = %s where id <= %s",
        (clock.now(), f"w{held:06d}"),
    )
    await app.execute("vacuum analyze x_outbox")
    claim = {
        "claimant": "r2",
        "now": clock.now(),
        "lapsed_before": clock.now() - timedelta(seconds=30),
        "limit": 100,
    }
    scans = await scans_run(driver.executor, SQL_OUTBOX_CLAIM, claim, "x_outbox")
    assert scans
    assert sum(rows for _, rows in scans) <= 3 * 100 + held, scans
    generic = await plan_of(driver.executor, SQL_OUTBOX_CLAIM, claim, generic=True)
    assert "x_outbox_claimed_idx" in generic, generic
    assert "Seq Scan on x_outbox" not in generic, generic


async def test_rows_staged_after_another_relays_live_batch_wait_for_it(
    store: PostgresOutboxStore, app: AsyncConnection[Any], clock: FrozenClock
) -> None:
    invoice = request(clock)
    clock.advance(0.001)
    charge = request(clock)
    async with jobs_transaction(app):
        await store.stage(invoice)
        await store.stage(charge)
    taken = await store.claim(claimant="r1", limit=1, lease=30)
    assert [record.request.id for record in taken] == [invoice.id]
    assert await store.claim(claimant="r2", limit=10, lease=30) == []
    clock.advance(31)
    taken = await store.claim(claimant="r2", limit=10, lease=30)
    assert [record.request.id for record in taken] == [invoice.id, charge.id]


async def test_claims_made_at_once_take_turns_and_never_split_the_order(
    driver: PostgresJobDriver,
    store: PostgresOutboxStore,
    app: AsyncConnection[Any],
    clock: FrozenClock,
) -> None:
    """Two claims at the same instant would each see no batch of the other's: they take turns,
    so one takes the head of the outbox and every other finds it fenced."""
    async with jobs_transaction(app):
        for _ in range(50):
            await store.stage(request(clock))
            clock.advance(0.001)
    # The pool opens its connections first, so the claims below do run at once.
    await asyncio.gather(*(driver.executor.fetch("select pg_sleep(0.05)") for _ in range(8)))
    batches = await asyncio.gather(
        *(store.claim(claimant=f"r{n}", limit=5, lease=30) for n in range(8))
    )
    assert sorted(len(batch) for batch in batches) == [0] * 7 + [5]


async def test_staging_on_a_connection_that_builds_raw_cursors(
    store: PostgresOutboxStore, pg_url: str, clock: FrozenClock
) -> None:
    """The caller's connection is the caller's: one whose cursors take $1 placeholders stages
    as any other."""
    from psycopg import AsyncRawCursor

    staged = request(clock)
    async with (
        await AsyncConnection.connect(
            pg_url, autocommit=True, cursor_factory=AsyncRawCursor
        ) as raw,
        jobs_transaction(raw),
    ):
        await store.stage(staged)
    assert [record.request for record in await store.retained()] == [staged]


async def test_staging_in_a_database_without_the_schema_says_how_to_install_it(
    pg_database_url: str, clock: FrozenClock
) -> None:
    from ultimat3.jobs.core import DriverUnavailableError

    async with await AsyncConnection.connect(pg_database_url, autocommit=True) as bare:
        store = postgres_outbox_store(executor=pg_database_url, clock=clock)
        try:
            with pytest.raises(DriverUnavailableError, match="ujobs migrate"):
                async with jobs_transaction(bare):
                    await store.stage(request(clock))
        finally:
            await store.close()
