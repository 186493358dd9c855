"""Structured log events under the ``ultimat3.jobs`` logger: the event name is the message,
the fields ride in ``extra`` (namespaced under ``jobs`` so they never clash with LogRecord's own
attributes) and are appended to the message for plain handlers."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["LOGGER", "log_event"]

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
