"""``task()``: a cron schedule that puts jobs on the queue.

A task does no work itself: each occurrence hands its instant (``occurrence_ms``) to the jobs its
``enqueue`` names, synchronously and without I/O, so ``describe()`` can list them and the tick stays
cheap. Work that reads the database (one job per row) is a fan-out JOB the task enqueues.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import registry
from .clock import Clock
from .constants import MAX_CATCH_UP
from .cron import croniter_module, occurrence_ms
from .errors import JobDeclarationInvalidError
from .facade import enqueuer_clock
from .job import AnyJobHandle, JobHandle, awaits_when_called
from .model import Enqueued, EnqueueRequest

__all__ = ["AnyTaskHandle", "CatchUp", "TaskDescriptor", "TaskHandle", "task"]

CatchUp: TypeAlias = Literal["skip", "run-once", "run-all"]
Entries: TypeAlias = Sequence[tuple[AnyJobHandle, Any]]
EnqueueFn: TypeAlias = Callable[[int], Entries] | Callable[[], Entries]


@dataclass(frozen=True, slots=True)
class TaskDescriptor:
    name: str
    cron: str
    tz: str
    catch_up: CatchUp
    max_catch_up: int
    jobs: Sequence[str]
    kind: Literal["task"] = "task"


class TaskHandle(registry.Declared):
    kind = "task"

    def __init__(
        self,
        enqueue: EnqueueFn,
        *,
        cron: str,
        tz: str,
        catch_up: CatchUp = "skip",
        max_catch_up: int = MAX_CATCH_UP,
        name: str | None = None,
    ) -> None:
        if not callable(enqueue):
            raise JobDeclarationInvalidError(
                "task enqueue must be a function", meta={"field": "enqueue"}
            )
        if awaits_when_called(enqueue):
            raise JobDeclarationInvalidError(
                "task enqueue must be a plain function answering the occurrence's (job, input) "
                "pairs, not an async one: describe() and every fire read it without I/O. Work "
                "that must read a store first is a fan-out job the task enqueues",
                meta={"field": "enqueue"},
            )
        self.cron = _check_cron(cron)
        self.tz = _check_tz(tz)
        self.zone = ZoneInfo(self.tz)
        if catch_up not in ("skip", "run-once", "run-all"):
            raise JobDeclarationInvalidError(
                f"catch_up must be 'skip', 'run-once' or 'run-all', got {catch_up!r}",
                meta={"field": "catch_up"},
            )
        self.catch_up: CatchUp = catch_up
        if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int) or max_catch_up < 1:
            raise JobDeclarationInvalidError(
                f"max_catch_up must be a whole number >= 1, got {max_catch_up!r}",
                meta={"field": "max_catch_up"},
            )
        self.max_catch_up = max_catch_up
        self._enqueue = enqueue
        self._takes_occurrence = _takes_occurrence(enqueue)
        self._declare(enqueue, name)

    def __repr__(self) -> str:
        return f"<task {self.name!r} cron={self.cron!r} tz={self.tz!r}>"

    def entries(self, occurrence_ms: int = 0) -> list[tuple[AnyJobHandle, Any]]:
        """The declared ``(job, input)`` pairs for one occurrence."""
        produced = (
            self._enqueue(occurrence_ms)  # type: ignore[call-arg]
            if self._takes_occurrence
            else self._enqueue()  # type: ignore[call-arg]
        )
        pairs: list[tuple[AnyJobHandle, Any]] = []
        for entry in produced if isinstance(produced, Iterable) else [produced]:
            if (
                isinstance(entry, str | bytes)
                or not isinstance(entry, Sequence)
                or len(entry) != 2
                or not isinstance(entry[0], JobHandle)
            ):
                raise JobDeclarationInvalidError(
                    f"task {self.name!r} must enqueue a list of (job, input) pairs, got "
                    f"{entry!r:.120} among them",
                    meta={"task": self.name},
                )
            pairs.append((entry[0], entry[1]))
        return pairs

    def requests(self, occurrence_ms: int, *, clock: Clock) -> list[EnqueueRequest]:
        """The rows one scheduled occurrence inserts: each job's own key, scoped to the
        occurrence, so a manual ``enqueue()`` and a scheduled fire stay distinct rows."""
        prefix = f"task:{self.name}@{occurrence_ms}:"
        return [
            handle.request(value, key_prefix=prefix, clock=clock)
            for handle, value in self.entries(occurrence_ms)
        ]

    async def enqueue(self) -> list[Enqueued]:
        """Fire every declared entry now, under each job's own idempotency key."""
        now_ms = occurrence_ms(enqueuer_clock().now())
        return [await handle.enqueue(value) for handle, value in self.entries(now_ms)]

    def describe(self) -> TaskDescriptor:
        return TaskDescriptor(
            name=self.name,
            cron=self.cron,
            tz=self.tz,
            catch_up=self.catch_up,
            max_catch_up=self.max_catch_up,
            jobs=[handle.name for handle, _ in self.entries(0)],
        )


AnyTaskHandle: TypeAlias = TaskHandle


_HOST_ZONES = frozenset({"localtime", "Factory", "posixrules"})
"""Names in the zone database that stand for a host's own setting or for none: two hosts would
compute different instants, and so different occurrences, for one task."""

