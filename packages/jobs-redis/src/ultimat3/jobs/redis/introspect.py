"""The operator surface on Redis: everything ``ujobs jobs …`` and a dashboard read or do.

Single-row actions are one script each (``get``, ``remove``, ``requeue``, ``cancel``, ``promote``).
Pages and bulk actions walk the state sets in (created_at, id) order (``paging.py``); a bulk
action hands the ids it read to ``bulk.lua`` a chunk at a time, which re-checks every row, and
stops walking once its budget (``MAX_BULK_ROWS``) is spent. Its ``remaining`` is exact, as on
every driver: a sorted set's size where one holds just the rows left (a removal by state and
queue), else the rows past the walk counted a page per ``bulk_count.lua`` call, one field read a
row. No call holds the server for long however many rows a state holds.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Literal, cast

from ultimat3.jobs.core import refusals
from ultimat3.jobs.core.constants import COUNTER_TIERS, MAX_BULK_ROWS, MAX_TASK_FIRES
from ultimat3.jobs.core.counters import rollup
from ultimat3.jobs.core.cursor import page_limit, parse_cursor
from ultimat3.jobs.core.model import (
    COUNTER_KINDS,
    BulkFilter,
    BulkResult,
    ClaimRef,
    CounterBucket,
    CounterTotals,
    JobDetail,
    JobFilter,
    JobPage,
    JobRow,
    JobState,
    Progress,
    TaskFire,
    WorkerInfo,
)

from .codec import decode_steps, encode_progress, fields, from_us, optional, read_row, to_us
from .namespace import Namespace
from .paging import Position, walk
from .unavailable import reports_unavailable

__all__ = ["RedisIntrospection"]

_BULK_CHUNK = 100
"""Rows a ``bulk`` call is handed: a removal costs ~23 us a row, so a call holds the server
~2.5 ms (500 held it 11 ms; measured, Redis 7.0, 100k rows)."""
_COUNT_PAGE = 500
"""Rows a ``bulk_count`` call reads: 2-4 us a row, ~1-2 ms a call (measured, as above)."""
_ROLLUP_TRIES = 5
_WIDTHS = {width for width, _ in COUNTER_TIERS}
_FIELD_KINDS = (*COUNTER_KINDS, "ms")
"""What a bucket's fields end in, after its ``<width>:<start>:``."""


