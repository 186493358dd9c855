"""Claims whose answer was lost and whose read-back found nothing: they may still run.

A claim is sent whole, and its connection can break on the client's side (a network fault, a
proxy dropping it, a server stalled past the command timeout) while the server goes on: the
claim runs when it gets to, possibly after the driver's read-back of it, or while that
read-back itself fails. Its rows then run under a claim nobody holds until their lease lapses:
an attempt spent on nothing, and a final attempt buried dead without having run.

So a read-back that found nothing (or failed), or an answer that could not be handed over,
does not close the matter. A driver remembers the claim here until its lease would have lapsed,
and the claimant's later claims look for its rows once more (at most once a second, and only
while one is remembered: nothing on the hot path). Rows found that way are answered by that
later claim, under the lost claim's token, with their lease renewed first (it ran from the lost
claim's start), and run as if the first answer had arrived. The rows it took are answered only
when the queues asking have room for all of them; until then they wait, and a lease that lapses
meanwhile leaves them to be claimed again as before. The rows it buried take no slot: they are
answered at once, by the first look that finds them, so ``on_exhausted`` hears of them however
busy the worker is. A claim is atomic, so a look that finds rows finds them all.

The driver supplies the look (its own read-back statement or script) and how to tell a taken
row's queue; this module keeps the bookkeeping, the same on every driver.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from .logs import log_event

__all__ = ["LOOK_EVERY", "LateAnswer", "LostClaim", "UnansweredClaims"]

LOOK_EVERY = timedelta(seconds=1)
"""How often a remembered claim is looked for again."""

Taken = TypeVar("Taken")
Buried = TypeVar("Buried")


@dataclass
class LostClaim:
    """A claim as it was sent: who sent it, its token, the lease it gave, the queues it asked."""

    worker_id: str
    claim: str
    lease_until: datetime
    queues: tuple[str, ...]
    next_look: datetime
    answered: bool = False
    burials_told: bool = False


@dataclass
class LateAnswer(Generic[Taken, Buried]):
    """What a later claim answers for a remembered one: rows it took, rows it buried."""

    taken: list[Taken]
    buried: list[Buried]
    _lost: LostClaim
    _whole: bool
    """Every row the claim took is in ``taken``: once told, nothing of the claim is owed."""

    def told(self) -> None:
        """The rows reached the claimant: none of them is answered again."""
        self._lost.burials_told = True
        if self._whole:
            self._lost.answered = True


class UnansweredClaims(Generic[Taken, Buried]):
    """The claims of one driver whose answer was lost and whose rows were not (yet) found.

    ``look`` reads back what a claim took and buried (nothing, when it never ran);
    ``queue_of`` names the queue of a row it took."""

    def __init__(
        self,
        look: Callable[[LostClaim], Awaitable[tuple[list[Taken], list[Buried]]]],
        queue_of: Callable[[Taken], str],
    ) -> None:
        self._look = look
        self._queue_of = queue_of
        self._pending: list[LostClaim] = []

    def __bool__(self) -> bool:
        return bool(self._pending)

    def remember(
        self,
        worker_id: str,
        claim: str,
        lease_until: datetime,
        queues: Iterable[str],
        now: datetime,
    ) -> None:
        """Look for ``worker_id``'s ``claim`` (as it was sent) from ``now`` on."""
        self._pending.append(LostClaim(worker_id, claim, lease_until, tuple(queues), now))

    async def taken_late(
        self, worker_id: str, wanted: Mapping[str, int], now: datetime
    ) -> LateAnswer[Taken, Buried] | None:
        """The rows of one of ``worker_id``'s remembered claims that ran after all: the ones
        it took when the queues it asks now (``wanted``) have room for them, the ones it buried
        at once. A claim whose lease lapsed is forgotten: whatever it took is claimable again,
        by anyone. The rows stay owed until the answer's ``told()``: a claimant that failed to
        take them finds them again at its next look."""
        self._pending = [
            lost for lost in self._pending if lost.lease_until > now and not lost.answered
        ]
        for lost in list(self._pending):
            if lost.worker_id != worker_id or now < lost.next_look:
                continue
            lost.next_look = now + LOOK_EVERY
            taken, buried = await self._look(lost)
            if lost.answered:
                continue
            if not taken and not buried:
                continue
            if lost.burials_told:
                buried = []
            whole = self._room_for(taken, wanted)
            if not whole:
                taken = []
            if not taken and not buried:
                continue
            log_event(
                logging.WARNING,
                "jobs.claim.committed-late",
                worker=worker_id,
                claim=lost.claim,
                rows=len(taken) + len(buried),
            )
            return LateAnswer(taken, buried, lost, whole)
        return None

    def _room_for(self, taken: Sequence[Taken], wanted: Mapping[str, int]) -> bool:
        """Whether every queue asking has a slot for each of these running rows."""
        counts: dict[str, int] = {}
        for row in taken:
            queue = self._queue_of(row)
            counts[queue] = counts.get(queue, 0) + 1
        return all(count <= wanted.get(queue, 0) for queue, count in counts.items())
