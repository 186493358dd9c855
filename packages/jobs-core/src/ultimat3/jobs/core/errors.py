"""One exception hierarchy with a stable code per failure.

Inside one process, match with ``isinstance``; across a wire or a job boundary the class is gone and
only ``code`` survives, so logs, rows and clients match on the code. Every message says what
happened and, where there is one, what to do about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "ActionJobUnbridgedError",
    "CancelUnsupportedError",
    "ClaimQueuesEmptyError",
    "ConcurrencyUnenforceableError",
    "CronUnavailableError",
    "DriverUnavailableError",
    "EventWaitTimeoutError",
    "IdempotencyRequiredError",
    "IntrospectionUnsupportedError",
    "InvariantError",
    "JobAbortedError",
    "JobConcurrencyInvalidError",
    "JobConcurrencyKeyInvalidError",
    "JobDeclarationInvalidError",
    "JobDrainedError",
    "JobDuplicateError",
    "JobInputInvalidError",
    "JobKeyBusyError",
    "JobMaxAttemptsError",
    "JobNameTakenError",
    "JobNotCancellableError",
    "JobNotFoundError",
    "JobNotPromotableError",
    "JobNotRemovableError",
    "JobNotRequeueableError",
    "JobOnSettledFailedError",
    "JobPageInvalidError",
    "JobRowStatusUnknownError",
    "JobSlotLostError",
    "JobTenantMismatchError",
    "JobTenantRequiredError",
    "JobTimeoutError",
    "JobsError",
    "LeaseLostError",
    "OutboxNoTxError",
    "StepDuplicateError",
    "StepOutputInvalidError",
    "TenancyActorOrgRequiredError",
]


class JobsError(Exception):
    """Base of every error this library raises; ``code`` is the stable ``X_…`` string."""

    code: ClassVar[str] = "X_JOBS"
    final_because: ClassVar[str | None] = None
    """Set on an error no retry could end differently: the attempt it fails is the run's last,
    whatever its code's retry classification, and this says why (on the dead row)."""

    def __init__(self, message: str, *, meta: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.meta: dict[str, Any] = dict(meta or {})

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvariantError(JobsError):
    """A value handed to a constructor cannot be honoured (a lease of 0 ms, a NaN rate)."""

    code = "X_INVARIANT"


class ActionJobUnbridgedError(JobsError):
    code = "X_ACTION_JOB_UNBRIDGED"


class CancelUnsupportedError(JobsError):
    """The driver has no ``introspect``, so nothing can cancel through it."""

    code = "X_JOB_NOT_CANCELLABLE"


class ClaimQueuesEmptyError(JobsError):
    code = "X_JOB_CLAIM_QUEUES_EMPTY"


class ConcurrencyUnenforceableError(JobsError):
    code = "X_JOB_CONCURRENCY_UNENFORCEABLE"
    final_because = "a driver without a lease store holds no cap on any attempt"


class CronUnavailableError(JobsError):
    code = "X_CRON_UNAVAILABLE"


class DriverUnavailableError(JobsError):
    code = "X_DRIVER_UNAVAILABLE"


class IdempotencyRequiredError(JobsError):
    code = "X_IDEMPOTENCY_REQUIRED"


class IntrospectionUnsupportedError(JobsError):
    code = "X_NOT_IMPLEMENTED"


class JobAbortedError(JobsError):
    """A write (a step, a progress report) after the attempt's signal was aborted."""

    code = "X_ABORTED"


class JobDeclarationInvalidError(JobsError):
    code = "X_JOB_DECLARATION_INVALID"


class JobConcurrencyInvalidError(JobDeclarationInvalidError):
    """A ``concurrency`` no worker can honour, refused where the job is declared."""


class JobConcurrencyKeyInvalidError(JobDeclarationInvalidError):
    """``concurrency.key(input)`` answered an empty, non-string or over-long key."""


class JobDrainedError(JobsError):
    """The worker holding the attempt began its drain (SIGTERM/SIGINT)."""

    code = "X_DRAINING"


class JobDuplicateError(JobsError):
    code = "X_JOB_DUPLICATE"


class JobNameTakenError(JobDuplicateError):
    """Two different declarations on one durable name."""


class JobInputInvalidError(JobsError):
    """A payload that does not parse as the job's declared input."""

    code = "X_VALIDATION"


class JobKeyBusyError(JobsError):
    code = "X_JOB_KEY_BUSY"


class JobMaxAttemptsError(JobsError):
    code = "X_JOB_MAX_ATTEMPTS"


class JobNotCancellableError(JobsError):
    code = "X_JOB_NOT_CANCELLABLE"


class JobNotFoundError(JobsError):
    code = "X_JOB_NOT_FOUND"


class JobNotPromotableError(JobsError):
    code = "X_JOB_NOT_PROMOTABLE"


class JobNotRemovableError(JobsError):
    code = "X_JOB_NOT_REMOVABLE"


class JobNotRequeueableError(JobsError):
    code = "X_JOB_NOT_REQUEUEABLE"


class JobOnSettledFailedError(JobsError):
    code = "X_JOB_ON_SETTLED_FAILED"


class JobPageInvalidError(JobsError):
    code = "X_JOB_PAGE_INVALID"


class JobRowStatusUnknownError(JobsError):
    code = "X_JOB_ROW_STATUS_UNKNOWN"


class JobSlotLostError(JobsError):
    code = "X_JOB_SLOT_LOST"


class JobTenantRequiredError(JobsError):
    code = "X_JOB_TENANT_REQUIRED"


class JobTenantMismatchError(JobsError):
    code = "X_JOB_TENANT_MISMATCH"


class JobTimeoutError(JobsError):
    code = "X_JOB_TIMEOUT"


class EventWaitTimeoutError(JobTimeoutError):
    """A required ``step.wait_for_event`` reached its deadline. The run stores the timeout as
    the wait's outcome, so a retry would only replay it: the run ends on this attempt."""

    final_because = "a required wait that timed out replays its timeout on every retry"


class LeaseLostError(JobsError):
    code = "X_JOB_LEASE_LOST"


class OutboxNoTxError(JobsError):
    code = "X_OUTBOX_NO_TX"


class StepDuplicateError(JobsError):
    code = "X_STEP_DUPLICATE"


class StepOutputInvalidError(JobsError):
    """A step returned something that does not survive a JSON round trip."""

    code = "X_STEP_OUTPUT_INVALID"


class TenancyActorOrgRequiredError(JobsError):
    """A tenant-scoped read inside a run that carries no org (``tenant='none'``)."""

    code = "X_TENANCY_ACTOR_ORG_REQUIRED"
