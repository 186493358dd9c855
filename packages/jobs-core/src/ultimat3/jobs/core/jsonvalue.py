"""JSON values as drivers store them: the round trip every step output takes, and containment."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from datetime import date, datetime
from enum import Enum
from typing import Any, TypeGuard, cast
from uuid import UUID

from .constants import MAX_JSON_DEPTH, MAX_NAME_BYTES
from .errors import InvariantError
from .model import JsonValue

__all__ = [
    "json_contains",
    "json_roundtrip",
    "json_text",
    "storable_form",
    "storable_name",
    "storable_strings",
    "storable_text",
    "stored_json",
]


def storable_text(text: str) -> bool:
    """Whether every driver can store ``text``: Postgres keeps no NUL character in a text
    column (nor in jsonb), and a lone surrogate has no UTF-8 form. Refused before it reaches a
    driver, rather than by one driver's statement and not by another's."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def storable_name(text: str, max_bytes: int = MAX_NAME_BYTES) -> bool:
    """Whether ``text`` can key a row on every driver: ``storable_text``, and no longer than
    ``max_bytes`` in UTF-8, which the indexes holding it bound."""
    if not storable_text(text):
        return False
    return len(text) <= max_bytes if text.isascii() else len(text.encode()) <= max_bytes


def storable_form(text: str) -> str:
    """``text`` as every driver can store it: a NUL character spelled ``\\x00`` and a lone
    surrogate as its ``\\udcXX`` escape, everything else kept. For text written for a reader,
    not matched against (an error message, which may carry bytes a job decoded leniently)."""
    if storable_text(text):
        return text
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def stored_json(value: object, what: str, field: str) -> JsonValue:
    """``value`` as every driver stores it (``json_roundtrip``), refused (``X_INVARIANT``, with
    ``field``) when it has no JSON form, or a string in it, key or value, holds a NUL character
    or a lone surrogate, which Postgres keeps in no jsonb. ``what`` names it in the message."""
    try:
        stored = json_roundtrip(value)
    except (TypeError, ValueError) as exc:
        raise InvariantError(f"{what} must be a JSON value: {exc}", meta={"field": field}) from exc
    if not storable_strings(stored):
        raise InvariantError(
            f"{what} holds a string with a NUL character or a lone surrogate, which no driver "
            "stores; encode such bytes (base64, say) first",
            meta={"field": field},
        )
    return stored


def storable_strings(value: JsonValue) -> bool:
    """Whether every string in ``value``, keys included, is ``storable_text``."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return all(storable_text(k) and storable_strings(v) for k, v in value.items())
    if isinstance(value, list):
        return all(storable_strings(item) for item in value)
    return True


def json_text(value: JsonValue) -> str:
    """``value`` (already a JSON value) as compact JSON text, the form drivers store and send."""
    return _TEXT.encode(value)


def json_roundtrip(value: Any) -> JsonValue:
    """``value`` as it reads back from storage: its JSON form (a pydantic model or a dataclass
    dumped first), a copy that shares nothing with it. ``ValueError`` (or ``TypeError``) when
    no driver could store it: a NaN, an int past what JSON text holds, or nesting deeper than
    ``MAX_JSON_DEPTH``, which every driver then refuses alike."""
    if _is_flat(value):
        return dict(value)
    if _is_model(value):
        value = value.model_dump(mode="json")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        text = _ENCODER.encode(value)
        stored = json.loads(text)
    except RecursionError:
        raise ValueError(f"the value nests deeper than {MAX_JSON_DEPTH} levels") from None
    # Each level needs a bracket of its own: a text with fewer cannot nest too deep.
    brackets = text.count("[") + text.count("{")
    if brackets > MAX_JSON_DEPTH and _nests_deeper(stored, MAX_JSON_DEPTH):
        raise ValueError(f"the value nests deeper than {MAX_JSON_DEPTH} levels")
    return cast(JsonValue, stored)


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` (a JSON value) holds containers more than ``limit`` levels deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)
    return False


def _is_model(value: Any) -> bool:
    """A pydantic model instance (anything with a callable ``model_dump``), not its class."""
    return callable(getattr(value, "model_dump", None)) and not isinstance(value, type)


_SCALARS = frozenset({str, bool, type(None)})
_INT_BOUND = 10**4000
"""An int past this takes the encoder's path, which refuses one past what Python writes as
text (4,300 digits): copied as it is, it would be stored by one driver and refused by others."""


def _is_flat(value: Any) -> TypeGuard[dict[str, JsonValue]]:
    """A plain dict of str keys and scalar values, which the JSON round trip would hand back as
    an equal copy: most inputs and outputs are, and copying them costs a tenth of encoding and
    decoding. (Subclasses such as enums are not exact types here: they take the round trip.)"""
    if type(value) is not dict:
        return False
    for key, item in value.items():
        if type(key) is not str:
            return False
        kind = type(item)
        if kind in _SCALARS:
            continue
        if kind is int:
            if not -_INT_BOUND < item < _INT_BOUND:
                return False
        elif not (kind is float and math.isfinite(item)):
            return False
    return True


def _default(value: Any) -> JsonValue:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_contains(value: JsonValue, pattern: JsonValue) -> bool:
    """Postgres ``jsonb @>`` semantics: objects by subset, arrays by element containment,
    scalars by equality."""
    if isinstance(pattern, Mapping):
        return isinstance(value, Mapping) and all(
            key in value and json_contains(value[key], sub) for key, sub in pattern.items()
        )
    if isinstance(pattern, list):
        if not isinstance(value, list):
            return False
        return all(any(json_contains(item, sub) for item in value) for sub in pattern)
    if isinstance(value, bool) or isinstance(pattern, bool):
        return value is pattern
    return bool(value == pattern)


_ENCODER = json.JSONEncoder(default=_default, allow_nan=False, separators=(",", ":"))
"""Built once: ``json.dumps`` given any option builds a new encoder per call (a third of the
round trip every enqueue and step output pays)."""
_TEXT = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
"""``json_text``'s encoder, built once for the same reason; it converts nothing, so a value that
is not JSON is refused rather than stored in another form."""
