"""The Redis driver: one Lua script per operation, every key of a namespace in one hash slot.

Behaves exactly as the memory driver (the conformance suite holds both to one model); what is
Redis-specific is how: each operation is one atomic script (``lua/*.lua``), due rows are found in
per-queue sorted sets (never a scan), and settles and heartbeats that many tasks issue at once
travel as one script call (core's ``Coalescer``), each row still fenced on its own claim.

Time: every decision reads ``clock`` (sent to the scripts as "now"), so a frozen clock drives
the driver in tests exactly as it drives the memory driver. Done rows and their steps expire
``done_ttl`` after they finished; dead, failed and cancelled rows are kept.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Collection, Mapping, Sequence
from datetime import timedelta
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError
from ultimat3.jobs.core.clock import SYSTEM_CLOCK, Clock
from ultimat3.jobs.core.coalesce import Coalescer
from ultimat3.jobs.core.durations import Duration, parse_duration
from ultimat3.jobs.core.errors import DriverUnavailableError, InvariantError
from ultimat3.jobs.core.ids import new_id
from ultimat3.jobs.core.logs import log_claim_answer_lost, log_nack_answer_lost
from ultimat3.jobs.core.model import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    AckOptions,
    ClaimRef,
    Enqueued,
    EnqueueRequest,
    JobState,
    NackOptions,
    QueueStats,
    StepRecord,
    without_done,
)
from ultimat3.jobs.core.nack import nack_counter, nack_state
from ultimat3.jobs.core.protocol import ClaimBatch, ClaimedOnRead
from ultimat3.jobs.core.unanswered import LateAnswer, LostClaim, UnansweredClaims

from .backfills import RedisBackfillLedger
from .codec import (
    encode_step,
    from_us,
    optional,
    read_claimed_rows,
    read_enqueued,
    read_exhausted,
    request_args,
    to_us,
)
from .events import RedisEventBus
from .introspect import RedisIntrospection
from .keys import DEFAULT_PREFIX, namespace_base
from .leases import RedisLeaseStore
from .namespace import Namespace, RedisClient
from .unavailable import reports_unavailable
from .wire import DEFAULT_COMMAND_TIMEOUT

__all__ = ["DEFAULT_COMMAND_TIMEOUT", "DEFAULT_DONE_TTL", "RedisJobDriver", "redis_job_driver"]

DEFAULT_DONE_TTL = timedelta(days=7)
_ENQUEUE_CHUNK = 500
"""Rows per enqueue script call: long enough to amortise the round trip, short enough that one
call never holds the server for more than a few milliseconds."""

_STATES = (
    JobState.READY,
    JobState.DELAYED,
    JobState.RUNNING,
    JobState.SUSPENDED,
    JobState.DONE,
    JobState.FAILED,
    JobState.DEAD,
    JobState.CANCELLED,
)
"""The order ``stats.lua`` answers its counts in (``STATES`` in the prelude)."""

_Settle = tuple[str, ...]
"""One settle as ``settle.lua`` reads it: an ack's five fields or a nack's ten."""
_Renewal = tuple[str, str, str, str]
_Taken = tuple[list[Any], list[str]]
"""A row a claim took, as claim.lua answers it: its CLAIMED_FIELDS values, its steps."""
_Buried = list[Any]
"""A row a claim buried, as claim.lua answers it: its EXHAUSTED_FIELDS values."""
_QUEUE_AT, _LEASE_AT, _CLAIM_AT = 3, 11, 13
"""Where a taken row's queue, lease and claim token sit among its CLAIMED_FIELDS values."""


