"""Durable names: which handle a queue row's ``name`` routes to.

A job's name is the durable key its queued, retrying and dead-lettered rows carry. An explicit
``name=`` is kept forever; otherwise the function's name, re-stamped by ``define_api`` with the
name the module exports it under. Everything that would put two declarations on one name is
``X_JOB_DUPLICATE``, refused at the earliest point it is decidable.
"""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .constants import MAX_NAME_BYTES
from .errors import JobDeclarationInvalidError, JobNameTakenError
from .jsonvalue import storable_name

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


def same_declaration(a: Any, b: Any) -> bool:
    """A module re-imported (or reloaded) declares the same thing again: same module, same
    qualified name, same line. That is one declaration seen twice, not a collision. (The line
    tells apart what shares a qualified name in one module: two lambdas, two functions defined
    in one enclosing function.) A test declaring a job inside itself, run once per parameter,
    is that too; so is a factory called twice with one name, whose later job then holds it."""
    return bool(a is b or (a.origin is not None and a.origin == b.origin))


def _table(kind: str) -> dict[str, Any]:
    return _jobs if kind == "job" else _tasks


_waiting: dict[str, dict[str, list[Any]]] = {"job": {}, "task": {}}
"""Per kind and name, the declarations that asked for a name another one held: the first still
named so takes it when it is let go (``define_api`` moved its holder to an export name)."""


def claim_name(kind: str, name: str, handle: Any, *, explicit: bool) -> None:
    """Seat ``handle`` on ``name``. An explicit name held by another explicit declaration is
    refused at once; one held by a declaration that only defaulted to it takes the seat (a set
    name is durable, a default one is not), and that one waits, as an implicit name held by
    another does, for ``define_api`` to settle the collision."""
    global _version
    table = _table(kind)
    held = table.get(name)
    if held is None or same_declaration(held, handle):
        table[name] = handle
        _version += 1
    elif explicit and held.explicit_name:
        raise JobNameTakenError(
            f"two {kind} declarations set name={name!r}; a name is a durable queue key, "
            "so give one of them another name",
            meta={"name": name},
        )
    elif explicit:
        table[name] = handle
        _version += 1
        _wait(kind, name, held)
    else:
        _wait(kind, name, handle)


def _wait(kind: str, name: str, handle: Any) -> None:
    waiting = _waiting[kind].setdefault(name, [])
    if not any(each is handle for each in waiting):
        waiting.append(handle)


def release_name(kind: str, name: str, handle: Any) -> None:
    """Let go of ``name``; a declaration waiting for it, still named so, takes it."""
    global _version
    table = _table(kind)
    if table.get(name) is not handle:
        return
    del table[name]
    _version += 1
    waiting = _waiting[kind].get(name, [])
    while waiting:
        candidate = waiting.pop(0)
        if candidate is not handle and candidate.name == name:
            table[name] = candidate
            _version += 1
            break
    if not waiting:
        _waiting[kind].pop(name, None)


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
            if not isinstance(name, str) or not name.strip() or not storable_name(name):
                raise JobDeclarationInvalidError(
                    f"{self.kind} name must be a non-empty string of at most "
                    f"{MAX_NAME_BYTES} bytes with no NUL character and no lone surrogate, got "
                    f"{name!r:.80}",
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


def _imported(handle: Any, module: types.ModuleType, given: dict[str, types.ModuleType]) -> bool:
    """Whether ``handle`` is another module's export that ``module`` imported: declared from a
    body of another module (one of those ``given``, else an imported one) that holds it too. A
    handle a module builds from a body it imported (``send_welcome = job(...)(send)``), or takes
    from a factory, is the module's own."""
    if handle.module == module.__name__:
        return False
    home = given.get(handle.module) or sys.modules.get(handle.module or "")
    return home is not None and any(value is handle for value in vars(home).values())


def _register(kind: str, handle_type: Any, modules: Iterable[types.ModuleType]) -> dict[str, Any]:
    exports: dict[str, Any] = {}
    aliases: dict[int, str] = {}
    given = {module.__name__: module for module in modules}
    for module in given.values():
        for export, value in list(vars(module).items()):
            if not isinstance(value, handle_type) or _imported(value, module, given):
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
    moving = {id(value) for name, value in exports.items() if value.name != name}
    for name, value in exports.items():
        held = table.get(name)
        if held is not None and not same_declaration(held, value) and id(held) not in moving:
            raise JobNameTakenError(
                f"{kind} name {name!r} is already held by another declaration "
                f"({held.origin or held.name})",
                meta={"name": name},
            )
    for name, value in exports.items():
        value._stamp(name)
    return exports
