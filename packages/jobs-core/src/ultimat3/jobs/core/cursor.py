"""Page cursors for ``list()``: opaque to callers, checked when handed back."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Literal

from .constants import DEFAULT_JOB_PAGE, MAX_JOB_PAGE
from .errors import JobPageInvalidError
from .model import JobFilter, JobRow

__all__ = ["job_cursor", "page_limit", "parse_cursor"]

_VERSION = "j1"


def job_cursor(row: JobRow) -> str:
    """The cursor naming ``row``'s place in newest-first order: ``(created_at, id)``."""
    raw = json.dumps([_VERSION, row.created_at.isoformat(), row.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def parse_cursor(cursor: str, *, which: Literal["after", "before"]) -> tuple[datetime, str]:
    """``(created_at, id)`` of a cursor a page produced; anything else is ``X_JOB_PAGE_INVALID``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        version, created, job_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        at = datetime.fromisoformat(created)
        # No page produced an id holding NUL: no store can hold one.
        if version != _VERSION or not isinstance(job_id, str) or "\x00" in job_id:
            raise ValueError(cursor)
        if at.tzinfo is None:
            raise ValueError(cursor)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise JobPageInvalidError(
            f"the {which} cursor {cursor!r} was not produced by a page; "
            "pass job_cursor(row) of a row a page returned",
            meta={"cursor": which},
        ) from exc
    return at, job_id


def page_limit(filter: JobFilter) -> int:
    """The page size asked for, checked against ``MAX_JOB_PAGE``."""
    if filter.after is not None and filter.before is not None:
        raise JobPageInvalidError("pass after or before, never both", meta={"cursor": "after"})
    limit = DEFAULT_JOB_PAGE if filter.limit is None else filter.limit
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_JOB_PAGE:
        raise JobPageInvalidError(
            f"limit={filter.limit!r} is outside 1..{MAX_JOB_PAGE}; page with cursors instead",
            meta={"limit": filter.limit},
        )
    return limit
