"""Operator helpers over ``driver.introspect``, shared by the ``ujobs`` CLI and any dashboard.

Each answers plain dataclasses (``to_jsonable`` turns them into ``--json`` output). A driver with no
``introspect`` answers ``X_NOT_IMPLEMENTED``, never a silent empty list.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from enum import Enum
from typing import Any

from .constants import DEFAULT_JOB_PAGE
from .errors import (
    CancelUnsupportedError,
    IntrospectionUnsupportedError,
    JobNotCancellableError,
)
from .job import JobDescriptor
from .model import JobFilter, JobPage, JobRow, JobState, JsonValue, QueueStats, StepRecord
from .protocol import JobDriver, JobIntrospection
from .refusals import job_not_found
from .registry import registered_jobs, registered_tasks
from .task import TaskDescriptor

__all__ = [
    "JobInspection",
    "Manifest",
    "QueueInspection",
    "cancel_job",
    "inspect_dead_letters",
    "inspect_job",
    "inspect_manifest",
    "inspect_queues",
    "introspection_of",
    "promote_job",
    "redact",
    "remove_job",
    "retry_job",
    "to_jsonable",
]

_SECRET = re.compile(r"pass(word)?|secret|token|api[_-]?key|authorization|credential|private", re.I)
REDACTED = "[redacted]"


def introspection_of(driver: JobDriver) -> JobIntrospection:
    introspect = driver.introspect
    if introspect is None:
        raise IntrospectionUnsupportedError(
            f"{type(driver).__name__} offers no operator surface (introspect is None); "
            "use a driver that does (postgres, redis, memory)"
        )
    return introspect


def redact(value: JsonValue) -> JsonValue:
    """``value`` with every field whose name looks like a secret replaced, at any depth."""
    if isinstance(value, Mapping):
        return {
            key: REDACTED if _SECRET.search(str(key)) else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value


@dataclass(frozen=True, slots=True)
class QueueInspection:
    stats: QueueStats
    paused: bool


@dataclass(frozen=True, slots=True)
class JobInspection:
    """One job for an operator: the row (input redacted), its step trace and its last failure."""

    row: JobRow
    steps: Sequence[StepRecord]


@dataclass(frozen=True, slots=True)
class Manifest:
    jobs: Sequence[JobDescriptor]
    tasks: Sequence[TaskDescriptor]


async def inspect_queues(driver: JobDriver) -> list[QueueInspection]:
    paused = set(await introspection_of(driver).paused_queues())
    stats = {s.queue: s for s in await driver.stats()}
    for queue in paused - stats.keys():
        stats[queue] = QueueStats(queue=queue)
    return [QueueInspection(stats[q], q in paused) for q in sorted(stats)]


async def inspect_job(driver: JobDriver, job_id: str) -> JobInspection:
    detail = await introspection_of(driver).get(job_id)
    if detail is None:
        raise job_not_found(job_id)
    row = dataclasses.replace(detail.row, input=redact(detail.row.input))
    steps = [dataclasses.replace(s, output=redact(s.output)) for s in detail.steps]
    return JobInspection(row=row, steps=steps)


async def inspect_dead_letters(
    driver: JobDriver,
    *,
    queue: str | None = None,
    name: str | None = None,
    limit: int = DEFAULT_JOB_PAGE,
    after: str | None = None,
) -> JobPage:
    return await introspection_of(driver).list(
        JobFilter(queue=queue, name=name, state=JobState.DEAD, limit=limit, after=after)
    )


async def retry_job(driver: JobDriver, job_id: str, *, from_step: str | None = None) -> JobRow:
    """Requeue a finished job; ``from_step`` drops that step and every later one first."""
    return await introspection_of(driver).requeue(job_id, from_step=from_step)


async def cancel_job(driver: JobDriver, job_id: str, reason: str | None = None) -> JobRow:
    """Cancel a live job: a queued one at once, a running one at its next heartbeat."""
    if driver.introspect is None:
        raise CancelUnsupportedError(
            f"{type(driver).__name__} offers no operator surface, so nothing can cancel through it"
        )
    row = await driver.introspect.cancel(job_id, reason)
    if row is None:
        raise JobNotCancellableError(
            f"job {job_id!r} is not live (done, failed, dead, cancelled, or unknown); "
            "check it with `ujobs jobs show`",
            meta={"id": job_id},
        )
    return row


async def remove_job(driver: JobDriver, job_id: str) -> bool:
    """Delete one job and its steps; False when no queue holds ``job_id``. A running job is
    ``X_JOB_NOT_REMOVABLE``."""
    return await introspection_of(driver).remove(job_id)


async def promote_job(driver: JobDriver, job_id: str) -> JobRow:
    return await introspection_of(driver).promote(job_id)


def inspect_manifest() -> Manifest:
    """What this process declared: every registered job and task."""
    return Manifest(
        jobs=[handle.describe() for handle in registered_jobs()],
        tasks=[handle.describe() for handle in registered_tasks()],
    )


def to_jsonable(value: Any) -> JsonValue:
    """Dataclasses, datetimes and enums as JSON values, for ``--json`` output."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    return value
