"""The in-process wake: an enqueue in this process starts a worker of this process at once.

``signal_enqueued(queue)`` is called after every enqueue, relay publish and scheduler fire; the
worker subscribes. Across processes a driver's ``QueueWake`` (LISTEN/NOTIFY, a blocking pop) plays
the same part; the poll stays the guarantee either way.

A driver's wake calls ``signal_wake_lost(wake)`` when its ``live`` turns false: a loop idling at
the woken ceiling (5 s) on that wake's word hears it through ``on_wake_lost`` and shortens its wait
now, so pickup without a wake stays within the idle ceiling (2 s). ``Backoff`` paces the wakes'
re-dials and re-probes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .protocol import QueueWake

__all__ = ["Backoff", "on_enqueued", "on_wake_lost", "signal_enqueued", "signal_wake_lost"]

T = TypeVar("T")

_listeners: list[Callable[[str], None]] = []
_lost_listeners: list[Callable[[QueueWake], None]] = []


def on_enqueued(listener: Callable[[str], None]) -> Callable[[], None]:
    return _add(_listeners, listener)


def signal_enqueued(queue: str) -> None:
    for listener in list(_listeners):
        listener(queue)


def on_wake_lost(listener: Callable[[QueueWake], None]) -> Callable[[], None]:
    """Hear every wake of this process whose ``live`` turns false, with the wake."""
    return _add(_lost_listeners, listener)


def signal_wake_lost(wake: QueueWake) -> None:
    for listener in list(_lost_listeners):
        listener(wake)


def _add(listeners: list[T], listener: T) -> Callable[[], None]:
    listeners.append(listener)

    def remove() -> None:
        if listener in listeners:
            listeners.remove(listener)

    return remove


class Backoff:
    """A capped, doubling delay between tries: ``next()`` answers the delay before the next one,
    ``reset()`` starts again from ``first`` once a try proved the thing works."""

    __slots__ = ("_cap", "_delay", "_first")

    def __init__(self, first: float, cap: float) -> None:
        self._first = first
        self._cap = cap
        self._delay = first

    def next(self) -> float:
        delay = self._delay
        self._delay = min(delay * 2, self._cap)
        return delay

    def reset(self) -> None:
        self._delay = self._first
