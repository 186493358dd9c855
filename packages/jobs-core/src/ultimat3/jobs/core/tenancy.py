"""The actor a run acts as, installed in a contextvar for the body and its hooks.

A job declares its tenant; the runner puts that org on the run's actor, so every tenant-scoped
read inside the body is checked against the org the job declared. A job with ``tenant='none'``
carries no org: code that genuinely spans tenants says so with ``cross_tenant(reason, fn)``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from .errors import TenancyActorOrgRequiredError

__all__ = [
    "Actor",
    "cross_tenant",
    "current_actor",
    "require_org",
    "use_actor",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Actor:
    """Who is acting. ``org_id`` is the tenant; ``cross_tenant_reason`` is set only inside
    ``cross_tenant``."""

    id: str | None = None
    org_id: str | None = None
    cross_tenant_reason: str | None = None


_ACTOR: contextvars.ContextVar[Actor | None] = contextvars.ContextVar(
    "ultimat3_jobs_actor", default=None
)


def current_actor() -> Actor | None:
    return _ACTOR.get()


class use_actor:  # noqa: N801 - used as a function: `with use_actor(actor):`
    """Install ``actor`` for the block. A plain class, not a generator: every run enters one."""

    __slots__ = ("_actor", "_token")

    def __init__(self, actor: Actor | None) -> None:
        self._actor = actor

    def __enter__(self) -> None:
        self._token = _ACTOR.set(self._actor)

    def __exit__(self, *exc: object) -> None:
        _ACTOR.reset(self._token)


def require_org() -> str:
    """The acting org, for a tenant-scoped read; ``X_TENANCY_ACTOR_ORG_REQUIRED`` without one."""
    actor = _ACTOR.get()
    if actor is None or actor.org_id is None:
        raise TenancyActorOrgRequiredError(
            "this read is tenant-scoped and the run carries no org; declare the job's tenant, "
            "or wrap a read that spans tenants in cross_tenant(reason, fn)"
        )
    return actor.org_id


async def cross_tenant(reason: str, fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn`` with the reason it spans tenants recorded on the actor."""
    if not reason.strip():
        raise ValueError("cross_tenant needs a reason an auditor can read")
    actor = _ACTOR.get() or Actor()
    with use_actor(replace(actor, cross_tenant_reason=reason)):
        return await fn()
