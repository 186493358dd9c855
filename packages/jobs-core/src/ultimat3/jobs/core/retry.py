"""Retry policy: the backoff schedule, jitter, and what the thrown error decides.

A job's ``retry`` says how many attempts and how far apart. The error has a say too:
``register_error_retry`` classifies codes as ``terminal`` (dead-lettered where it happened),
``retry-after`` (retried when the responder said, ``meta['retry_after_seconds']``) or
``retryable`` (the backoff). A code nobody classified keeps the attempt-count path.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from .durations import Duration, parse_duration
from .errors import InvariantError, JobDeclarationInvalidError

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_RETRY_DELAY_S",
    "Backoff",
    "ErrorRetry",
    "Retry",
    "backoff_delay",
    "equal_jitter",
    "error_code",
    "is_final_attempt",
    "jitter_stated_delay",
    "register_error_retry",
    "retry_after_seconds_of",
    "retry_classification",
    "retry_delay_cap",
    "retry_schedule",
]

MAX_RETRY_DELAY_S = 365 * 86400.0
"""The longest any retry waits, whatever sets it: a long exponential schedule (2**40 s by
attempt 41), a ``max_delay`` above it, or a responder's stated retry-after (1e12 s) would
otherwise name a time no datetime can hold, and the settle would fail before the row is
handed back."""

MAX_ATTEMPTS = 2**31 - 1
"""The most attempts a job may declare: what a driver stores as a 32-bit integer."""

Backoff: TypeAlias = Literal["exponential", "linear", "fixed"]
ErrorRetry: TypeAlias = Literal["terminal", "retry-after", "retryable"]


@dataclass(frozen=True, slots=True)
class Retry:
    """``attempts`` counts every run of the body, the first included."""

    attempts: int = 3
    backoff: Backoff = "exponential"
    delay: Duration = 1.0
    max_delay: Duration | None = None
    jitter: bool = True
    dead_letter: bool = True
    """False: a job that fails for good is dropped (row ``failed``) instead of dead-lettered."""

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise JobDeclarationInvalidError(
                f"retry.attempts must be an int, got {self.attempts!r}"
            )
        if not 1 <= self.attempts <= MAX_ATTEMPTS:
            raise JobDeclarationInvalidError(
                f"retry.attempts must be from 1 to {MAX_ATTEMPTS:,}, got {self.attempts}"
            )
        for flag in ("jitter", "dead_letter"):
            if not isinstance(getattr(self, flag), bool):
                raise JobDeclarationInvalidError(
                    f"retry.{flag} must be True or False, got {getattr(self, flag)!r}",
                    meta={"field": f"retry.{flag}"},
                )
        if self.backoff not in ("exponential", "linear", "fixed"):
            raise JobDeclarationInvalidError(
                f"retry.backoff must be 'exponential', 'linear' or 'fixed', got {self.backoff!r}"
            )
        try:
            delays = (self.delay_s, self.max_delay_s)
        except InvariantError as exc:
            raise JobDeclarationInvalidError(exc.message, meta=exc.meta) from exc
        if any(d is not None and d < 0 for d in delays):
            raise JobDeclarationInvalidError("retry delays must not be negative")

    @property
    def delay_s(self) -> float:
        return parse_duration(self.delay, field="retry.delay")

    @property
    def max_delay_s(self) -> float | None:
        if self.max_delay is None:
            return None
        return parse_duration(self.max_delay, field="retry.max_delay")


def is_final_attempt(retry: Retry, attempt: int) -> bool:
    """True when a failure of ``attempt`` is not retried for want of attempts."""
    return attempt >= retry.attempts


def backoff_delay(retry: Retry, attempt: int) -> float:
    """Seconds before the retry that follows failed ``attempt`` (1-based), before jitter."""
    base = retry.delay_s
    if retry.backoff == "exponential":
        delay = base * math.pow(2, min(attempt - 1, 64))
    elif retry.backoff == "linear":
        delay = base * attempt
    else:
        delay = base
    return min(delay, retry_delay_cap(retry))


def retry_delay_cap(retry: Retry) -> float:
    """The longest a retry of ``retry`` waits before jitter: ``max_delay``, and never more than
    ``MAX_RETRY_DELAY_S``."""
    cap = retry.max_delay_s
    return MAX_RETRY_DELAY_S if cap is None else min(cap, MAX_RETRY_DELAY_S)


def retry_schedule(retry: Retry) -> list[float]:
    """The delays between attempts, without jitter: ``attempts - 1`` entries."""
    return [backoff_delay(retry, attempt) for attempt in range(1, retry.attempts)]


def equal_jitter(delay: float, rng: random.Random | None = None) -> float:
    """Half the delay fixed, half random: a burst of failures does not retry in lockstep."""
    rand = (rng or random).random()
    return delay / 2 + rand * delay / 2


def jitter_stated_delay(delay: float, rng: random.Random | None = None) -> float:
    """A delay a responder named, spread forward by up to a tenth so callers handed one instant
    do not all come back together. Never earlier than stated."""
    rand = (rng or random).random()
    return delay + rand * delay * 0.1


_CLASSIFICATION: dict[str, ErrorRetry] = {
    "X_JOB_KEY_BUSY": "terminal",
    "X_VALIDATION": "terminal",
    "X_JOB_TENANT_MISMATCH": "terminal",
    "X_TENANCY_ACTOR_ORG_REQUIRED": "terminal",
    # A step's return value JSON cannot hold fails the same way on every attempt, after running
    # the step's side effect each time: a validation fault, dead-lettered on the first.
    "X_STEP_OUTPUT_INVALID": "terminal",
    # Two steps of one name, or a name the run stored for another kind of step, meet again on
    # every attempt until the code changes: the fix is a deploy and a requeue, not a backoff.
    "X_STEP_DUPLICATE": "terminal",
    "X_JOB_TIMEOUT": "retryable",
    "X_DRAINING": "retryable",
    "X_TIMEOUT": "retryable",
    "X_RATE_LIMITED": "retry-after",
    "X_OVERLOADED": "retry-after",
}


def register_error_retry(table: Mapping[str, ErrorRetry]) -> None:
    """Classify error codes; call it beside the module that declares them."""
    for code, verdict in table.items():
        if verdict not in ("terminal", "retry-after", "retryable"):
            raise JobDeclarationInvalidError(
                f"{code}: retry classification must be 'terminal', 'retry-after' or 'retryable'"
            )
        _CLASSIFICATION[code] = verdict


def error_code(error: BaseException) -> str | None:
    code = getattr(error, "code", None)
    return code if isinstance(code, str) else None


def retry_classification(error: BaseException) -> ErrorRetry | None:
    """The registered verdict for the error's code; None when unclassified."""
    code = error_code(error)
    return _CLASSIFICATION.get(code) if code is not None else None


def retry_after_seconds_of(error: BaseException) -> float | None:
    """``meta['retry_after_seconds']`` when it names a positive, finite delay."""
    meta = getattr(error, "meta", None)
    if not isinstance(meta, Mapping):
        return None
    value = meta.get("retry_after_seconds")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):  # a responder's absurd number may be past a float's range
        value = min(value, int(MAX_RETRY_DELAY_S))
    if not math.isfinite(value) or value <= 0:
        return None
    return float(value)