_HOST_ZONE_TREES = ("right/", "posix/")
"""Copies of the zone database some hosts install beside it: ``right/`` counts leap seconds (its
clock changes fall 27 s off the civil ones), and a host relying on the ``tzdata`` package has
neither, so the same task would name different instants, or none, from host to host."""

_UNSTABLE_FIELDS = ("R", "H")
"""croniter's random (``R``) and hashed (``H``) field values: each parser instance picks its own
value, so two computations of one task's next occurrence (two nodes, two rounds) disagree, and
an occurrence's instant is its identity."""


def _takes_occurrence(enqueue: EnqueueFn) -> bool:
    """Whether ``enqueue`` is called with the occurrence (``fn(occurrence_ms)``) or without it;
    a function that can be called neither way is refused where it is declared."""
    signature = inspect.signature(enqueue)
    for arguments, takes in (((0,), True), ((), False)):
        try:
            signature.bind(*arguments)
        except TypeError:
            continue
        return takes
    raise JobDeclarationInvalidError(
        f"task enqueue {enqueue!r} must take the occurrence (fn(occurrence_ms)) or nothing "
        f"(fn()), got the signature {signature}",
        meta={"field": "enqueue"},
    )


def _check_cron(cron: Any) -> str:
    if not isinstance(cron, str) or not cron.strip():
        raise JobDeclarationInvalidError("cron must be a non-empty string", meta={"field": "cron"})
    if not cron.startswith("@") and len(cron.split()) != 5:
        raise JobDeclarationInvalidError(
            f"cron {cron!r} must have five fields: minute hour day-of-month month weekday "
            "(a sixth field would be read as seconds by one parser and years by another)",
            meta={"field": "cron"},
        )
    if any(_unstable(field) for field in cron.split()):
        raise JobDeclarationInvalidError(
            f"cron {cron!r} picks a random or hashed value ('R', 'H'): every computation of the "
            "next occurrence would pick its own, so two nodes would fire at different instants. "
            "Name the minute (e.g. '17 * * * *')",
            meta={"field": "cron"},
        )
    croniter = croniter_module()
    if not croniter.croniter.is_valid(cron):
        raise JobDeclarationInvalidError(
            f"cron {cron!r} is not a valid cron expression", meta={"field": "cron"}
        )
    if not _ever_comes(croniter, cron):
        raise JobDeclarationInvalidError(
            f"cron {cron!r} names a date that never comes", meta={"field": "cron"}
        )
    return cron


def _unstable(field: str) -> bool:
    """Whether one field of an expression holds a random or hashed value (``R``, ``H``, ``H/15``,
    ``H(0-29)``); day and month names (``THU``, ``MAR``) are not such values."""
    for value in field.upper().split(","):
        base = value.split("/")[0].split("(")[0]
        if base in _UNSTABLE_FIELDS:
            return True
    return False


def _ever_comes(croniter: Any, cron: str) -> bool:
    """Whether a valid expression names a date at all (30 February parses, and never comes)."""
    try:
        croniter.croniter(cron, datetime(2000, 1, 1)).get_next(datetime)
    except croniter.CroniterBadDateError:
        return False
    return True


def _check_tz(tz: Any) -> str:
    if not isinstance(tz, str) or not tz.strip():
        raise JobDeclarationInvalidError(
            "tz is required: a cron without a timezone is a bug (tz='UTC' is a fine answer)",
            meta={"field": "tz"},
        )
    try:
        if tz in _HOST_ZONES or tz.startswith(_HOST_ZONE_TREES):
            raise ValueError(f"{tz!r} names no zone every host computes alike")
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: a directory, a long name
        raise JobDeclarationInvalidError(
            f"tz {tz!r} is not an IANA timezone (e.g. 'America/Bogota', 'Europe/Paris', 'UTC')",
            meta={"field": "tz"},
        ) from exc
    return tz


@overload
def task(
    *,
    cron: str,
    tz: str,
    enqueue: EnqueueFn,
    catch_up: CatchUp = "skip",
    max_catch_up: int = MAX_CATCH_UP,
    name: str | None = None,
) -> TaskHandle: ...


@overload
def task(
    *,
    cron: str,
    tz: str,
    catch_up: CatchUp = "skip",
    max_catch_up: int = MAX_CATCH_UP,
    name: str | None = None,
) -> Callable[[EnqueueFn], TaskHandle]: ...


def task(
    *,
    cron: str,
    tz: str,
    enqueue: EnqueueFn | None = None,
    catch_up: CatchUp = "skip",
    max_catch_up: int = MAX_CATCH_UP,
    name: str | None = None,
) -> TaskHandle | Callable[[EnqueueFn], TaskHandle]:
    """Declare a cron task: ``task(cron=…, tz=…, enqueue=fn)``, or as a decorator over ``fn``.

    ``fn(occurrence_ms)`` (or ``fn()``) answers the ``(job, input)`` pairs one occurrence queues.
    ``tz`` is required and checked against the IANA database.
    """
    _check_cron(cron)
    _check_tz(tz)

    def declare(fn: EnqueueFn) -> TaskHandle:
        return TaskHandle(
            fn, cron=cron, tz=tz, catch_up=catch_up, max_catch_up=max_catch_up, name=name
        )

    return declare(enqueue) if enqueue is not None else declare
