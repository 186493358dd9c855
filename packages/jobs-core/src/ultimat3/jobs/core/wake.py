"""The in-process wake: an enqueue in this process starts a worker of this process at once.

``signal_enqueued(queue)`` is called after every enqueue, relay publish and scheduler fire; the
worker subscribes. Across processes a driver's ``QueueWake`` (LISTEN/NOTIFY, a blocking pop) plays
the same part; the poll stays the guarantee either way.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["on_enqueued", "signal_enqueued"]

_listeners: list[Callable[[str], None]] = []


def on_enqueued(listener: Callable[[str], None]) -> Callable[[], None]:
    _listeners.append(listener)

    def remove() -> None:
        if listener in _listeners:
            _listeners.remove(listener)

    return remove


def signal_enqueued(queue: str) -> None:
    for listener in list(_listeners):
        listener(queue)