@reports_unavailable
class RedisIntrospection:
    def __init__(self, ns: Namespace) -> None:
        self._ns = ns

    # -- reading ---------------------------------------------------------------------------

    async def _queues(self, queue: str | None) -> builtins.list[str]:
        """The queue a filter names, else every queue holding a row."""
        return [queue] if queue is not None else await self._ns.members("queues")

    async def _sources(self, state: JobState | None, queue: str | None) -> builtins.list[str]:
        """The sorted sets holding exactly the rows a state/queue filter can match."""
        states = [state.value] if state is not None else None
        if states is None and queue is None:
            return [self._ns.key("created")]
        queues = await self._queues(queue)
        return [
            self._ns.state_key(q, s)
            for q in queues
            for s in (states or [member.value for member in JobState])
        ]

    async def list(self, filter: JobFilter) -> JobPage:
        limit = page_limit(filter)
        direction: Literal["asc", "desc"] = "desc"
        start: Position | None = None
        if filter.after is not None:
            at, job_id = parse_cursor(filter.after, which="after")
            start = (int(to_us(at)), job_id)
        elif filter.before is not None:
            at, job_id = parse_cursor(filter.before, which="before")
            start, direction = (int(to_us(at)), job_id), "asc"
        # A created_at window bounds the walk: it starts at the window's edge and stops past
        # its other one, rather than read every row outside it.
        window_from = None if filter.created_from is None else int(to_us(filter.created_from))
        window_to = None if filter.created_to is None else int(to_us(filter.created_to))
        if direction == "desc" and window_to is not None:
            start = min(start, (window_to, "")) if start is not None else (window_to, "")
        if direction == "asc" and window_from is not None:
            start = max(start, (window_from, "")) if start is not None else (window_from, "")
        sources = await self._sources(filter.state, filter.queue)
        rows: builtins.list[JobRow] = []
        # Without a state, the sources are one queue's states, which rows move between.
        together = filter.state is None and filter.queue is not None
        positions = walk(self._ns, sources, direction=direction, start=start, together=together)
        if direction == "desc" and window_from is not None:
            positions = _while(positions, lambda at: at[0] >= window_from)
        if direction == "asc" and window_to is not None:
            positions = _while(positions, lambda at: at[0] < window_to)
        async for batch in _batches(positions, limit):
            for row in await self._rows([job_id for _, job_id in batch]):
                if _matches(row, filter):
                    rows.append(row)
                    if len(rows) == limit:
                        break
            if len(rows) == limit:
                break
        if direction == "asc":
            rows.reverse()
        return JobPage(rows=rows, limit=limit)

    async def _rows(self, ids: builtins.list[str]) -> builtins.list[JobRow]:
        """The rows still present among ``ids``, in order."""
        rows = await self._ns.hashes([f"job:{job_id}" for job_id in ids])
        return [read_row(row) for row in rows if row]

    async def get(self, job_id: str) -> JobDetail | None:
        found = await self._ns.call("get", job_id)
        if found is None:
            return None
        row, steps = found
        ordered = sorted(decode_steps(steps).values(), key=lambda step: step.seq)
        return JobDetail(row=read_row(fields(row)), steps=ordered)

    # -- one row -----------------------------------------------------------------------------

    async def remove(self, job_id: str) -> bool:
        removed = await self._ns.call("remove", job_id)
        if removed == -1:
            raise refusals.running_not_removable(job_id)
        return bool(removed)

    async def requeue(self, job_id: str, *, from_step: str | None = None) -> JobRow:
        answer = await self._ns.call("requeue", job_id, optional(from_step))
        verdict = answer[0]
        if verdict == "missing":
            raise refusals.job_not_found(job_id)
        if verdict == "live":
            raise refusals.not_requeueable(job_id, answer[1])
        if verdict == "held":
            raise refusals.key_held(job_id, answer[1])
        if verdict == "no-step":
            raise refusals.step_not_found(job_id, from_step)
        return read_row(fields(answer[1]))

    async def cancel(self, job_id: str, reason: str | None = None) -> JobRow | None:
        row = await self._ns.call("cancel", job_id, refusals.cancel_note(reason))
        return None if row is None else read_row(fields(row))

    async def promote(self, job_id: str) -> JobRow:
        answer = await self._ns.call("promote", job_id)
        if answer[0] == "missing":
            raise refusals.job_not_found(job_id)
        if answer[0] != "ok":
            raise refusals.not_promotable(job_id, answer[1])
        return read_row(fields(answer[1]))

    # -- many rows ---------------------------------------------------------------------------

    async def _bulk(
        self, action: Literal["requeue", "remove", "promote"], filter: BulkFilter
    ) -> BulkResult:
        queues = await self._queues(filter.queue)
        sources = [self._ns.state_key(q, filter.state.value) for q in queues]
        now = self._ns.clock.now()
        if action == "promote":
            waiting = await self._waiting(queues, now)
            if waiting is not None:
                moved = 0
                for start in range(0, len(waiting), _BULK_CHUNK):
                    chunk = waiting[start : start + _BULK_CHUNK]
                    moved += (await self._act(action, filter, chunk, MAX_BULK_ROWS, now))[0]
                return BulkResult(affected=moved, remaining=0)
        # Oldest first, as every driver moves them; the walk stops once the budget is spent.
        moved, last = 0, None
        async for batch in _batches(walk(self._ns, sources, direction="asc"), _BULK_CHUNK):
            ids = [job_id for _, job_id in batch]
            done, seen = await self._act(action, filter, ids, MAX_BULK_ROWS - moved, now)
            moved += done
            if moved == MAX_BULK_ROWS:
                last = batch[seen - 1]
                break
        if last is None:
            # The walk ran out: every matching row was examined; one left cannot move (held,
            # or no longer waiting).
            return BulkResult(affected=moved, remaining=0)
        if action == "remove" and filter.name is None and filter.tenant_id is None:
            # Every row of the sources matches: what remains is their size.
            return BulkResult(affected=moved, remaining=await self._ns.sizes(sources))
        left = await self._left(action, filter, queues, last, now)
        return BulkResult(affected=moved, remaining=left)

    async def _act(
        self,
        action: str,
        filter: BulkFilter,
        ids: builtins.list[str],
        budget: int,
        now: datetime,
    ) -> tuple[int, int]:
        """``action`` on the rows of ``ids`` that match, until ``budget`` moved: (how many moved,
        how many of ``ids`` were examined)."""
        moved, seen = await self._ns.call(
            "bulk",
            action,
            filter.state.value,
            optional(filter.queue),
            optional(filter.name),
            optional(filter.tenant_id),
            str(budget),
            *ids,
            now=now,
        )
        return int(moved), int(seen)

    async def _waiting(
        self, queues: builtins.list[str], now: datetime
    ) -> builtins.list[str] | None:
        """The ids of every row of ``queues`` still waiting on its run_at (of any state: the due
        index holds them all), when one call can move them all — their order is then moot and
        nothing remains; None when more wait. Promoting the few rows backing off behind a backlog
        of due ones reads just those few, where a walk in created order reads the whole backlog."""
        after = "(" + to_us(now)
        due = [self._ns.due_key(queue) for queue in queues]
        pipe = self._ns.client.pipeline(transaction=False)
        for key in due:
            pipe.zcount(key, after, "+inf")
        if sum(cast(builtins.list[int], await pipe.execute())) > MAX_BULK_ROWS:
            return None
        pipe = self._ns.client.pipeline(transaction=False)
        for key in due:
            pipe.zrangebyscore(key, after, "+inf", start=0, num=MAX_BULK_ROWS + 1)
        found = cast(builtins.list[builtins.list[str]], await pipe.execute())
        ids = [job_id for listed in found for job_id in listed]
        return ids if len(ids) <= MAX_BULK_ROWS else None

    async def _left(
        self,
        action: Literal["requeue", "remove", "promote"],
        filter: BulkFilter,
        queues: builtins.list[str],
        after: Position,
        now: datetime,
    ) -> int:
        """What a next call could move: the rows past ``after`` that match (the walk examined
        every row up to it: those that matched moved, or are held and stay held), counted exactly
        a page per ``bulk_count`` call, so the server is never held for the whole count. ``now``
        is the action's own: a row it left waiting is counted as waiting."""
        matched, free = 0, set()
        for queue in queues:
            source = self._ns.state_key(queue, filter.state.value)
            if action == "promote" and filter.name is None and filter.tenant_id is None:
                # Every row of the state set waits but those already due (they share the due
                # index): when fewer are due, count those instead — a queue's due backlog is
                # usually short, its delayed rows many.
                pipe = self._ns.client.pipeline(transaction=False)
                pipe.zcard(source)
                pipe.zcount(self._ns.due_key(queue), "-inf", to_us(now))
                size, due = cast(builtins.list[int], await pipe.execute())
                if due < size:
                    found, _ = await self._count("due", filter, self._ns.due_key(queue), None, now)
                    matched += max(0, size - found)  # read apart: a row may move meanwhile
                    continue
            found, keys = await self._count(action, filter, source, after, now)
            matched += found
            free.update(keys)
        return len(free) if action == "requeue" else matched

    async def _count(
        self,
        what: str,
        filter: BulkFilter,
        key: str,
        after: Position | None,
        now: datetime,
    ) -> tuple[int, set[str]]:
        """``bulk_count.lua`` over the sorted set ``key`` past ``after``, page by page: (the rows
        matched, the free live keys found)."""
        score, member = ("", "") if after is None else (str(after[0]), after[1])
        matched, free = 0, set[str]()
        while True:
            read, score, member, found, *keys = await self._ns.call(
                "bulk_count",
                what,
                filter.state.value,
                optional(filter.name),
                optional(filter.tenant_id),
                score,
                member,
                str(_COUNT_PAGE),
                keys=[key],
                now=now,
            )
            matched += found
            free.update(keys)
            if read < _COUNT_PAGE:
                return matched, free

    async def requeue_many(self, filter: BulkFilter) -> BulkResult:
        refusals.check_requeue_many(filter)
        return await self._bulk("requeue", filter)

    async def remove_many(self, filter: BulkFilter) -> BulkResult:
        refusals.check_remove_many(filter)
        return await self._bulk("remove", filter)

    async def promote_many(self, filter: BulkFilter) -> BulkResult:
        refusals.check_promote_many(filter)
        return await self._bulk("promote", filter)

    # -- pauses --------------------------------------------------------------------------------

    async def pause_queue(self, queue: str) -> None:
        await self._ns.client.sadd(self._ns.key("paused"), queue)

    async def resume_queue(self, queue: str) -> None:
        await self._ns.call("resume_queue", queue)

    async def paused_queues(self) -> builtins.list[str]:
        return await self._ns.members("paused")

    async def pause_task(self, task: str) -> None:
        await self._ns.client.sadd(self._ns.key("pausedtasks"), task)

    async def resume_task(self, task: str) -> None:
        await self._ns.client.srem(self._ns.key("pausedtasks"), task)

    async def paused_tasks(self) -> builtins.list[str]:
        return await self._ns.members("pausedtasks")

    # -- workers, progress, counters, task fires ----------------------------------------------

    async def workers(self) -> builtins.list[WorkerInfo]:
        return _workers(await self._ns.call("workers", ""))

    async def record_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        now = self._ns.clock.now()
        row = {
            "id": info.id,
            "host": info.host,
            "started_at": to_us(info.started_at),
            "queues": list(info.queues),
            "slots": dict(info.slots),
            "in_flight": list(info.in_flight),
            "last_heartbeat": to_us(info.last_heartbeat),
        }
        expires = to_us(now + timedelta(seconds=ttl))
        await self._ns.call("record_worker", info.id, json.dumps(row), expires, now=now)

    async def remove_worker(self, worker_id: str) -> None:
        await self._ns.call("workers", worker_id)

    async def record_progress(self, job_id: str, ref: ClaimRef, progress: Progress) -> bool:
        landed = await self._ns.call(
            "progress", job_id, ref.worker_id, ref.claim, encode_progress(progress)
        )
        return bool(landed)

    async def _buckets(self, name: str) -> builtins.list[CounterBucket]:
        return _read_buckets(name, await self._ns.hash(f"ctr:{name}"))

    async def counters(self, job: str, *, since: datetime) -> builtins.list[CounterBucket]:
        buckets = await self._buckets(job)
        return sorted(
            (b for b in buckets if b.start + timedelta(seconds=b.width_s) > since),
            key=lambda b: (b.start, b.width_s),
        )

    async def counter_totals(self, *, since: datetime) -> builtins.list[CounterTotals]:
        totals: dict[str, CounterTotals] = {}
        for name in await self._ns.members("ctrnames"):
            buckets = await self._buckets(name)
            for bucket in buckets:
                if bucket.start + timedelta(seconds=bucket.width_s) <= since:
                    continue
                held = totals.get(name) or CounterTotals(name=name)
                totals[name] = held.merged(bucket)
        return sorted(totals.values(), key=lambda t: t.name)

    async def rollup_counters(self) -> None:
        for name in await self._ns.members("ctrnames"):
            for _ in range(_ROLLUP_TRIES):
                if await self._rollup(name):
                    break

    async def _rollup(self, name: str) -> bool:
        """Fold ``name``'s buckets past their tier's retention, reading only them (found in the
        bucket index) and the buckets they fold into: a full history is ~21k fields, and reading
        them all each minute cost 40-60 ms of the leader's loop a job name (measured) and held
        the server ~6 ms meanwhile. False when another rollup changed them first."""
        now = self._ns.clock.now()
        edges: builtins.list[str] = []
        for width, retention in COUNTER_TIERS:
            latest = int((now - timedelta(seconds=retention)).timestamp()) - width
            if latest >= 0:  # no bucket starts before the epoch
                edges += (str(width), str(latest))
        due = cast(builtins.list[str], await self._ns.call("counters_due", name, *edges, now=now))
        if not due:
            return True
        into = {_bucket_prefix(b) for b in rollup(map(_empty_bucket, due), now)}
        read = [*due, *sorted(into.difference(due))]
        fields = [f"{bucket}:{kind}" for bucket in read for kind in _FIELD_KINDS]
        values = cast(
            builtins.list[str | None],
            await self._ns.client.hmget(self._ns.key(f"ctr:{name}"), fields),
        )
        held = {f: v for f, v in zip(fields, values, strict=True) if v is not None}
        folded = _write_buckets(rollup(_read_buckets(name, held), now))
        emptied = set(read).difference(field.rpartition(":")[0] for field in folded)
        # The fold writes only buckets it read. Every field of an emptied bucket is sent, so the
        # swap also checks that none was written since.
        args: builtins.list[str] = []
        for field in fields:
            was, value = held.get(field, ""), folded.get(field, "")
            if value != was or field.rpartition(":")[0] in emptied:
                args += (field, was, value)
        count = str(len(args) // 3)
        return bool(await self._ns.call("counters_swap", name, count, *args, *sorted(emptied)))

    async def task_fires(self) -> builtins.list[TaskFire]:
        stored = await self._ns.hash("taskfires")
        fires = []
        for task, value in stored.items():
            occurrence, fired = value.split(" ")
            fires.append(TaskFire(task, int(occurrence), from_us(fired)))
        return sorted(fires, key=lambda f: f.task)[:MAX_TASK_FIRES]

    async def record_task_fire(self, task: str, occurrence_ms: int) -> None:
        await self._ns.call("task_fire", task, str(occurrence_ms))


async def _batches(
    positions: AsyncIterator[Position], size: int
) -> AsyncIterator[builtins.list[Position]]:
    batch: builtins.list[Position] = []
    async for position in positions:
        batch.append(position)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


async def _while(
    positions: AsyncIterator[Position], holds: Callable[[Position], bool]
) -> AsyncIterator[Position]:
    """``positions`` up to the first that ``holds`` is false for."""
    async for position in positions:
        if not holds(position):
            return
        yield position


def _matches(row: JobRow, filter: JobFilter) -> bool:
    return (
        (filter.queue is None or row.queue == filter.queue)
        and (filter.name is None or row.name == filter.name)
        and (filter.state is None or row.state is filter.state)
        and (filter.tenant_id is None or row.tenant_id == filter.tenant_id)
        and (filter.id_prefix is None or row.id.startswith(filter.id_prefix))
        and (filter.created_from is None or row.created_at >= filter.created_from)
        and (filter.created_to is None or row.created_at < filter.created_to)
    )


def _workers(flat: builtins.list[str]) -> builtins.list[WorkerInfo]:
    infos = []
    for stored in fields(flat).values():
        row = json.loads(stored)
        infos.append(
            WorkerInfo(
                id=row["id"],
                host=row["host"],
                started_at=from_us(row["started_at"]),
                queues=row["queues"],
                slots=row["slots"],
                in_flight=row["in_flight"],
                last_heartbeat=from_us(row["last_heartbeat"]),
            )
        )
    return sorted(infos, key=lambda w: w.id)


def _empty_bucket(prefix: str) -> CounterBucket:
    """The bucket ``<width>:<start>`` with nothing counted: where it folds to is all it says."""
    width, start = prefix.split(":")
    return CounterBucket(name="", start=from_us(int(start) * 1_000_000), width_s=int(width))


def _bucket_prefix(bucket: CounterBucket) -> str:
    """``<width>:<start seconds>``: how a bucket's fields begin."""
    return f"{bucket.width_s}:{int(bucket.start.timestamp())}"


def _read_buckets(name: str, stored: dict[str, str]) -> builtins.list[CounterBucket]:
    """Buckets from counter fields ``<width>:<start seconds>:<kind or ms>``."""
    grouped: dict[tuple[int, int], dict[str, int]] = {}
    for field, value in stored.items():
        width, start, kind = field.split(":")
        grouped.setdefault((int(width), int(start)), {})[kind] = int(value)
    return [
        CounterBucket(
            name=name,
            start=from_us(start * 1_000_000),
            width_s=width,
            done=counts.get("done", 0),
            retried=counts.get("retried", 0),
            failed=counts.get("failed", 0),
            dead=counts.get("dead", 0),
            duration_ms=counts.get("ms", 0),
        )
        for (width, start), counts in grouped.items()
        if width in _WIDTHS
    ]


def _write_buckets(buckets: builtins.list[CounterBucket]) -> dict[str, str]:
    stored: dict[str, str] = {}
    for bucket in buckets:
        prefix = _bucket_prefix(bucket)
        for kind in COUNTER_KINDS:
            if getattr(bucket, kind):
                stored[f"{prefix}:{kind}"] = str(getattr(bucket, kind))
        if bucket.duration_ms:
            stored[f"{prefix}:ms"] = str(bucket.duration_ms)
    return stored
