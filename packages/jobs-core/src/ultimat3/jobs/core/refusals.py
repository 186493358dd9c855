"""The operator surface's refusals, worded once for every driver.

A driver decides WHEN an operator's request is refused, in its own statement or script; these
decide what the operator reads, so ``ujobs jobs requeue`` answers the same on memory, Postgres,
Redis and a third party's driver. The bulk checks need no storage at all, so they run before a
driver touches it.
"""

from __future__ import annotations

from .errors import (
    JobDuplicateError,
    JobNotFoundError,
    JobNotPromotableError,
    JobNotRemovableError,
    JobNotRequeueableError,
)
from .model import PROMOTABLE_STATES, REQUEUEABLE_STATES, BulkFilter, JobState

__all__ = [
    "cancel_note",
    "check_promote_many",
    "check_remove_many",
    "check_requeue_many",
    "job_not_found",
    "key_held",
    "not_promotable",
    "not_requeueable",
    "running_not_removable",
    "step_not_found",
]


def job_not_found(job_id: str) -> JobNotFoundError:
    return JobNotFoundError(
        f"no job {job_id!r} in the queue; list them with `ujobs jobs list --json`",
        meta={"id": job_id},
    )


def step_not_found(job_id: str, step: str | None) -> JobNotFoundError:
    return JobNotFoundError(f"job {job_id} has no step {step!r}", meta={"id": job_id, "step": step})


def running_not_removable(job_id: str) -> JobNotRemovableError:
    return JobNotRemovableError(
        f"job {job_id} is running; cancel it first (`ujobs jobs cancel {job_id}`)",
        meta={"id": job_id},
    )


def not_requeueable(job_id: str, state: str) -> JobNotRequeueableError:
    return JobNotRequeueableError(
        f"job {job_id} is {state}; only a finished job (done, failed, dead, cancelled) can be "
        "requeued",
        meta={"id": job_id, "state": state},
    )


def key_held(job_id: str, holder: str | None) -> JobDuplicateError:
    """A requeue refused because a live row holds the job's idempotency key (``holder``: that
    row's id, None when the driver only learnt that one exists)."""
    return JobDuplicateError(
        f"a live job ({holder or 'another row'}) holds this job's idempotency key; requeueing "
        "would run the same work twice",
        meta={"id": job_id, "existing_id": holder},
    )


def not_promotable(job_id: str, state: str) -> JobNotPromotableError:
    return JobNotPromotableError(
        f"job {job_id} is not waiting on its run time (state {state})",
        meta={"id": job_id, "state": state},
    )


def cancel_note(reason: str | None) -> str:
    """The ``last_error`` a cancelled row keeps."""
    return f"cancelled: {reason}" if reason else "cancelled"


def check_requeue_many(filter: BulkFilter) -> None:
    state = filter.state
    if state not in REQUEUEABLE_STATES:
        raise JobNotRequeueableError(
            f"requeue_many moves finished rows; {state.value} is live",
            meta={"state": state.value},
        )


def check_remove_many(filter: BulkFilter) -> None:
    if filter.state is JobState.RUNNING:
        raise JobNotRemovableError(
            "running rows cannot be removed; cancel them first", meta={"state": "running"}
        )


def check_promote_many(filter: BulkFilter) -> None:
    state = filter.state
    if state not in PROMOTABLE_STATES:
        raise JobNotPromotableError(
            f"promote_many moves delayed or ready rows, not {state.value}",
            meta={"state": state.value},
        )
