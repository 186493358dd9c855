"""Durable names: which handle a queue row's ``name`` routes to.

A job's name is the durable key its queued, retrying and dead-lettered rows carry. An explicit
``name=`` is kept forever; otherwise the function's name, re-stamped by ``define_api`` with the
name the module exports it under. Everything that would put two declarations on one name is
``X_JOB_DUPLICATE``, refused at the earliest point it is decidable.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import JobDeclarationInvalidError, JobNameTakenError

if TYPE_CHECKING:
    from .job import AnyJobHandle
    from .task import AnyTaskHandle

__all__ = [
    "Api",
    "Declared",
    "define_api",
    "job_named",
    "registered_jobs",
    "registered_tasks",
    "registry_version",
    "task_named",
]

_jobs: dict[str, AnyJobHandle] = {}
_tasks: dict[str, AnyTaskHandle] = {}
_anonymous = {"job": itertools.count(1), "task": itertools.count(1)}
_version = 0
"""Moves whenever a name is seated or released: what a reader caching the registry compares."""


def anonymous_name(kind: str) -> str:
    return f"anonymous-{kind}-{next(_anonymous[kind])}"


def _same_declaration(a: Any, b: Any) -> bool:
    """A module re-imported (or reloaded) declares the same thing again: same module, same
    qualified name, same line. That is one declaration seen twice, not a collision. (The line
    tells apart what shares a qualified name in one module: two lambdas, two functions defined
    in one enclosing function.)"""
    return bool(a is b or (a.origin is not None and a.origin == b.origin))


def _table(kind: str) -> dict[str, Any]:
    return _jobs if kind == "job" else _tasks


def claim_name(kind: str, name: str, handle: Any, *, explicit: bool) -> None:
    """Seat ``handle`` on ``name``. An explicit name held by another declaration is refused at
    once; an implicit one waits for ``define_api`` to settle collisions."""
    global _version
    table = _table(kind)
    held = table.get(name)
    if held is None or _same_declaration(held, handle):
        table[name] = handle
        _version += 1
    elif explicit:
        raise JobNameTakenError(
            f"two {kind} declarations set name={name!r}; a name is a durable queue key, "
            "so give one of them another name",
            meta={"name": name},
        )


def release_name(kind: str, name: str, handle: Any) -> None:
    global _version
    table = _table(kind)
    if table.get(name) is handle:
        del table[name]
        _version += 1


def registry_version() -> int:
    """A number that changes whenever a job or task is declared, renamed or forgotten."""
    return _version


class Declared:
    """The naming jobs and tasks share: a durable name from ``name=`` (kept forever), else the
    function's name, else ``anonymous-<kind>-N``; and the re-stamp ``define_api`` performs."""

    kind: ClassVar[str]
    name: str
    module: str | None
    origin: str | None
    explicit_name: bool

    def _declare(self, fn: Callable[..., Any], name: str | None) -> None:
        self.module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", None)
        code = getattr(fn, "__code__", None)
        line = getattr(code, "co_firstlineno", "")
        self.origin = f"{self.module}:{qualname}:{line}" if self.module and qualname else None
        self.explicit_name = name is not None
        if name is not None:
            if not isinstance(name, str) or not name.strip():
                raise JobDeclarationInvalidError(
                    f"{self.kind} name must be a non-empty string, got {name!r}",
                    meta={"field": "name"},
                )
            self.name = name
        elif str(getattr(fn, "__name__", "")).isidentifier():
            self.name = fn.__name__
        else:
            self.name = anonymous_name(self.kind)
            self.origin = None
        claim_name(self.kind, self.name, self, explicit=self.explicit_name)

    def _stamp(self, name: str) -> None:
        """Re-key under the export name ``define_api`` found (an explicit name never moves)."""
        if self.explicit_name or name == self.name:
            claim_name(self.kind, self.name, self, explicit=False)
            return
        release_name(self.kind, self.name, self)
        self.name = name
        claim_name(self.kind, name, self, explicit=True)


def job_named(name: str) -> AnyJobHandle | None:
    return _jobs.get(name)


def task_named(name: str) -> AnyTaskHandle | None:
    return _tasks.get(name)


def registered_jobs() -> list[AnyJobHandle]:
    return list(_jobs.values())


def registered_tasks() -> list[AnyTaskHandle]:
    return list(_tasks.values())


@dataclass(frozen=True)
class Api:
    """What ``define_api`` registered, by durable name."""

    jobs: dict[str, AnyJobHandle] = field(default_factory=dict)
    tasks: dict[str, AnyTaskHandle] = field(default_factory=dict)


def define_api(
    *, jobs: Iterable[types.ModuleType] = (), tasks: Iterable[types.ModuleType] = ()
) -> Api:
    """Register the jobs and tasks the given modules declare, under their export names.

    Only handles declared in a module count as its exports (an imported handle is the other
    module's). A handle exported under two names, or two handles under one name, is
    ``X_JOB_DUPLICATE``; a handle that set ``name=`` keeps it whatever it is exported as.
    """
    from .job import JobHandle
    from .task import TaskHandle

    return Api(
        jobs=_register("job", JobHandle, jobs),
        tasks=_register("task", TaskHandle, tasks),
    )


def _register(kind: str, handle_type: Any, modules: Iterable[types.ModuleType]) -> dict[str, Any]:
    exports: dict[str, Any] = {}
    aliases: dict[int, str] = {}
    for module in modules:
        for export, value in list(vars(module).items()):
            if not isinstance(value, handle_type) or value.module != module.__name__:
                continue
            seen = aliases.get(id(value))
            if seen is not None and seen != export and not value.explicit_name:
                raise JobNameTakenError(
                    f"one {kind} is exported twice, as {seen!r} and {export!r}; "
                    "the second alias would move its queue key — export it once",
                    meta={"names": [seen, export]},
                )
            aliases[id(value)] = export
            name = value.name if value.explicit_name else export
            held = exports.get(name)
            if held is not None and held is not value:
                raise JobNameTakenError(
                    f"two different {kind}s are registered under {name!r}",
                    meta={"name": name},
                )
            exports[name] = value
    table = _table(kind)
    for name, value in exports.items():
        held = table.get(name)
        if held is not None and not _same_declaration(held, value):
            raise JobNameTakenError(
                f"{kind} name {name!r} is already held by another declaration "
                f"({held.origin or held.name})",
                meta={"name": name},
            )
    for name, value in exports.items():
        value._stamp(name)
    return exports
