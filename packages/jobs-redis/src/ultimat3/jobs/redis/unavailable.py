"""A Redis that does not answer, reported as every driver reports it: ``X_DRIVER_UNAVAILABLE``.

Code written against the driver protocol catches ``DriverUnavailableError`` whichever backend it
runs on; redis-py's own ``ConnectionError`` and ``TimeoutError`` would name the backend instead.
The driver and its optional parts translate them where a caller meets them, at each public
coroutine (``reports_unavailable``). ``RedisUnavailableError`` is also a redis-py
``ConnectionError``, so a caller written against redis-py's errors still catches it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from redis.exceptions import ClusterError, ConnectionError, TimeoutError
from ultimat3.jobs.core.errors import DriverUnavailableError

__all__ = ["RedisUnavailableError", "reports_unavailable"]

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)


class RedisUnavailableError(DriverUnavailableError, ConnectionError):
    """Redis did not answer, or its connection broke. Whether a write sent before the break
    was applied is unknown, as for any client: look before repeating it."""


def reports_unavailable(cls: C) -> C:
    """``cls`` with each of its public coroutine methods raising ``RedisUnavailableError`` (from
    the original) where redis-py raised ``ConnectionError`` or ``TimeoutError``, or its cluster
    client ``ClusterError`` (it could not route the call: the cluster is down, or a slot is
    moving and its retries ran out)."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, _translating(member))
    return cls


def _translating(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except RedisUnavailableError:
            raise
        except (ConnectionError, TimeoutError, ClusterError) as exc:
            raise RedisUnavailableError(
                f"Redis did not answer ({exc}); check the URL and that the server is up"
            ) from exc

    return call
