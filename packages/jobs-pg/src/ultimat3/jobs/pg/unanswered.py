"""Claims whose answer was lost and whose read-back found nothing: they may still commit.

A claim's connection can die on the client's side (a network fault, a proxy dropping it) while
the server goes on: the statement was delivered whole, and it commits when it gets to — after
the driver's read-back, if it was waiting on a lock or the server was slow. Its rows then run
under a claim nobody holds until their lease lapses: an attempt spent on nothing, and a final
attempt buried dead without having run.

So a read-back that found nothing (or failed) does not close the matter. The claim is
remembered until its lease would have lapsed, and the claimant's later claims look for its rows
once more (at most once a second, and only while one is remembered: nothing on the hot path).
Rows found that way are answered by that later claim, under the lost claim's token, their lease
renewed first (it ran from the lost claim's start), and run as if the first answer had arrived.
The rows it took are answered only when the queues asking have room for all of them; until then
they wait, and a lease that lapses meanwhile leaves them to be claimed again as before. The rows
it buried take no slot: they are answered at once, by the first look that finds them, so
``on_exhausted`` hears of them however busy the worker is. A statement commits whole, so a look
that finds rows finds them all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ultimat3.jobs.core.logs import log_event

from .executor import PgExecutor
from .sql_claim import SQL_CLAIM_HELD

__all__ = ["LOOK_EVERY", "LateAnswer", "UnansweredClaims"]

LOOK_EVERY = timedelta(seconds=1)
"""How often a remembered claim is looked for again."""


@dataclass
class _Unanswered:
    worker_id: str
    claim: str
    lease_until: datetime
    queues: tuple[str, ...]
    next_look: datetime
    answered: bool = False
    burials_told: bool = False


class UnansweredClaims:
    """The claims of one driver whose answer was lost and whose rows were not (yet) found."""

    def __init__(self, executor: PgExecutor) -> None:
        self._executor = executor
        self._pending: list[_Unanswered] = []

    def __bool__(self) -> bool:
        return bool(self._pending)

    def remember(
        self,
        *,
        worker_id: str,
        claim: str,
        lease_until: datetime,
        queues: Sequence[str],
        now: datetime,
    ) -> None:
        self._pending.append(_Unanswered(worker_id, claim, lease_until, tuple(queues), now))

    async def taken_late(
        self, worker_id: str, wanted: Mapping[str, int], now: datetime
    ) -> LateAnswer | None:
        """The rows (SQL_CLAIM_HELD's) of one of ``worker_id``'s remembered claims that
        committed after all: the ones it took when the queues it asks now (``wanted``) have
        room for them, the ones it buried at once. A claim whose lease lapsed is forgotten:
        whatever it took is claimable again, by anyone. The rows stay owed until the answer's
        ``told()``: a claimant that failed to take them finds them again at its next look."""
        self._pending = [
            lost for lost in self._pending if lost.lease_until > now and not lost.answered
        ]
        for lost in list(self._pending):
            if lost.worker_id != worker_id or now < lost.next_look:
                continue
            lost.next_look = now + LOOK_EVERY
            rows = await self._look(lost)
            if lost.answered or not rows:
                continue
            running = [row for row in rows if row[0] == "running"]
            answer = [] if lost.burials_told else [row for row in rows if row[0] != "running"]
            takes_running = _room_for(running, wanted)
            if takes_running:
                answer += running
            if not answer:
                continue
            log_event(
                logging.WARNING,
                "jobs.claim.committed-late",
                worker=worker_id,
                claim=lost.claim,
                rows=len(answer),
            )
            return LateAnswer(answer, lost, takes_running)
        return None

    async def _look(self, lost: _Unanswered) -> list[tuple[Any, ...]]:
        return await self._executor.fetch(
            SQL_CLAIM_HELD,
            {
                "queues": list(lost.queues),
                "worker_id": lost.worker_id,
                "claim": lost.claim,
                "lease_until": lost.lease_until,
            },
            idempotent=True,
        )


@dataclass
class LateAnswer:
    """The rows a later claim answers for a remembered one."""

    rows: list[tuple[Any, ...]]
    _lost: _Unanswered
    _takes_running: bool

    def told(self) -> None:
        """The rows reached the claimant: none of them is answered again."""
        self._lost.burials_told = True
        if self._takes_running:
            self._lost.answered = True


def _room_for(running: Sequence[Sequence[Any]], wanted: Mapping[str, int]) -> bool:
    """Whether every queue asking has a slot for each of these running rows."""
    taken: dict[str, int] = {}
    for row in running:
        taken[row[4]] = taken.get(row[4], 0) + 1
    return all(count <= wanted.get(queue, 0) for queue, count in taken.items())
