"""JSON values as drivers store them: the round trip every step output takes, and containment."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import date, datetime
from enum import Enum
from typing import Any
from uuid import UUID

from .model import JsonValue

__all__ = ["json_contains", "json_roundtrip", "to_json"]


def json_roundtrip(value: Any) -> JsonValue:
    """``value`` as it reads back from storage; raises ``TypeError``/``ValueError`` if it cannot
    be stored. Pydantic models and dataclasses are dumped to their JSON form first."""
    return json.loads(_ENCODER.encode(to_json(value)))


def to_json(value: Any) -> JsonValue:
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(_ENCODER.encode(value))


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


_ENCODER = json.JSONEncoder(default=_default, allow_nan=False)
"""Built once: ``json.dumps`` given any option builds a new encoder per call (a third of the
round trip every enqueue and step output pays)."""
