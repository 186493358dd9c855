"""Counter buckets: which bucket a settle lands in, and how buckets fold into coarser tiers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from .constants import COUNTER_TIERS
from .model import CounterBucket

__all__ = ["bucket_start", "bucket_start_s", "rollup"]


def bucket_start(at: datetime, width_s: int) -> datetime:
    return datetime.fromtimestamp(bucket_start_s(at, width_s), UTC)


def bucket_start_s(at: datetime, width_s: int) -> int:
    """``bucket_start`` in whole seconds since the epoch: what a script call is handed, at a
    fifth of the cost of building the datetime."""
    epoch = int(at.timestamp())
    return epoch - epoch % width_s


def rollup(buckets: Iterable[CounterBucket], now: datetime) -> list[CounterBucket]:
    """The buckets after folding every bucket past its tier's retention into the next tier (and
    dropping those past the last tier). Idempotent: a second call changes nothing."""
    merged: dict[tuple[str, datetime, int], CounterBucket] = {}
    widths = [width for width, _ in COUNTER_TIERS]
    for bucket in buckets:
        width = bucket.width_s
        start = bucket.start
        while True:
            tier = widths.index(width)
            retention = COUNTER_TIERS[tier][1]
            if start + timedelta(seconds=width) > now - timedelta(seconds=retention):
                break
            if tier + 1 == len(widths):
                width = 0
                break
            width = widths[tier + 1]
            start = bucket_start(start, width)
        if width == 0:
            continue
        key = (bucket.name, start, width)
        held = merged.get(key)
        merged[key] = (
            replace(bucket, start=start, width_s=width) if held is None else held.merged(bucket)
        )
    return sorted(merged.values(), key=lambda b: (b.name, b.start, b.width_s))
