"""The Postgres job driver: the core's ``JobDriver`` over psycopg 3 (async) and psycopg-pool.

Each of its operations is one statement (``sql_*.py`` holds every one verbatim; ``enqueue_many``
sends one per chunk and round, or a COPY for a large round), and each takes ``now`` from the
driver's clock as a parameter — the server's ``now()`` decides nothing, so a frozen clock drives
this driver exactly as it drives the memory driver.

Settles and lease renewals are batched: concurrent ``ack()`` calls of one process become one
statement (``Coalescer``), every row in it still fenced on its own claim and every caller told
whether its own row landed. A worker finishing a hundred jobs at once pays one commit, not a
hundred.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from operator import itemgetter
from typing import Any

from psycopg.errors import UniqueViolation

from ultimat3.jobs.core.clock import SYSTEM_CLOCK, Clock
from ultimat3.jobs.core.coalesce import Coalescer
from ultimat3.jobs.core.constants import COUNTER_TIERS
from ultimat3.jobs.core.counters import bucket_start
from ultimat3.jobs.core.errors import InvariantError
from ultimat3.jobs.core.ids import new_id
from ultimat3.jobs.core.jsonvalue import json_text
from ultimat3.jobs.core.logs import log_claim_answer_lost, log_nack_answer_lost
from ultimat3.jobs.core.model import (
    AckOptions,
    ClaimRef,
    Enqueued,
    EnqueueRequest,
    NackOptions,
    QueueStats,
    StepRecord,
)
from ultimat3.jobs.core.nack import nack_counter, nack_state
from ultimat3.jobs.core.protocol import ClaimBatch, ClaimedOnRead
from ultimat3.jobs.core.unanswered import LateAnswer, LostClaim, UnansweredClaims

from .backfills import PostgresBackfillLedger
from .events import PostgresEventBus
from .executor import (
    DEFAULT_OPEN_TIMEOUT_S,
    DEFAULT_POOL_MAX,
    DEFAULT_POOL_MIN,
    AnswerLostError,
    PgExecutor,
    PgTarget,
    pg_executor,
)
from .introspect import PostgresIntrospection
from .leases import PostgresLeaseStore
from .rows import (
    announce_params,
    claimed_jobs,
    copy_rows,
    enqueue_answers,
    enqueue_one_params,
    enqueue_params,
    exhausted_job,
    live_key,
    utc,
)
from .sql_claim import SQL_CLAIM, SQL_CLAIM_FLUSH, SQL_CLAIM_HELD
from .sql_enqueue import (
    ENQUEUE_COPY_TYPES,
    SQL_ENQUEUE,
    SQL_ENQUEUE_ANNOUNCE,
    SQL_ENQUEUE_COPY,
    SQL_ENQUEUE_HELD,
    SQL_ENQUEUE_ONE,
)
from .sql_read import SQL_STATS, SQL_STATS_WITHOUT_DONE
from .sql_settle import SQL_ACK, SQL_HEARTBEAT, SQL_NACK, SQL_SAVE_STEP, SQL_UNCLAIMED_STATES

__all__ = ["PostgresJobDriver", "postgres_job_driver"]

_MINUTE = COUNTER_TIERS[0][0]
_BY_JOB_ID = itemgetter(0)
"""A settle's job id: a batch holds each job at most once."""
_ENQUEUE_CHUNK = 5_000
"""Requests per enqueue statement: large enough that a fan-out is a handful of statements, small
enough that one statement's arrays stay a few megabytes."""
_ENQUEUE_RETRIES = 10
_COPY_FROM = 100
"""Requests in one round from which it is first tried by COPY (``SQL_ENQUEUE_COPY``). Below, the
one statement is quicker than the COPY's transaction (BEGIN, the announcement, the COPY, COMMIT):
measured, the two break even at about a hundred rows."""

