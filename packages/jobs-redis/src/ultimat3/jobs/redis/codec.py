"""How rows, steps and times are written into Redis and read back.

Times are integer microseconds since the epoch, kept as strings: exact (a float of seconds is
not), and a sorted-set score orders them exactly below 2^53. JSON values (inputs, step outputs,
progress) are written by Python and never decoded by a script, so they round-trip bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring_ascii
from typing import Any

from ultimat3.jobs.core.jsonvalue import json_text
from ultimat3.jobs.core.model import (
    ClaimedJob,
    ClaimRef,
    Enqueued,
    EnqueueRequest,
    ExhaustedJob,
    JobRow,
    JobState,
    Progress,
    StepRecord,
    stored_step_kind,
)

__all__ = [
    "decode_steps",
    "encode_progress",
    "encode_step",
    "fields",
    "from_us",
    "live_key",
    "optional",
    "read_claimed",
    "read_claimed_rows",
    "read_enqueued",
    "read_exhausted",
    "read_optional",
    "read_row",
    "request_args",
    "to_us",
]

_json_string = encode_basestring_ascii
"""A str as JSON text, as ``json_text`` writes one (ASCII, with escapes)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_us(at: datetime) -> str:
    return str((at - _EPOCH) // _MICROSECOND)


def from_us(value: str | int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(value))


def optional(value: str | None) -> str:
    """An optional script argument: "" for None, "=" and the value otherwise."""
    return "" if value is None else "=" + value


def read_optional(value: str) -> str | None:
    return None if value == "" else value[1:]


def live_key(name: str, tenant_id: str | None, idempotency_key: str) -> str:
    """The field the live-key index is keyed by: the None tenant is the '' tenant. It is the
    JSON text of ``[name, tenant, key]`` (what ``json_text`` writes), spelled out with the JSON
    encoder's own string escape: a tenth of the cost, on every enqueue."""
    return f"[{_json_string(name)},{_json_string(tenant_id or '')},{_json_string(idempotency_key)}]"


def request_args(requests: Sequence[EnqueueRequest]) -> list[str]:
    """The script arguments of rows to insert: ``ROW_ARGS`` fields each (``insert_row`` in the
    prelude)."""
    args: list[str] = []
    for request in requests:
        args += (
            request.id,
            request.run_id,
            request.name,
            request.queue,
            json_text(request.input),
            request.idempotency_key,
            optional(request.tenant_id),
            str(request.max_attempts),
            to_us(request.run_at),
            optional(request.enqueued_by),
            optional(request.traceparent),
            live_key(request.name, request.tenant_id, request.idempotency_key),
        )
    return args


def read_enqueued(answers: Sequence[Sequence[Any]]) -> list[Enqueued]:
    return [Enqueued(job_id, run_id, bool(deduped)) for job_id, run_id, deduped in answers]


def fields(flat: Sequence[str]) -> dict[str, str]:
    """A hash as HGETALL returns it inside a script: [field, value, field, value, ...]."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def encode_step(step: StepRecord) -> str:
    """``"<seq> <completed 1|0> <kind> <output json>"``; a step without a kind keeps the form
    steps were stored in before they carried one, ``"<seq> <completed 1|0> <output json>"``."""
    kind = "" if step.kind is None else f"{step.kind} "
    return f"{step.seq} {1 if step.completed else 0} {kind}{json_text(step.output)}"


def decode_steps(flat: Sequence[str]) -> dict[str, StepRecord]:
    steps: dict[str, StepRecord] = {}
    for name, stored in fields(flat).items():
        seq, completed, rest = stored.split(" ", 2)
        # No JSON text begins with the word run, sleep or wait: a rest that does not open with a
        # kind is a step stored before steps carried theirs, and all of it is the output.
        word, _, output = rest.partition(" ")
        kind = stored_step_kind(word)
        steps[name] = StepRecord(
            name=name,
            seq=int(seq),
            output=json.loads(rest if kind is None else output),
            completed=completed == "1",
            kind=kind,
        )
    return steps


def _progress(stored: str | None) -> Progress | None:
    if stored is None:
        return None
    done, total, note = json.loads(stored)
    return Progress(done=done, total=total, note=note)


def encode_progress(progress: Progress) -> str:
    return json_text([progress.done, progress.total, progress.note])


def _at(row: Mapping[str, str], field: str) -> datetime | None:
    value = row.get(field)
    return None if value is None else from_us(value)


def read_row(row: Mapping[str, str]) -> JobRow:
    """A row as the operator sees it; the claim fields a row keeps after it stopped running
    (the scripts leave them, see ``move``) are read only while it runs. ``stops`` is set only on
    a row cancelled while it ran, and cleared when it is queued again."""
    state = JobState(row["state"])
    running = state is JobState.RUNNING
    return JobRow(
        id=row["id"],
        run_id=row["run_id"],
        name=row["name"],
        queue=row["queue"],
        state=state,
        input=json.loads(row["input"]),
        idempotency_key=row["key"],
        tenant_id=row.get("tenant"),
        attempt=int(row["attempt"]),
        max_attempts=int(row["max"]),
        run_at=from_us(row["run_at"]),
        created_at=from_us(row["created"]),
        updated_at=from_us(row["updated"]),
        finished_at=_at(row, "finished"),
        last_error=row.get("error"),
        progress=_progress(row.get("progress")),
        worker_id=row.get("worker") if running else None,
        # A row cancelled while it ran shows when that run stops at the latest (cancel.lua).
        lease_until=_at(row, "lease" if running else "stops"),
        enqueued_by=row.get("by"),
        traceparent=row.get("trace"),
    )


def read_claimed(values: Sequence[Any], steps: Sequence[str]) -> ClaimedJob:
    """A claimed row from the claim script's ``CLAIMED_FIELDS`` values, in that order (only
    tenant, enqueued_by and traceparent may be None)."""
    (job_id, run_id, name, queue, payload, key, tenant, attempt, max_attempts, run_at) = values[:10]
    (created, lease, worker, claim, enqueued_by, traceparent) = values[10:]
    return ClaimedJob(
        id=job_id,
        run_id=run_id,
        name=name,
        queue=queue,
        input=json.loads(payload),
        idempotency_key=key,
        tenant_id=tenant,
        attempt=int(attempt),
        max_attempts=int(max_attempts),
        run_at=from_us(run_at),
        created_at=from_us(created),
        lease_until=from_us(lease),
        claim=ClaimRef(worker, claim),
        steps=decode_steps(steps) if steps else {},
        enqueued_by=enqueued_by,
        traceparent=traceparent,
    )


def read_claimed_rows(rows: Sequence[Sequence[Any]]) -> list[ClaimedJob]:
    """The claim script's taken rows, each a pair of its ``CLAIMED_FIELDS`` values and steps."""
    return [read_claimed(values, steps) for values, steps in rows]


def read_exhausted(values: Sequence[Any]) -> ExhaustedJob:
    """A buried row from the claim script's ``EXHAUSTED_FIELDS`` values, in that order (only
    tenant may be None)."""
    job_id, run_id, name, queue, payload, tenant, attempt, max_attempts, state = values
    return ExhaustedJob(
        id=job_id,
        run_id=run_id,
        name=name,
        queue=queue,
        input=json.loads(payload),
        tenant_id=tenant,
        attempt=int(attempt),
        max_attempts=int(max_attempts),
        state=JobState(state),
    )
