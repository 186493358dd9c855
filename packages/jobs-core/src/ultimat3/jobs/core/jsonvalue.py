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

from .constants import MAX_NAME_BYTES
from .model import JsonValue

__all__ = [
    "json_contains",
    "json_roundtrip",
    "json_text",
    "storable_form",
    "storable_name",
    "storable_strings",
    "storable_text",
    "to_json",
]


def json_roundtrip(value: Any) -> JsonValue:
    """``value`` as it reads back from storage; raises ``TypeError``/``ValueError`` if it cannot
    be stored. Pydantic models and dataclasses are dumped to their JSON form first."""
    stored = to_json(value)
    # Only a model's dump has not been through JSON text yet; everything else already has.
    return json.loads(_ENCODER.encode(stored)) if _is_model(value) else stored


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


def to_json(value: Any) -> JsonValue:
    if _is_flat(value):
        return dict(value)
    if _is_model(value):
        return cast(JsonValue, value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(_ENCODER.encode(value))


def _is_model(value: Any) -> bool:
    """A pydantic model instance (anything with a callable ``model_dump``), not its class."""
    return callable(getattr(value, "model_dump", None)) and not isinstance(value, type)


_SCALARS = frozenset({str, int, bool, type(None)})


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
        if kind not in _SCALARS and not (kind is float and math.isfinite(item)):
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