_Ack = tuple[str, str, str, int | None]
_Nack = tuple[str, NackOptions]
_Heartbeat = tuple[str, str, str, str]
_Row = tuple[Any, ...]
"""A row of a claim's answer (SQL_CLAIM's, SQL_CLAIM_HELD's): its state first."""


class PostgresJobDriver:
    """A ``JobDriver`` on Postgres, with the operator surface, fleet leases and the backfill
    ledger. Build it with ``postgres_job_driver()``."""

    def __init__(
        self,
        target: PgTarget,
        *,
        clock: Clock = SYSTEM_CLOCK,
        pool_min: int = DEFAULT_POOL_MIN,
        pool_max: int = DEFAULT_POOL_MAX,
        open_timeout: float = DEFAULT_OPEN_TIMEOUT_S,
        prepare: bool = True,
        settle_batch: int = 1000,
    ) -> None:
        self._executor = pg_executor(
            target,
            pool_min=pool_min,
            pool_max=pool_max,
            open_timeout=open_timeout,
            prepare=prepare,
        )
        self._owns_executor = not isinstance(target, PgExecutor)
        self._clock = clock
        self._introspect = PostgresIntrospection(self._executor, clock)
        self._leases = PostgresLeaseStore(self._executor, clock)
        self._backfills = PostgresBackfillLedger(self._executor, clock)
        self._events = PostgresEventBus(self._executor)
        self._unanswered: UnansweredClaims[_Row, _Row] = UnansweredClaims(
            self._claimed_late, queue_of=lambda row: str(row[4])
        )
        self._acks: Coalescer[_Ack, bool] = Coalescer(
            self._flush_acks, key=_BY_JOB_ID, max_batch=settle_batch
        )
        self._nacks: Coalescer[_Nack, bool] = Coalescer(
            self._flush_nacks, key=_BY_JOB_ID, max_batch=settle_batch
        )
        self._heartbeats: Coalescer[_Heartbeat, bool] = Coalescer(
            self._flush_heartbeats, key=_BY_JOB_ID, max_batch=settle_batch
        )

    # -- the optional parts -----------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def executor(self) -> PgExecutor:
        """Where this driver's statements run (the Postgres stores of this package take it)."""
        return self._executor

    @property
    def introspect(self) -> PostgresIntrospection:
        return self._introspect

    @property
    def leases(self) -> PostgresLeaseStore:
        return self._leases

    @property
    def backfills(self) -> PostgresBackfillLedger:
        return self._backfills

    @property
    def events(self) -> PostgresEventBus:
        """The event bus in this database (on the database's clock, as every bus here is), so
        ``publish_event`` and ``step.wait_for_event`` find it with the driver installed."""
        return self._events

    def __repr__(self) -> str:
        return f"PostgresJobDriver({self._executor!r})"

    # -- enqueue ----------------------------------------------------------------------------

    async def enqueue(self, request: EnqueueRequest) -> Enqueued:
        """A lone request goes straight to its own statement, without a batch's bookkeeping."""
        for _ in range(_ENQUEUE_RETRIES):
            answer = await self._enqueue_one(request, self._clock.now())
            if answer is not None:
                return answer
        raise _kept_colliding(1)

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> builtins.list[Enqueued]:
        answers: list[Enqueued | None] = [None] * len(requests)
        for start in range(0, len(requests), _ENQUEUE_CHUNK):
            chunk = range(start, min(start + _ENQUEUE_CHUNK, len(requests)))
            for round_ in _rounds(requests, chunk):
                await self._enqueue_round(requests, round_, answers)
        return [answer for answer in answers if answer is not None]

    async def _enqueue_round(
        self,
        requests: Sequence[EnqueueRequest],
        positions: Sequence[int],
        answers: list[Enqueued | None],
    ) -> None:
        """One COPY or one statement for requests that share no id and no live key; a request
        whose answer committed after the statement's snapshot is asked again."""
        todo = list(positions)
        if len(todo) >= _COPY_FROM and await self._copied([requests[i] for i in todo]):
            for position in todo:
                answers[position] = Enqueued(requests[position].id, requests[position].run_id)
            return
        for _ in range(_ENQUEUE_RETRIES):
            batch = [requests[i] for i in todo]
            now = self._clock.now()
            told: list[Enqueued | None]
            if len(batch) == 1:
                told = [await self._enqueue_one(batch[0], now)]
            else:
                rows = await self._executor.fetch(SQL_ENQUEUE, enqueue_params(batch, now))
                told = enqueue_answers(batch, [row[1:] for row in rows if row[1] is not None])
            unanswered = []
            for position, answer in zip(todo, told, strict=True):
                if answer is None:
                    unanswered.append(position)
                else:
                    answers[position] = answer
            if not unanswered:
                return
            todo = unanswered
        raise _kept_colliding(len(todo))

    async def _enqueue_one(self, request: EnqueueRequest, now: datetime) -> Enqueued | None:
        """A lone request, answered as SQL_ENQUEUE answers it: its own row when it inserted,
        else the row it met — or None when that one is gone by the time it looked (ask again)."""
        if await self._executor.fetch(SQL_ENQUEUE_ONE, enqueue_one_params(request, now)):
            return Enqueued(request.id, request.run_id)
        held = await self._executor.fetch(
            SQL_ENQUEUE_HELD,
            {
                "id": request.id,
                "name": request.name,
                "tenant_id": request.tenant_id,
                "idempotency_key": request.idempotency_key,
            },
            idempotent=True,
        )
        return Enqueued(held[0][0], held[0][1], deduped=True) if held else None

    async def _copied(self, batch: Sequence[EnqueueRequest]) -> bool:
        """Whether ``batch`` went in by COPY, each request inserting its own row. False when one
        of them met a row (its id taken, its key held by a live row): nothing went in, and the
        statement answers each request."""
        now = self._clock.now()
        try:
            await self._executor.copy(
                SQL_ENQUEUE_COPY,
                copy_rows(batch, now),
                types=ENQUEUE_COPY_TYPES,
                first=(SQL_ENQUEUE_ANNOUNCE, announce_params(batch, now)),
            )
        except UniqueViolation:
            return False
        return True

    # -- claim ------------------------------------------------------------------------------

    async def claim(
        self,
        *,
        worker_id: str,
        slots: Mapping[str, int],
        visibility_timeout: float,
        drop_exhausted: Collection[str] = (),
    ) -> ClaimBatch:
        wanted = {queue: free for queue, free in slots.items() if free > 0}
        if not wanted:
            return ClaimBatch()
        now = self._clock.now()
        lease_until = now + timedelta(seconds=visibility_timeout)
        if self._unanswered:
            late = await self._unanswered.taken_late(worker_id, wanted, now)
            if late is not None:
                batch = await self._answer_late(late, wanted, worker_id, lease_until)
                late.told()
                return batch
        claim = new_id()
        try:
            rows = await self._executor.fetch(
                SQL_CLAIM,
                {
                    "slots": json_text([{"queue": q, "free": n} for q, n in wanted.items()]),
                    "now": now,
                    "lease_until": lease_until,
                    "worker_id": worker_id,
                    "claim": claim,
                    "drop": list(drop_exhausted),
                    "bucket": bucket_start(now, _MINUTE),
                },
                relaxed_commit=True,
            )
        except AnswerLostError as lost:
            rows = []
            try:
                rows = await self._claimed_before(lost, wanted, worker_id, claim, lease_until)
            finally:
                if not rows:  # it may not have run, or not committed yet, or the look failed
                    self._unanswered.remember(worker_id, claim, lease_until, wanted, now)
        try:
            await self._flush_burials(rows)
        except BaseException:
            # The claim committed, and none of it reaches the claimant: a later claim of its
            # reads it back, as it does a claim whose answer was lost.
            self._unanswered.remember(worker_id, claim, lease_until, wanted, now)
            raise
        return _batch(rows, wanted, worker_id, lease_until)

    async def _flush_burials(self, rows: builtins.list[_Row]) -> None:
        """Make the burials among a claim's rows durable before they are announced
        (``SQL_CLAIM_FLUSH``); a claim that buried nothing, nearly all of them, pays nothing."""
        buried = [row[1] for row in rows if row[0] != "running"]
        if buried:
            await self._executor.fetch(SQL_CLAIM_FLUSH, {"ids": buried}, idempotent=True)

    async def _claimed_late(
        self, lost: LostClaim
    ) -> tuple[builtins.list[_Row], builtins.list[_Row]]:
        """What a remembered claim took and buried, if it ran."""
        rows = await self._held(lost.worker_id, lost.claim, lost.lease_until, lost.queues)
        running = [row for row in rows if row[0] == "running"]
        return running, [row for row in rows if row[0] != "running"]

    async def _answer_late(
        self,
        late: LateAnswer[_Row, _Row],
        wanted: Mapping[str, int],
        worker_id: str,
        lease_until: datetime,
    ) -> ClaimBatch:
        """The rows a lost claim committed after its read-back (core's ``unanswered``), each
        that runs renewed to ``lease_until`` first: its lease ran from the lost claim's start. A
        row whose renewal did not land (cancelled meanwhile) is left out. The burials are made
        durable before the renewals, which move the rows a later look finds by their lease: when
        the flush fails, or the renewal fails before it ran, a later look finds every row
        again. (A renewal that ran and lost its answer leaves them to the lease it set.)"""
        await self._flush_burials(late.buried)
        renewals = [(row[1], worker_id, row[14], lease_until.isoformat()) for row in late.taken]
        landed = await self._flush_heartbeats(renewals) if renewals else []
        renewed = [row for row, held in zip(late.taken, landed, strict=True) if held]
        return _batch([*late.buried, *renewed], wanted, worker_id, lease_until)

    async def _claimed_before(
        self,
        lost: AnswerLostError,
        wanted: Mapping[str, int],
        worker_id: str,
        claim: str,
        lease_until: datetime,
    ) -> builtins.list[_Row]:
        """The rows a claim whose answer was lost had taken and buried. Left alone, the rows it
        took would sit running under a claim nobody holds until their lease lapsed (an attempt
        spent on nothing, a final attempt buried dead without having run), and on_exhausted
        would never hear of the rows it buried."""
        rows = await self._held(worker_id, claim, lease_until, wanted)
        buried = sum(row[0] != "running" for row in rows)
        log_claim_answer_lost(worker_id, len(rows) - buried, buried, lost)
        return rows

    async def _held(
        self, worker_id: str, claim: str, lease_until: datetime, queues: Iterable[str]
    ) -> builtins.list[_Row]:
        """The rows a claim took and buried (SQL_CLAIM_HELD's), as it answers them."""
        return await self._executor.fetch(
            SQL_CLAIM_HELD,
            {
                "queues": list(queues),
                "worker_id": worker_id,
                "claim": claim,
                "lease_until": lease_until,
            },
            idempotent=True,
        )

    # -- settles: batched per process, fenced per row ---------------------------------------

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        return await self._acks.submit(
            (job_id, options.worker_id, options.claim, options.duration_ms)
        )

    async def _flush_acks(self, items: Sequence[_Ack]) -> list[bool]:
        now = self._clock.now()
        rows = await self._executor.fetch(
            SQL_ACK,
            {
                "rows": json_text(items),
                "count": len(items),
                "now": now,
                "bucket": bucket_start(now, _MINUTE),
            },
            idempotent=True,
        )
        landed = {row[0] for row in rows}
        return [item[0] in landed for item in items]

    async def nack(self, job_id: str, options: NackOptions) -> bool:
        return await self._nacks.submit((job_id, options))

    async def _flush_nacks(self, items: Sequence[_Nack]) -> list[bool]:
        now = self._clock.now()
        batch = [
            (
                job_id,
                options.worker_id,
                options.claim,
                nack_state(options).value,
                options.error,
                None if options.run_at is None else options.run_at.isoformat(),
                options.count_attempt,
                nack_counter(options),
                options.duration_ms,
            )
            for job_id, options in items
        ]
        params = {
            "rows": json_text(batch),
            "count": len(batch),
            "now": now,
            "bucket": bucket_start(now, _MINUTE),
        }
        try:
            rows = await self._executor.fetch(SQL_NACK, params)
        except AnswerLostError as lost:
            return await self._nacked_before(lost, batch, params)
        landed = {row[0] for row in rows}
        return [job_id in landed for job_id, _ in items]

    async def _nacked_before(
        self, lost: AnswerLostError, batch: Sequence[tuple[Any, ...]], params: dict[str, Any]
    ) -> list[bool]:
        """The answers of a nack batch whose answer was lost. Sent again, a nack lands only on
        a row the first one did not move (each is fenced on its claim, which a landed nack
        cleared), and is counted only there. A row the second one does not land on answers by
        what it holds now: in the state its nack sent it to, held by no claim and stamped at
        this batch's instant, the first one landed (a row another claim buried in the meantime
        holds that claim's token, and one another run settled since bears that run's instant:
        both read as not landed). Raising instead would leave a final attempt whose nack had not
        landed to lapse, buried under LEASE_LAPSED_FINAL_ATTEMPT in place of the error that
        ended it."""
        again = {row[0] for row in await self._executor.fetch(SQL_NACK, params)}
        settled = dict(
            await self._executor.fetch(
                SQL_UNCLAIMED_STATES,
                {"ids": [row[0] for row in batch if row[0] not in again], "now": params["now"]},
                idempotent=True,
            )
        )
        log_nack_answer_lost(len(batch), len(again), lost)
        return [row[0] in again or settled.get(row[0]) == row[3] for row in batch]

    async def heartbeat(self, job_id: str, ref: ClaimRef, visibility_timeout: float) -> bool:
        lease_until = self._clock.now() + timedelta(seconds=visibility_timeout)
        return await self._heartbeats.submit(
            (job_id, ref.worker_id, ref.claim, lease_until.isoformat())
        )

    async def _flush_heartbeats(self, items: Sequence[_Heartbeat]) -> list[bool]:
        rows = await self._executor.fetch(
            SQL_HEARTBEAT,
            {"rows": json_text(items), "count": len(items)},
            idempotent=True,
            relaxed_commit=True,
        )
        landed = {row[0] for row in rows}
        return [item[0] in landed for item in items]

    async def save_step(self, job_id: str, ref: ClaimRef, run_id: str, step: StepRecord) -> bool:
        rows = await self._executor.fetch(
            SQL_SAVE_STEP,
            {
                "job_id": job_id,
                "worker_id": ref.worker_id,
                "claim": ref.claim,
                "run_id": run_id,
                "name": step.name,
                "seq": step.seq,
                "output": json_text(step.output),
                "completed": step.completed,
                "kind": step.kind,
                "now": self._clock.now(),
            },
            idempotent=True,
        )
        return bool(rows)

    # -- reading ----------------------------------------------------------------------------

    async def stats(self, *, include_done: bool = True) -> builtins.list[QueueStats]:
        statement = SQL_STATS if include_done else SQL_STATS_WITHOUT_DONE
        rows = await self._executor.fetch(statement, {"now": self._clock.now()}, idempotent=True)
        counts: dict[str, dict[str, int]] = {}
        oldest: dict[str, datetime] = {}
        for queue, state, count, oldest_at in rows:
            per_state = counts.setdefault(queue, {})
            # Without done, dead and failed rows come in two rows: those a claim buried, the rest.
            per_state[state] = per_state.get(state, 0) + count
            if oldest_at is not None and (queue not in oldest or oldest_at < oldest[queue]):
                oldest[queue] = utc(oldest_at)
        return [
            QueueStats.from_counts(queue, per_state, oldest.get(queue))
            for queue, per_state in sorted(counts.items())
        ]

    async def close(self) -> None:
        """Wait for settles in flight, then close the pool this driver opened (a pool,
        connection or executor handed in is left to its owner)."""
        for coalescer in (self._acks, self._nacks, self._heartbeats):
            await coalescer.drain()
        if self._owns_executor:
            await self._executor.close()


