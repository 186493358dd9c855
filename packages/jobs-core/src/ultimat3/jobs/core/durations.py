"""Durations as users write them: ``timedelta``, float seconds, or ``'250ms' '10s' '3d'``."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import TypeAlias

from .errors import InvariantError

__all__ = ["Duration", "parse_duration"]

Duration: TypeAlias = timedelta | float | int | str

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")


def parse_duration(value: Duration, *, field: str = "duration") -> float:
    """Seconds as a finite float; a malformed or non-finite value is ``X_INVARIANT``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise InvariantError(f"{field} must be a duration, not a bool", meta={"field": field})
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            raise InvariantError(
                f"{field}={value!r} is not a duration; write '250ms', '10s', '5m', '3h' or '3d'",
                meta={"field": field, "value": value},
            )
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise InvariantError(f"{field} must be a duration, got {type(value).__name__}")
    if not math.isfinite(seconds):
        raise InvariantError(f"{field} must be finite, got {value!r}", meta={"field": field})
    return seconds
