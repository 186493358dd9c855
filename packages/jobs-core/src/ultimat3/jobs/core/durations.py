"""Durations as users write them: ``timedelta``, float seconds, or ``'250ms' '10s' '3d'``."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import TypeAlias

from .errors import InvariantError

__all__ = ["MAX_DURATION_S", "Duration", "parse_duration"]

Duration: TypeAlias = timedelta | float | int | str

MAX_DURATION_S = 100 * 365.25 * 86400
"""The longest duration anything takes, either way (a century): far past any wait a job means,
and short enough that now plus it is a time every driver holds exactly (Redis keeps times as
microseconds in a double, exact until 2255). ``timedelta.max`` or ``10**12`` written for "no
ceiling" is refused where it is declared, instead of failing every attempt that adds it to now."""

_BEYOND = 10**18
"""An int past this is past ``MAX_DURATION_S`` whatever its size: clamped to it before it is
made a float, which a 310-digit int would overflow."""
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")


def parse_duration(value: Duration, *, field: str = "duration") -> float:
    """Seconds as a finite float within ``MAX_DURATION_S`` either way; a malformed value, or one
    past that, is ``X_INVARIANT``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise InvariantError(f"{field} must be a duration, not a bool", meta={"field": field})
    elif isinstance(value, int):
        seconds = float(max(-_BEYOND, min(value, _BEYOND)))  # an int past a float's range
    elif isinstance(value, float):
        seconds = value
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
    if abs(seconds) > MAX_DURATION_S:
        raise InvariantError(
            f"{field}={value!r:.40} is longer than a century, the longest duration taken; omit "
            "it where it stands for no limit",
            meta={"field": field},
        )
    return seconds
