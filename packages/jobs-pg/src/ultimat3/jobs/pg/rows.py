"""Rows the statements answer, as the core's records; and values as the statements take them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ultimat3.jobs.core.constants import WAKE_DUE_WITHIN_S, WAKE_SLOT_S
from ultimat3.jobs.core.jsonvalue import json_text
from ultimat3.jobs.core.model import (
    BackfillRow,
    ClaimedJob,
    ClaimRef,
    Enqueued,
    EnqueueRequest,
    ExhaustedJob,
    JobRow,
    JobState,
    JsonValue,
    Progress,
    StepRecord,
    stored_step_kind,
)

__all__ = [
    "announce_params",
    "backfill_row",
    "claimed_job",
    "claimed_jobs",
    "copy_rows",
    "enqueue_answers",
    "enqueue_one_params",
    "enqueue_params",
    "enqueue_rows",
    "exhausted_job",
    "job_row",
    "live_key",
    "progress_json",
    "request_params",
    "step_record",
    "utc",
]


def utc(value: datetime) -> datetime:
    """A ``timestamptz`` as read (in the session's zone) as the same instant in UTC."""
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def utc_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


def enqueue_rows(requests: Sequence[EnqueueRequest]) -> str:
    """The ``rows`` document SQL_ENQUEUE takes: one array per request, the input as its own JSON
    text (so it is stored byte for byte)."""
    return json_text(
        [
            (
                r.id,
                r.run_id,
                r.name,
                r.queue,
                json_text(r.input),
                r.idempotency_key,
                r.tenant_id,
                r.max_attempts,
                r.run_at.isoformat(),
                r.enqueued_by,
                r.traceparent,
            )
            for r in requests
        ]
    )


def wake_slot_start(now: datetime) -> datetime:
    """The start of the WAKE_SLOT_S slot ``now`` falls in (slots count from the epoch)."""
    return datetime.fromtimestamp(now.timestamp() // WAKE_SLOT_S * WAKE_SLOT_S, UTC)


def enqueue_params(requests: Sequence[EnqueueRequest], now: datetime) -> dict[str, Any]:
    """What SQL_ENQUEUE (and the scheduler's fire, which inserts by its rules) takes for
    ``requests`` enqueued at ``now``: the ``rows`` document and the wake's parameters."""
    return {"rows": enqueue_rows(requests), **wake_params(now)}


def copy_rows(requests: Sequence[EnqueueRequest], now: datetime) -> Iterable[tuple[Any, ...]]:
    """The rows SQL_ENQUEUE_COPY writes for ``requests`` enqueued at ``now``: what SQL_ENQUEUE
    would insert for them, in the order it would (by name, tenant, key; str order is the byte
    order of the "C" collation)."""
    return _CopyRows(sorted(requests, key=live_key), now)


def live_key(request: EnqueueRequest) -> tuple[str, str, str]:
    """The key a live row holds (name, tenant with None as '', idempotency key), as the partial
    unique index reads it; sorted, the order batches insert in."""
    return request.name, request.tenant_id or "", request.idempotency_key


class _CopyRows(Iterable[tuple[Any, ...]]):
    """Each row built as the COPY takes it, so the server inserts the first rows while the
    client builds the rest (about a tenth off a batch of 1,000, measured); iterated again (a
    COPY run again after a deadlock), it builds them again."""

    def __init__(self, requests: list[EnqueueRequest], now: datetime) -> None:
        self._requests, self._now = requests, now

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        now = self._now
        for r in self._requests:
            yield (
                r.id,
                r.run_id,
                r.name,
                r.queue,
                "delayed" if r.run_at > now else "ready",
                0,
                r.max_attempts,
                r.run_at,
                now,
                now,
                r.idempotency_key,
                r.tenant_id,
                json_text(r.input),
                r.enqueued_by,
                r.traceparent,
            )


def announce_params(requests: Sequence[EnqueueRequest], now: datetime) -> dict[str, Any]:
    """What SQL_ENQUEUE_ANNOUNCE takes before ``requests`` are copied at ``now``: the queues of
    those due within WAKE_DUE_WITHIN_S."""
    wake = wake_params(now)
    due_by = wake.pop("due_by")
    return {"queues": sorted({r.queue for r in requests if r.run_at <= due_by}), **wake}


def enqueue_one_params(request: EnqueueRequest, now: datetime) -> dict[str, Any]:
    """What SQL_ENQUEUE_ONE takes for ``request`` enqueued at ``now``."""
    return {**request_params(request), **wake_params(now)}


def request_params(request: EnqueueRequest) -> dict[str, Any]:
    """The request's fields as the statements that take one request name them (SQL_ENQUEUE_ONE,
    SQL_OUTBOX_STAGE): the input as its JSON text."""
    return {
        "id": request.id,
        "run_id": request.run_id,
        "name": request.name,
        "queue": request.queue,
        "input": json_text(request.input),
        "idempotency_key": request.idempotency_key,
        "tenant_id": request.tenant_id,
        "max_attempts": request.max_attempts,
        "run_at": request.run_at,
        "enqueued_by": request.enqueued_by,
        "traceparent": request.traceparent,
    }


def wake_params(now: datetime) -> dict[str, Any]:
    """The enqueue's wake parameters at ``now``: ``now``, the start of the wake slot it falls in
    and ``due_by``, the latest run time whose row is announced."""
    return {
        "now": now,
        "slot_start": wake_slot_start(now),
        "due_by": now + timedelta(seconds=WAKE_DUE_WITHIN_S),
    }


def enqueue_answers(
    requests: Sequence[EnqueueRequest],
    refused: Iterable[Sequence[Any]],
) -> list[Enqueued | None]:
    """Per request, its answer from the ``(ord, id, run_id)`` rows an enqueue refused (ord counts
    from 1): a request not refused inserted its own row; a refused one deduped onto the row
    named — or is None when that row was not in the statement's snapshot (ask again)."""
    answers: list[Enqueued | None] = [Enqueued(r.id, r.run_id) for r in requests]
    for ord_, job_id, run_id in refused:
        answers[ord_ - 1] = None if job_id is None else Enqueued(job_id, run_id, deduped=True)
    return answers


def progress_json(progress: Progress) -> str:
    return json_text({"done": progress.done, "total": progress.total, "note": progress.note})


def _progress(raw: Mapping[str, Any] | None) -> Progress | None:
    if raw is None:
        return None
    return Progress(done=raw["done"], total=raw.get("total"), note=raw.get("note"))


def step_record(
    name: str, seq: int, output: JsonValue, completed: bool, kind: str | None
) -> StepRecord:
    """A row of x_job_steps; ``kind`` is NULL on steps stored before the column existed."""
    return StepRecord(
        name=name, seq=seq, output=output, completed=completed, kind=stored_step_kind(kind)
    )


loads = json.loads
"""The claim answers its JSON columns as text: decoding a ``str`` skips the byte-encoding
detection ``json.loads`` runs on the raw bytes a ``json`` column would hand over."""


def claimed_job(row: Sequence[Any], *, claim: ClaimRef, lease_until: datetime) -> ClaimedJob:
    """A taken row of SQL_CLAIM (columns in the statement's order; input and steps as JSON
    text), under ``claim``: the rows of one claim share one (the row's token is ``claim``'s)."""
    (
        _state,
        job_id,
        run_id,
        name,
        queue,
        input,
        idempotency_key,
        tenant_id,
        attempt,
        max_attempts,
        run_at,
        created_at,
        enqueued_by,
        traceparent,
        _claim,
        steps,
    ) = row
    return ClaimedJob(
        id=job_id,
        run_id=run_id,
        name=name,
        queue=queue,
        input=loads(input),
        idempotency_key=idempotency_key,
        tenant_id=tenant_id,
        attempt=attempt,
        max_attempts=max_attempts,
        run_at=utc(run_at),
        created_at=utc(created_at),
        lease_until=lease_until,
        claim=claim,
        steps={} if steps is None else {step[0]: step_record(*step) for step in loads(steps)},
        enqueued_by=enqueued_by,
        traceparent=traceparent,
    )


def claimed_jobs(
    rows: Sequence[Sequence[Any]], *, worker_id: str, lease_until: datetime
) -> list[ClaimedJob]:
    """The taken rows of SQL_CLAIM (or SQL_CLAIM_HELD), each under the ``ClaimRef`` of its own
    claim token: one shared by the whole batch, as a batch usually has one token."""
    jobs = []
    ref: ClaimRef | None = None
    for row in rows:
        if ref is None or ref.claim != row[14]:
            ref = ClaimRef(worker_id, row[14])
        jobs.append(claimed_job(row, claim=ref, lease_until=lease_until))
    return jobs


def exhausted_job(row: Sequence[Any]) -> ExhaustedJob:
    """A buried row of SQL_CLAIM."""
    state, job_id, run_id, name, queue, input, _, tenant_id, attempt, max_attempts = row[:10]
    return ExhaustedJob(
        id=job_id,
        run_id=run_id,
        name=name,
        queue=queue,
        input=loads(input),
        tenant_id=tenant_id,
        attempt=attempt,
        max_attempts=max_attempts,
        state=JobState(state),
    )


def job_row(row: Mapping[str, Any]) -> JobRow:
    """A job as the operator statements answer it (by column name)."""
    return JobRow(
        id=row["id"],
        run_id=row["run_id"],
        name=row["name"],
        queue=row["queue"],
        state=JobState(row["state"]),
        input=row["input"],
        idempotency_key=row["idempotency_key"],
        tenant_id=row["tenant_id"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        run_at=utc(row["run_at"]),
        created_at=utc(row["created_at"]),
        updated_at=utc(row["updated_at"]),
        finished_at=utc_or_none(row["finished_at"]),
        last_error=row["last_error"],
        progress=_progress(row["progress"]),
        worker_id=row["worker_id"],
        lease_until=utc_or_none(row["lease_until"]),
        enqueued_by=row["enqueued_by"],
        traceparent=row["traceparent"],
    )


def backfill_row(row: Sequence[Any]) -> BackfillRow:
    """A row of the backfill statements (name, run_id, checksum, status, app_version, rows,
    cursor, started_at, completed_at, error)."""
    name, run_id, checksum, status, app_version, rows, cursor, started, completed, error = row
    return BackfillRow(
        name=name,
        run_id=run_id,
        checksum=checksum,
        status=status,
        started_at=utc(started),
        rows=rows,
        cursor=cursor,
        app_version=app_version,
        completed_at=utc_or_none(completed),
        error=error,
    )
