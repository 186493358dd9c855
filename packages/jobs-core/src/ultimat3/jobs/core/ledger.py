"""What every backfill ledger takes, checked and put in its stored form once, here.

Each ledger (memory, Postgres, Redis) calls these before it stores or looks anything up, so the
three refuse the same arguments with the same code (``X_INVARIANT``) and store the same value:
a cursor is kept in its JSON form, a copy of what the caller passed; a name no ledger can store
names no pass; a failure's text is spelled so every ledger can keep it.
"""

from __future__ import annotations

from .constants import MAX_NAME_BYTES
from .errors import InvariantError
from .jsonvalue import storable_form, storable_name, stored_json
from .model import JsonValue

__all__ = [
    "ledger_cursor",
    "ledger_error",
    "ledger_limit",
    "ledger_rows",
    "ledger_text",
    "names_a_pass",
]


def ledger_text(value: object, field: str, *, empty: bool = False) -> str:
    """A name, run id, checksum or app version to write: a string every ledger stores and keys
    a row by (``storable_name``), and not empty unless ``empty``."""
    if not isinstance(value, str) or (not value and not empty) or not storable_name(value):
        raise InvariantError(
            f"a backfill pass's {field} must be a{'' if empty else ' non-empty'} string of at "
            f"most {MAX_NAME_BYTES} bytes with no NUL character and no lone surrogate, got "
            f"{value!r:.80}",
            meta={"field": field},
        )
    return value


def names_a_pass(value: str | None) -> bool:
    """Whether a name, run id or status looked up can name a stored pass: one no ledger could
    have stored names none, and every ledger answers so (no pass, no row changed)."""
    return value is None or storable_name(value)


def ledger_rows(rows: object) -> int:
    """The rows a pass has swept: a whole number, zero or more."""
    if type(rows) is not int or rows < 0:
        raise InvariantError(
            f"a backfill pass's rows must be a whole number, zero or more, got {rows!r:.80}",
            meta={"field": "rows"},
        )
    return rows


def ledger_cursor(cursor: object) -> JsonValue:
    """The cursor as every ledger stores and answers it: its JSON form (a tuple reads back as a
    list), a copy of the caller's value (``stored_json``)."""
    return stored_json(cursor, "a backfill cursor", "cursor")


def ledger_error(error: object) -> str:
    """A failure's text, spelled so every ledger keeps it (``storable_form``)."""
    if not isinstance(error, str):
        raise InvariantError(
            f"a backfill pass's error must be a string, got {error!r:.80}",
            meta={"field": "error"},
        )
    return storable_form(error)


def ledger_limit(limit: object) -> int:
    """How many passes ``list`` answers: a whole number, one or more."""
    if type(limit) is not int or limit < 1:
        raise InvariantError(
            f"a backfill listing's limit must be a whole number, one or more, got {limit!r:.80}",
            meta={"field": "limit"},
        )
    return limit
