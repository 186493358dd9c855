"""Walking sorted sets of rows in (created_at, id) order, several merged into one, page by page.

The operator surface reads rows in the order ``list()`` pages them. A filter on state or queue
picks the per-queue state sets to read (``q:<queue>:s:<state>``), else the ``created`` set; when
several sets are read they are merged here. Each page is asked for from a POSITION — the
(score, member) of the last member read — so rows that move or go meanwhile never shift a page.
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
    ns: Namespace, key: str, direction: Literal["asc", "desc"], start: Position | None
) -> AsyncIterator[Position]:
    position = start
    while True:
        score, member = ("", "") if position is None else (str(position[0]), position[1])
        flat = await ns.call("page", direction, score, member, str(_PAGE), keys=[key])
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
) -> AsyncIterator[Position]:
    """Every member of ``keys`` strictly after ``start``, merged, in ``direction`` order."""
    streams = [_one(ns, key, direction, start) for key in keys]
    heads: list[Position | None] = [await anext(s, None) for s in streams]
    newest_first = direction == "desc"
    while True:
        live = [(head, i) for i, head in enumerate(heads) if head is not None]
        if not live:
            return
        head, i = max(live) if newest_first else min(live)
        yield head
        heads[i] = await anext(streams[i], None)
