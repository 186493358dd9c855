"""What a running body sees (``JobContext``) and what ``on_settled`` is told (``Settled``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar

from .signal import AbortSignal
from .tenancy import Actor

__all__ = ["JobContext", "JobOutcome", "ProgressFn", "Settled", "SettledOutcome", "StopReason"]

S = TypeVar("S")

JobOutcome: TypeAlias = Literal[
    "completed",
    "suspended",
    "retried",
    "dead-lettered",
    "dropped",
    "interrupted",
    "refused",
    "lease-lost",
]
"""How an attempt ended. ``lease-lost``: the claim no longer held the row when the attempt tried to
settle (its lease lapsed, or an operator cancelled it); nothing was written."""

SettledOutcome: TypeAlias = Literal["completed", "dead-lettered", "dropped", "refused"]
StopReason: TypeAlias = Literal["terminal", "attempts-exhausted"]


class ProgressFn(Protocol):
    def __call__(
        self, done: float, total: float | None = None, note: str | None = None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class JobContext(Generic[S]):
    """The ambient context of one attempt. ``services`` is what the worker's ``context`` factory
    built; ``actor.org_id`` is the tenant the job declared."""

    signal: AbortSignal
    actor: Actor
    services: S
    job_id: str
    run_id: str
    name: str
    attempt: int
    log: logging.LoggerAdapter[logging.Logger]


@dataclass(frozen=True, slots=True)
class Settled(Generic[S]):
    """One ending of a run, told once to the job's ``on_settled`` after the row settled.

    ``input`` is None when the stored payload no longer parses. ``result`` is what the body
    returned, in this process only — never stored. ``code`` is the error's code, if it had one.
    """

    outcome: SettledOutcome
    name: str
    job_id: str
    run_id: str
    attempt: int
    input: Any
    result: Any = None
    error: BaseException | None = None
    code: str | None = None
    ctx: JobContext[S] | None = None