def postgres_job_driver(
    pool_or_url: PgTarget,
    *,
    clock: Clock = SYSTEM_CLOCK,
    pool_min: int = DEFAULT_POOL_MIN,
    pool_max: int = DEFAULT_POOL_MAX,
    open_timeout: float = DEFAULT_OPEN_TIMEOUT_S,
    prepare: bool = True,
    settle_batch: int = 1000,
) -> PostgresJobDriver:
    """A job driver on Postgres.

    ``pool_or_url``: a URL (the driver opens its own pool on first use and closes it in
    ``close()``), a psycopg ``AsyncConnectionPool`` or ``AsyncConnection`` (left open: it is
    yours), or a ``PgExecutor``. The tables must exist: ``await install(pool_or_url)`` or
    ``ujobs migrate --database-url URL``.

    ``clock`` decides every time-dependent answer (due rows, lease expiry). ``pool_min``,
    ``pool_max`` and ``open_timeout`` shape the pool the driver opens from a URL.
    ``prepare=False`` never prepares a statement on the server (behind a transaction-pooling
    proxy that does not track prepared statements). ``settle_batch`` bounds the rows one batched
    settle carries.
    """
    return PostgresJobDriver(
        pool_or_url,
        clock=clock,
        pool_min=pool_min,
        pool_max=pool_max,
        open_timeout=open_timeout,
        prepare=prepare,
        settle_batch=settle_batch,
    )


