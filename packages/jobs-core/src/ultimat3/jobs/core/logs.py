"""Structured log events under the ``ultimat3.jobs`` logger: the event name is the message,
the fields ride in ``extra`` (namespaced under ``jobs`` so they never clash with LogRecord's own
attributes) and are appended to the message for plain handlers."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["LOGGER", "log_claim_answer_lost", "log_event", "log_nack_answer_lost"]

LOGGER = logging.getLogger("ultimat3.jobs")


def log_event(level: int, event: str, **fields: Any) -> None:
    if not LOGGER.isEnabledFor(level):
        return
    detail = " ".join(f"{key}={value!r}" for key, value in fields.items() if value is not None)
    LOGGER.log(
        level,
        f"{event} {detail}" if detail else event,
        extra={"event": event, "jobs": fields},
    )


def log_claim_answer_lost(
    worker_id: str, taken_back: int, buried: int, error: BaseException
) -> None:
    """A claim's answer was lost with its connection, and its driver read back the rows it had
    taken (``taken_back``) instead of leaving them to lapse, and the rows it had buried
    (``buried``), so ``on_exhausted`` is told of them. Logged alike by every driver."""
    log_event(
        logging.WARNING,
        "jobs.claim.answer-lost",
        worker=worker_id,
        taken_back=taken_back,
        buried=buried,
        error=str(error),
    )


def log_nack_answer_lost(nacks: int, sent_again: int, error: BaseException) -> None:
    """A batch of ``nacks`` lost its answer with its connection; its driver sent it again, and
    the nacks that had not landed the first time (``sent_again``) landed then. Logged alike by
    every driver."""
    log_event(
        logging.WARNING,
        "jobs.nack.answer-lost",
        nacks=nacks,
        sent_again=sent_again,
        error=str(error),
    )
