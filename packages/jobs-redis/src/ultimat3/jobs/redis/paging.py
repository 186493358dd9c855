"""Walking sorted sets of rows in (created_at, id) order, several merged into one, page by page.

The operator surface reads rows in the order ``list()`` pages them. A filter on state or queue
picks the per-queue state sets to read (``q:<queue>:s:<state>``), else the ``created`` set; when
several sets are read they are merged, here or in the ``page`` script. Each page is asked for from
a POSITION — the (score, member) of the last member read — so rows that move or go meanwhile
never shift a page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Literal

from .namespace import Namespace

__all__ = ["Position", "walk"]

Position = tuple[int, str]
"""(created_at in microseconds, id): a row's place in ``list()`` order."""

_PAGE = 200


async def _one(
    ns: Namespace, keys: Sequence[str], direction: Literal["asc", "desc"], start: Position | None
) -> AsyncIterator[Position]:
    """The members of ``keys``, a page per call, each page read from all of them at once."""
    position = start
    while True:
        score, member = ("", "") if position is None else (str(position[0]), position[1])
        flat = await ns.call("page", direction, score, member, str(_PAGE), keys=keys)
        for i in range(0, len(flat), 2):
            position = (int(float(flat[i + 1])), flat[i])
            yield position
        if len(flat) < 2 * _PAGE:
            return


async def walk(
    ns: Namespace,
    keys: Sequence[str],
    *,
    direction: Literal["asc", "desc"],
    start: Position | None = None,
    together: bool = False,
) -> AsyncIterator[Position]:
    """Every member of ``keys`` strictly after ``start``, merged, in ``direction`` order.

    ``together``: the sets are ones a row moves between (the states of one queue), so each page
    is read from all of them in one call — read one after another, a row moving meanwhile was
    answered twice, or not at all. Sets no row moves between (one state's queues) are read each
    on its own, a page at a time, however many there are."""
    groups = [keys] if together else [[key] for key in keys]
    streams = [_one(ns, group, direction, start) for group in groups]
    heads: list[Position | None] = [await anext(s, None) for s in streams]
    newest_first = direction == "desc"
    while True:
        live = [(head, i) for i, head in enumerate(heads) if head is not None]
        if not live:
            return
        head, i = max(live) if newest_first else min(live)
        yield head
        heads[i] = await anext(streams[i], None)