def _batch(
    rows: builtins.list[_Row],
    wanted: Mapping[str, int],
    worker_id: str,
    lease_until: datetime,
) -> ClaimBatch:
    """A claim's rows (SQL_CLAIM's, or SQL_CLAIM_HELD's) as its answer: queue by queue in the
    order asked, each queue's rows in (run_at, id) order."""
    if not rows:
        return ClaimBatch()
    order = {queue: index for index, queue in enumerate(wanted)}
    rows.sort(key=lambda row: (order.get(row[4], len(order)), row[10], row[1]))
    taken = [row for row in rows if row[0] == "running"]
    exhausted = [exhausted_job(row) for row in rows if row[0] != "running"]
    decode = partial(claimed_jobs, worker_id=worker_id, lease_until=lease_until)
    return ClaimBatch(jobs=ClaimedOnRead(taken, decode), exhausted=exhausted)


def _kept_colliding(count: int) -> InvariantError:
    return InvariantError(
        f"enqueue of {count} job(s) kept colliding with rows committed concurrently; "
        "retry the enqueue"
    )


def _rounds(requests: Sequence[EnqueueRequest], positions: range) -> list[list[int]]:
    """The positions split into rounds in which no two requests share an id or a live key, each
    request in a later round than every earlier request it shares one with — so running the
    rounds in order answers every request exactly as enqueueing them one by one would."""
    batch = [requests[position] for position in positions]
    if len({r.id for r in batch}) == len(batch) == len({live_key(r) for r in batch}):
        return [list(positions)]  # the usual batch, told in an eighth of the time
    rounds: list[list[int]] = []
    last_round: dict[tuple[str, ...], int] = {}
    for position in positions:
        request = requests[position]
        marks = (("id", request.id), ("key", *live_key(request)))
        index = max((last_round.get(mark, -1) for mark in marks), default=-1) + 1
        for mark in marks:
            last_round[mark] = index
        if index == len(rounds):
            rounds.append([])
        rounds[index].append(position)
    return rounds
