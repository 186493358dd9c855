"""The memory driver: a real driver over one process's heap, held to the same conformance suite
as the server drivers. For ``ujobs dev``, single-process apps and tests.

Every operation runs without an ``await`` between its read and its write, so on one event loop
each is atomic exactly as a statement is on a server.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from copy import deepcopy
from datetime import datetime, timedelta

from ..clock import SYSTEM_CLOCK, Clock
from ..events import MemoryEventBus
from ..ids import new_id
from ..model import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    AckOptions,
    ClaimedJob,
    ClaimRef,
    Enqueued,
    EnqueueRequest,
    ExhaustedJob,
    JobState,
    NackOptions,
    QueueStats,
    StepRecord,
    without_done,
)
from ..nack import nack_counter, nack_state
from ..protocol import ClaimBatch
from .backfills import MemoryBackfillLedger
from .introspect import MemoryIntrospection
from .leases import MemoryLeaseStore
from .state import MemoryState, Row, copied_step

__all__ = ["MemoryJobDriver", "memory_job_driver"]


def _claim_order(row: Row) -> tuple[datetime, str]:
    return (row.run_at, row.id)


class MemoryJobDriver:
    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._state = MemoryState(clock=clock)
        self._introspect = MemoryIntrospection(self._state)
        self._leases = MemoryLeaseStore(clock)
        self._backfills = MemoryBackfillLedger(clock)
        self._events = MemoryEventBus(clock)

    @property
    def clock(self) -> Clock:
        return self._state.clock

    @property
    def introspect(self) -> MemoryIntrospection:
        return self._introspect

    @property
    def leases(self) -> MemoryLeaseStore:
        return self._leases

    @property
    def backfills(self) -> MemoryBackfillLedger:
        return self._backfills

    @property
    def events(self) -> MemoryEventBus:
        """Events on this driver's clock: a frozen clock drives ``wait_for_event`` timeouts."""
        return self._events

    def __repr__(self) -> str:
        return f"MemoryJobDriver(rows={len(self._state.rows)})"

    async def enqueue(self, request: EnqueueRequest) -> Enqueued:
        return self._insert(request)

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        return [self._insert(request) for request in requests]

    def _insert(self, request: EnqueueRequest) -> Enqueued:
        state = self._state
        existing = state.rows.get(request.id)
        if existing is not None:
            return Enqueued(existing.id, existing.run_id, deduped=True)
        key = (request.name, request.tenant_id or "", request.idempotency_key)
        holder = state.live.get(key)
        if holder is not None:
            held = state.rows[holder]
            return Enqueued(held.id, held.run_id, deduped=True)
        now = state.now()
        row = Row(
            id=request.id,
            run_id=request.run_id,
            name=request.name,
            queue=request.queue,
            input=deepcopy(request.input),  # the row is its own, as a server's is
            idempotency_key=request.idempotency_key,
            tenant_id=request.tenant_id,
            state=JobState.DELAYED if request.run_at > now else JobState.READY,
            attempt=0,
            max_attempts=request.max_attempts,
            run_at=request.run_at,
            created_at=now,
            updated_at=now,
            enqueued_by=request.enqueued_by,
            traceparent=request.traceparent,
        )
        state.add(row)
        return Enqueued(row.id, row.run_id)

    async def claim(
        self,
        *,
        worker_id: str,
        slots: Mapping[str, int],
        visibility_timeout: float,
        drop_exhausted: Collection[str] = (),
    ) -> ClaimBatch:
        state = self._state
        now = state.now()
        lease_until = now + timedelta(seconds=visibility_timeout)
        claimed: list[ClaimedJob] = []
        exhausted: list[ExhaustedJob] = []
        for queue, free in slots.items():
            if free <= 0 or queue in state.paused_queues:
                continue
            # A lapsed row may sort ahead of the waiting ones (and, on its final attempt, be
            # buried without taking a slot): only the first free + len(lapsed) rows can matter.
            lapsed = state.lapsed_rows(queue, now)
            waiting = state.due_rows(queue, now, free + len(lapsed))
            due = sorted(waiting + lapsed, key=_claim_order)
            taken = 0
            for row in due:
                if taken == free:
                    break
                if row.state is JobState.RUNNING and row.attempt >= row.max_attempts:
                    exhausted.append(self._bury(row, drop=row.name in drop_exhausted))
                    continue
                row.attempt += 1
                state.move(row, JobState.RUNNING)
                row.worker_id, row.claim, row.lease_until = worker_id, new_id(), lease_until
                claimed.append(self._claimed(row))
                taken += 1
        return ClaimBatch(jobs=claimed, exhausted=exhausted)

    def _bury(self, row: Row, *, drop: bool) -> ExhaustedJob:
        """A lease that lapsed on the final attempt: settled here, never handed out again."""
        target = JobState.FAILED if drop else JobState.DEAD
        row.last_error = LEASE_LAPSED_FINAL_ATTEMPT
        self._state.move(row, target)
        self._state.count(row.name, "failed" if drop else "dead")
        return ExhaustedJob(
            id=row.id,
            run_id=row.run_id,
            name=row.name,
            queue=row.queue,
            input=deepcopy(row.input),
            tenant_id=row.tenant_id,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            state=target,
        )

    def _claimed(self, row: Row) -> ClaimedJob:
        assert row.worker_id is not None
        assert row.claim is not None
        assert row.lease_until is not None
        return ClaimedJob(
            id=row.id,
            run_id=row.run_id,
            name=row.name,
            queue=row.queue,
            input=deepcopy(row.input),
            idempotency_key=row.idempotency_key,
            tenant_id=row.tenant_id,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            run_at=row.run_at,
            created_at=row.created_at,
            lease_until=row.lease_until,
            claim=ClaimRef(row.worker_id, row.claim),
            steps={
                name: copied_step(step)
                for name, step in self._state.steps.get(row.run_id, {}).items()
            },
            enqueued_by=row.enqueued_by,
            traceparent=row.traceparent,
        )

    def _owned(self, job_id: str, ref: ClaimRef) -> Row | None:
        row = self._state.rows.get(job_id)
        if row is None or not row.owned_by(ref.worker_id, ref.claim):
            return None
        return row

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        row = self._owned(job_id, options.ref)
        if row is None:
            finished = self._state.rows.get(job_id)
            return finished is not None and finished.acked_under(options.claim)
        self._state.move(row, JobState.DONE)
        self._state.count(row.name, "done", options.duration_ms)
        return True

    async def nack(self, job_id: str, options: NackOptions) -> bool:
        row = self._owned(job_id, options.ref)
        if row is None:
            return False
        target = nack_state(options)
        if not options.count_attempt:
            row.attempt -= 1
        if options.error is not None:
            row.last_error = options.error
        if target in (JobState.READY, JobState.SUSPENDED):
            row.run_at = options.run_at or self._state.now()
        self._state.move(row, target)
        counter = nack_counter(options)
        if counter is not None:
            self._state.count(row.name, counter, options.duration_ms)
        return True

    async def heartbeat(self, job_id: str, ref: ClaimRef, visibility_timeout: float) -> bool:
        row = self._owned(job_id, ref)
        if row is None:
            return False
        row.lease_until = self._state.now() + timedelta(seconds=visibility_timeout)
        return True

    async def save_step(self, job_id: str, ref: ClaimRef, run_id: str, step: StepRecord) -> bool:
        if self._owned(job_id, ref) is None:
            return False
        # Stored and handed out as copies, as a server stores bytes: a body that changes the
        # value its step returned must not change what a later attempt replays.
        self._state.steps.setdefault(run_id, {})[step.name] = copied_step(step)
        return True

    async def stats(self, *, include_done: bool = True) -> list[QueueStats]:
        entries = self._stats()
        return entries if include_done else without_done(entries)

    def _stats(self) -> list[QueueStats]:
        now = self._state.now()
        counts: dict[str, dict[str, int]] = {}
        oldest: dict[str, datetime] = {}
        for row in self._state.rows.values():
            per_state = counts.setdefault(row.queue, {})
            per_state[row.state.value] = per_state.get(row.state.value, 0) + 1
            if row.state in (JobState.READY, JobState.DELAYED) and row.run_at <= now:
                held = oldest.get(row.queue)
                if held is None or row.run_at < held:
                    oldest[row.queue] = row.run_at
        return [
            QueueStats.from_counts(queue, per_state, oldest.get(queue))
            for queue, per_state in sorted(counts.items())
        ]

    async def close(self) -> None:
        return None


def memory_job_driver(*, clock: Clock = SYSTEM_CLOCK) -> MemoryJobDriver:
    """A driver over this process's heap: nothing survives the process."""
    return MemoryJobDriver(clock=clock)