@reports_unavailable
class RedisJobDriver:
    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock = SYSTEM_CLOCK,
        done_ttl: Duration = DEFAULT_DONE_TTL,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        owns_client: bool = False,
    ) -> None:
        ttl = parse_duration(done_ttl, field="done_ttl")
        if ttl < 0:
            raise InvariantError(
                f"done_ttl={done_ttl!r} is negative; pass a duration, or 0 to keep done rows",
                meta={"done_ttl": ttl},
            )
        if not command_timeout > 0:
            raise InvariantError(
                f"command_timeout={command_timeout!r} must be a positive number of seconds "
                f"(default {DEFAULT_COMMAND_TIMEOUT:g})",
                meta={"command_timeout": command_timeout},
            )
        _require_text_responses(client)
        self._ns = Namespace(
            client,
            base=namespace_base(prefix),
            clock=clock,
            done_ttl_s=ttl,
            command_timeout=command_timeout,
        )
        self._owns_client = owns_client
        self.prefix = prefix
        self._settles: Coalescer[_Settle, bool] = Coalescer(
            self._settle_batch, max_batch=500, in_flight=1
        )
        self._renewals: Coalescer[_Renewal, bool] = Coalescer(
            self._renew_batch, max_batch=500, in_flight=1
        )
        self._introspect = RedisIntrospection(self._ns)
        self._leases = RedisLeaseStore(self._ns)
        self._backfills = RedisBackfillLedger(self._ns)
        self._events = RedisEventBus(self._ns)
        self._unanswered: UnansweredClaims[_Taken, _Buried] = UnansweredClaims(
            self._claimed_late, queue_of=lambda taken: str(taken[0][_QUEUE_AT])
        )

    @property
    def client(self) -> RedisClient:
        return self._ns.client

    @property
    def namespace(self) -> Namespace:
        """The key space, clock and script runner the driver's parts share."""
        return self._ns

    @property
    def clock(self) -> Clock:
        return self._ns.clock

    @property
    def introspect(self) -> RedisIntrospection:
        return self._introspect

    @property
    def leases(self) -> RedisLeaseStore:
        return self._leases

    @property
    def backfills(self) -> RedisBackfillLedger:
        return self._backfills

    @property
    def events(self) -> RedisEventBus:
        return self._events

    @property
    def wake_channel(self) -> str:
        """The pub/sub channel enqueues announce their queue on (see ``wake.py``)."""
        return self._ns.key("wake")

    def __repr__(self) -> str:
        return f"RedisJobDriver(prefix={self.prefix!r})"

    # -- enqueue ----------------------------------------------------------------------------

    async def enqueue(self, request: EnqueueRequest) -> Enqueued:
        return (await self._enqueue_chunk([request]))[0]

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        answers: list[Enqueued] = []
        for start in range(0, len(requests), _ENQUEUE_CHUNK):
            answers += await self._enqueue_chunk(requests[start : start + _ENQUEUE_CHUNK])
        return answers

    async def _enqueue_chunk(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        answers = await self._ns.call("enqueue", str(len(requests)), *request_args(requests))
        return read_enqueued(answers)

    # -- claim ------------------------------------------------------------------------------

    async def claim(
        self,
        *,
        worker_id: str,
        slots: Mapping[str, int],
        visibility_timeout: float,
        drop_exhausted: Collection[str] = (),
    ) -> ClaimBatch:
        now = self._ns.clock.now()
        deadline = now + timedelta(seconds=visibility_timeout)
        lease_until = to_us(deadline)
        if self._unanswered:
            late = await self._unanswered.taken_late(worker_id, slots, now)
            if late is not None:
                batch = await self._answer_late(late, worker_id, lease_until)
                late.told()
                return batch
        base = new_id()
        args = [worker_id, base, lease_until, LEASE_LAPSED_FINAL_ATTEMPT, str(len(slots))]
        for queue, free in slots.items():
            args += (queue, str(free))
        args.append(str(len(drop_exhausted)))
        args += drop_exhausted
        try:
            claimed, exhausted = await self._ns.call("claim", *args, now=now)
        except ConnectionError as lost:
            # Its rows, if it ran, are running under a claim nobody holds until their lease
            # lapses (an attempt spent on nothing, a final one buried dead without having run),
            # and on_exhausted never hears of the rows it buried. When the read-back finds
            # nothing (the claim may still be waiting on the server) or fails, later claims
            # look again (core's ``unanswered``).
            claimed, exhausted = [], []
            try:
                claimed, exhausted = await self._held(worker_id, base, lease_until, slots)
                log_claim_answer_lost(worker_id, len(claimed), len(exhausted), lost)
            finally:
                if not claimed and not exhausted:
                    self._unanswered.remember(worker_id, base, deadline, slots, now)
        return _batch(claimed, exhausted)

    async def _held(
        self, worker_id: str, base: str, lease_until: str, queues: Collection[str]
    ) -> tuple[list[_Taken], list[_Buried]]:
        """The rows a claim took and buried (claimed.lua's answer), as it answers them."""
        taken, buried = await self._ns.call(
            "claimed", worker_id, base, lease_until, str(len(queues)), *queues
        )
        return taken, buried

    async def _claimed_late(self, lost: LostClaim) -> tuple[list[_Taken], list[_Buried]]:
        return await self._held(lost.worker_id, lost.claim, to_us(lost.lease_until), lost.queues)

    async def _answer_late(
        self, late: LateAnswer[_Taken, _Buried], worker_id: str, lease_until: str
    ) -> ClaimBatch:
        """The rows a lost claim took after its read-back, each renewed to ``lease_until``
        first (its lease ran from the lost claim's start), and the rows it buried. A row whose
        renewal did not land (cancelled meanwhile) is left out."""
        renewed = []
        if late.taken:
            args = [str(len(late.taken))]
            for values, _ in late.taken:
                args += (values[0], worker_id, values[_CLAIM_AT], lease_until)
            landed = await self._ns.call("heartbeat", *args)
            for (values, steps), held in zip(late.taken, landed, strict=True):
                if held:
                    values = [*values[:_LEASE_AT], lease_until, *values[_LEASE_AT + 1 :]]
                    renewed.append((values, steps))
        return _batch(renewed, late.buried)

    # -- settles and renewals, coalesced ------------------------------------------------------

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        duration = "" if options.duration_ms is None else str(options.duration_ms)
        return await self._settles.submit(("a", job_id, options.worker_id, options.claim, duration))

    async def nack(self, job_id: str, options: NackOptions) -> bool:
        target = nack_state(options)
        run_at = ""
        if target in (JobState.READY, JobState.SUSPENDED):
            run_at = to_us(options.run_at or self._ns.clock.now())
        return await self._settles.submit(
            (
                "n",
                job_id,
                options.worker_id,
                options.claim,
                target.value,
                nack_counter(options) or "",
                "" if options.duration_ms is None else str(options.duration_ms),
                optional(options.error),
                run_at,
                "1" if options.count_attempt else "0",
            )
        )

    async def _settle_batch(self, batch: Sequence[_Settle]) -> list[bool]:
        args = [str(len(batch))]
        for settle in batch:
            args += settle
        try:
            answers = await self._ns.call("settle", *args)
        except ConnectionError as lost:
            return await self._settled_before(lost, batch, args)
        return [bool(landed) for landed in answers]

    async def _settled_before(
        self, lost: ConnectionError, batch: Sequence[_Settle], args: Sequence[str]
    ) -> list[bool]:
        """The answers of a settle batch whose answer was lost. Sent again, each settle lands
        only where the first did not (fenced on its claim), and is counted only there; an ack
        that had landed answers 1 again (settle.lua). A nack the second send does not land on
        answers by its row: in the state it sent the row to, still marked with its worker and
        claim (a move keeps them), the first one landed."""
        answers = await self._ns.call("settle", *args)
        landed = [bool(answer) for answer in answers]
        unsure = [i for i, settle in enumerate(batch) if settle[0] == "n" and not landed[i]]
        rows = await self._ns.hashes([f"job:{batch[i][1]}" for i in unsure])
        for i, row in zip(unsure, rows, strict=True):
            _, _, worker, claim, target, *_ = batch[i]
            held = (row.get("state"), row.get("worker"), row.get("claim"))
            landed[i] = held == (target, worker, claim)
        nacks = sum(settle[0] == "n" for settle in batch)
        if nacks:
            log_nack_answer_lost(nacks, nacks - len(unsure), lost)
        return landed

    async def heartbeat(self, job_id: str, ref: ClaimRef, visibility_timeout: float) -> bool:
        lease_until = self._ns.clock.now() + timedelta(seconds=visibility_timeout)
        return await self._renewals.submit((job_id, ref.worker_id, ref.claim, to_us(lease_until)))

    async def _renew_batch(self, batch: Sequence[_Renewal]) -> list[bool]:
        args = [str(len(batch))]
        for renewal in batch:
            args += renewal
        return [bool(landed) for landed in await self._ns.call("heartbeat", *args)]

    async def save_step(self, job_id: str, ref: ClaimRef, run_id: str, step: StepRecord) -> bool:
        landed = await self._ns.call(
            "save_step", job_id, ref.worker_id, ref.claim, run_id, step.name, encode_step(step)
        )
        return bool(landed)

    # -- reading ----------------------------------------------------------------------------

    async def stats(self, *, include_done: bool = True) -> list[QueueStats]:
        """Every count is one ZCARD, so leaving the done rows out saves no reading here."""
        stats = []
        for queue, counts, oldest in await self._ns.call("stats"):
            per_state = {state.value: count for state, count in zip(_STATES, counts, strict=True)}
            oldest_at = None if oldest is None else from_us(oldest)
            stats.append(QueueStats.from_counts(queue, per_state, oldest_at))
        stats.sort(key=lambda s: s.queue)
        return stats if include_done else without_done(stats)

    async def clear(self) -> int:
        """Delete every key of this namespace (a test's reset, a teardown); answers how many.

        Walks the keyspace with SCAN, so it costs a pass over the server's keys: never on a hot
        path, and not atomic with anything running meanwhile.
        """
        removed = 0
        batch: list[str] = []
        async for key in self._ns.client.scan_iter(match=self._ns.base + "*", count=1000):
            batch.append(key)
            if len(batch) == 500:
                removed += await self._ns.client.unlink(*batch)
                batch = []
        if batch:
            removed += await self._ns.client.unlink(*batch)
        return removed

    async def close(self) -> None:
        await self._settles.drain()
        await self._renewals.drain()
        await self._ns.close()
        if self._owns_client:
            await self._ns.client.aclose()


def _require_text_responses(client: RedisClient) -> None:
    if not client.get_encoder().decode_responses:
        raise InvariantError(
            "the Redis client must decode responses to str; build it with "
            "redis.asyncio.Redis.from_url(url, decode_responses=True), or pass url= instead",
            meta={"decode_responses": False},
        )


def redis_job_driver(
    client: RedisClient | None = None,
    *,
    url: str | None = None,
    prefix: str = DEFAULT_PREFIX,
    clock: Clock = SYSTEM_CLOCK,
    done_ttl: Duration = DEFAULT_DONE_TTL,
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
    **client_options: Any,
) -> RedisJobDriver:
    """A driver on Redis: the ``client`` given, else one for ``url``, else for ``REDIS_URL``.

    ``prefix`` names the namespace (every key is ``{prefix}:…``); ``done_ttl`` is how long a done
    row and its steps are kept (0 keeps them); ``command_timeout`` is how many seconds a reply on
    the driver's own connection may take before that connection counts as broken (the calls
    waiting on it fail with ``ConnectionError``). A client the driver built is closed by
    ``close()``.
    """
    build = functools.partial(
        RedisJobDriver,
        prefix=prefix,
        clock=clock,
        done_ttl=done_ttl,
        command_timeout=command_timeout,
    )
    if client is not None:
        return build(client)
    target = url or os.environ.get("REDIS_URL")
    if not target:
        raise DriverUnavailableError(
            "no Redis to connect to: pass url= or client=, or set REDIS_URL "
            "(e.g. REDIS_URL=redis://127.0.0.1:6379/0)"
        )
    built = Redis.from_url(target, decode_responses=True, **client_options)
    return build(built, owns_client=True)


def _batch(taken: Sequence[_Taken], buried: Sequence[_Buried]) -> ClaimBatch:
    return ClaimBatch(
        jobs=ClaimedOnRead(taken, read_claimed_rows),
        exhausted=[read_exhausted(values) for values in buried],
    )
