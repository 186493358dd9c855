"""A pure reference model of the driver protocol, for the stateful conformance test.

It is a second, independent statement of the rules in ``ultimat3.jobs.core.protocol``: plain
synchronous code over dicts, told the time with every call. The stateful test runs the same
operations on a driver and on this model and fails on the first answer or state that differs.

Where the protocol leaves a driver a choice, the model says exactly what is allowed instead of
picking one answer: a claim must bury every lapsed final-attempt row it passes on its way to the
rows it hands out, and may bury the ones past the last row it handed out (``ClaimPlan``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ultimat3.jobs.core import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    LIVE_STATES,
    AckOptions,
    ClaimedJob,
    ClaimRef,
    Enqueued,
    EnqueueRequest,
    JobState,
    NackOptions,
    QueueStats,
    StepRecord,
    nack_counter,
    nack_state,
)
from ultimat3.jobs.core.model import CounterKind, CounterTotals, ExhaustedJob, JobRow

__all__ = ["ClaimPlan", "ModelRow", "ReferenceQueue", "live_key"]

_DUE_STATES = (JobState.READY, JobState.DELAYED, JobState.SUSPENDED)


def live_key(request: EnqueueRequest) -> tuple[str, str, str]:
    """What one live row holds: a None tenant is a tenant of its own (spelled '')."""
    return (request.name, request.tenant_id or "", request.idempotency_key)


@dataclass
class ModelRow:
    request: EnqueueRequest
    state: JobState
    created_at: datetime
    run_at: datetime
    attempt: int = 0
    finished_at: datetime | None = None
    last_error: str | None = None
    worker_id: str | None = None
    claim: str | None = None
    lease_until: datetime | None = None
    acked_claim: str | None = None
    """The claim whose ack finished the row: an ack sent again under it answers True."""

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def key(self) -> tuple[str, str, str]:
        return live_key(self.request)

    @property
    def exhausted(self) -> bool:
        """Running on its final attempt: a lapse buries it instead of handing it out."""
        return self.attempt >= self.request.max_attempts

    def lapsed(self, now: datetime) -> bool:
        return (
            self.state is JobState.RUNNING
            and self.lease_until is not None
            and self.lease_until <= now
        )

    def due(self, now: datetime) -> bool:
        return (self.state in _DUE_STATES and self.run_at <= now) or self.lapsed(now)

    def held_by(self, ref: ClaimRef) -> bool:
        return (
            self.state is JobState.RUNNING
            and self.worker_id == ref.worker_id
            and self.claim == ref.claim
        )


@dataclass(frozen=True)
class ClaimPlan:
    """What one claim must do: hand out exactly ``claimed`` (per queue, in order), bury every
    row in ``must_bury`` and may bury any row in ``may_bury`` besides."""

    claimed: Mapping[str, Sequence[str]]
    must_bury: frozenset[str]
    may_bury: frozenset[str]


@dataclass
class ReferenceQueue:
    rows: dict[str, ModelRow] = field(default_factory=dict)
    steps: dict[str, dict[str, StepRecord]] = field(default_factory=dict)
    totals: dict[str, CounterTotals] = field(default_factory=dict)
    paused_queues: set[str] = field(default_factory=set)

    # -- enqueue --------------------------------------------------------------------------------

    def holder(self, key: tuple[str, str, str]) -> ModelRow | None:
        for row in self.rows.values():
            if row.state in LIVE_STATES and row.key == key:
                return row
        return None

    def enqueue(self, request: EnqueueRequest, now: datetime) -> Enqueued:
        existing = self.rows.get(request.id)
        if existing is not None:
            return Enqueued(existing.id, existing.request.run_id, deduped=True)
        holder = self.holder(live_key(request))
        if holder is not None:
            return Enqueued(holder.id, holder.request.run_id, deduped=True)
        self.rows[request.id] = ModelRow(
            request=request,
            state=JobState.DELAYED if request.run_at > now else JobState.READY,
            created_at=now,
            run_at=request.run_at,
        )
        return Enqueued(request.id, request.run_id)

    # -- claim ----------------------------------------------------------------------------------

    def plan_claim(self, slots: Mapping[str, int], now: datetime) -> ClaimPlan:
        claimed: dict[str, list[str]] = {}
        must: set[str] = set()
        may: set[str] = set()
        for queue, free in slots.items():
            if free <= 0 or queue in self.paused_queues:
                continue
            due = sorted(
                (row for row in self.rows.values() if row.request.queue == queue and row.due(now)),
                key=lambda row: (row.run_at, row.id),
            )
            taken: list[str] = []
            for position, row in enumerate(due):
                if len(taken) == free:
                    may.update(r.id for r in due[position:] if r.lapsed(now) and r.exhausted)
                    break
                if row.lapsed(now) and row.exhausted:
                    must.add(row.id)
                else:
                    taken.append(row.id)
            claimed[queue] = taken
        return ClaimPlan(claimed, frozenset(must), frozenset(may))

    def commit_claim(
        self,
        plan: ClaimPlan,
        tokens: Mapping[str, ClaimRef],
        buried: Collection[str],
        *,
        lease_until: datetime,
        drop_exhausted: Collection[str],
        now: datetime,
    ) -> None:
        """Apply a claim the driver answered in agreement with ``plan``: ``tokens`` are the
        claim refs it minted, ``buried`` the rows it reported exhausted."""
        for queue_ids in plan.claimed.values():
            for job_id in queue_ids:
                row = self.rows[job_id]
                row.attempt += 1
                row.state = JobState.RUNNING
                ref = tokens[job_id]
                row.worker_id, row.claim, row.lease_until = ref.worker_id, ref.claim, lease_until
        for job_id in buried:
            row = self.rows[job_id]
            dropped = row.request.name in drop_exhausted
            row.last_error = LEASE_LAPSED_FINAL_ATTEMPT
            self._finish(row, JobState.FAILED if dropped else JobState.DEAD, now)
            self._count(row.request.name, "failed" if dropped else "dead")

    def claimed_job(self, job_id: str) -> ClaimedJob:
        """The job a claim should have handed out for ``job_id`` (after ``commit_claim``)."""
        row = self.rows[job_id]
        request = row.request
        assert row.worker_id is not None
        assert row.claim is not None
        assert row.lease_until is not None
        return ClaimedJob(
            id=request.id,
            run_id=request.run_id,
            name=request.name,
            queue=request.queue,
            input=request.input,
            idempotency_key=request.idempotency_key,
            tenant_id=request.tenant_id,
            attempt=row.attempt,
            max_attempts=request.max_attempts,
            run_at=row.run_at,
            created_at=row.created_at,
            lease_until=row.lease_until,
            claim=ClaimRef(row.worker_id, row.claim),
            steps=dict(self.steps.get(request.run_id, {})),
            enqueued_by=request.enqueued_by,
            traceparent=request.traceparent,
        )

    def exhausted_job(self, job_id: str) -> ExhaustedJob:
        row = self.rows[job_id]
        request = row.request
        return ExhaustedJob(
            id=request.id,
            run_id=request.run_id,
            name=request.name,
            queue=request.queue,
            input=request.input,
            tenant_id=request.tenant_id,
            attempt=row.attempt,
            max_attempts=request.max_attempts,
            state=row.state,
        )

    # -- writes under a claim -------------------------------------------------------------------

    def _held(self, job_id: str, ref: ClaimRef) -> ModelRow | None:
        row = self.rows.get(job_id)
        return row if row is not None and row.held_by(ref) else None

    def ack(self, job_id: str, options: AckOptions, now: datetime) -> bool:
        row = self._held(job_id, options.ref)
        if row is None:
            done = self.rows.get(job_id)  # a repeat of the ack that finished it answers True
            return (
                done is not None
                and done.state is JobState.DONE
                and done.acked_claim == options.claim
            )
        self._finish(row, JobState.DONE, now)
        row.acked_claim = options.claim
        self._count(row.request.name, "done", options.duration_ms)
        return True

    def nack(self, job_id: str, options: NackOptions, now: datetime) -> bool:
        row = self._held(job_id, options.ref)
        if row is None:
            return False
        target = nack_state(options)
        if not options.count_attempt:
            row.attempt -= 1
        if options.error is not None:
            row.last_error = options.error
        if target in (JobState.READY, JobState.SUSPENDED):
            row.run_at = options.run_at or now
            row.state = target
            row.worker_id = row.claim = row.lease_until = None
        else:
            self._finish(row, target, now)
        counter = nack_counter(options)
        if counter is not None:
            self._count(row.request.name, counter, options.duration_ms)
        return True

    def heartbeat(
        self, job_id: str, ref: ClaimRef, visibility_timeout: float, now: datetime
    ) -> bool:
        row = self._held(job_id, ref)
        if row is None:
            return False
        row.lease_until = now + timedelta(seconds=visibility_timeout)
        return True

    def save_step(self, job_id: str, ref: ClaimRef, run_id: str, step: StepRecord) -> bool:
        if self._held(job_id, ref) is None:
            return False
        self.steps.setdefault(run_id, {})[step.name] = step
        return True

    def _finish(self, row: ModelRow, state: JobState, now: datetime) -> None:
        row.state = state
        row.finished_at = now
        row.worker_id = row.claim = row.lease_until = None

    def _count(self, name: str, kind: CounterKind, duration_ms: int | None = None) -> None:
        held = self.totals.get(name) or CounterTotals(name=name)
        self.totals[name] = held.added(kind, duration_ms)

    # -- what a reader sees ---------------------------------------------------------------------

    def stats(self, now: datetime) -> list[QueueStats]:
        counts: dict[str, dict[str, int]] = {}
        oldest: dict[str, datetime] = {}
        for row in self.rows.values():
            queue = row.request.queue
            per_state = counts.setdefault(queue, {})
            per_state[row.state.value] = per_state.get(row.state.value, 0) + 1
            waiting = row.state in (JobState.READY, JobState.DELAYED) and row.run_at <= now
            if waiting and (queue not in oldest or row.run_at < oldest[queue]):
                oldest[queue] = row.run_at
        return [
            QueueStats.from_counts(queue, per_state, oldest.get(queue))
            for queue, per_state in sorted(counts.items())
        ]

    def counter_totals(self) -> list[CounterTotals]:
        return sorted(self.totals.values(), key=lambda totals: totals.name)

    def public_rows(self) -> list[JobRow]:
        """Every row as the operator surface lists it, newest first; ``updated_at`` and
        ``progress`` are not modelled and carry placeholders the comparison ignores."""
        rows = sorted(self.rows.values(), key=lambda row: (row.created_at, row.id), reverse=True)
        return [self._public(row) for row in rows]

    def _public(self, row: ModelRow) -> JobRow:
        request = row.request
        return JobRow(
            id=request.id,
            run_id=request.run_id,
            name=request.name,
            queue=request.queue,
            state=row.state,
            input=request.input,
            idempotency_key=request.idempotency_key,
            tenant_id=request.tenant_id,
            attempt=row.attempt,
            max_attempts=request.max_attempts,
            run_at=row.run_at,
            created_at=row.created_at,
            updated_at=row.created_at,
            finished_at=row.finished_at,
            last_error=row.last_error,
            worker_id=row.worker_id,
            lease_until=row.lease_until,
            enqueued_by=request.enqueued_by,
            traceparent=request.traceparent,
        )
