"""A worker process keeps the garbage collector off what it built before its worker started."""

from __future__ import annotations

import gc

from ultimat3.jobs.core.heap import freeze_startup_heap


def test_the_heap_alive_at_start_is_frozen_once_per_process() -> None:
    freeze_startup_heap()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    made_later = [[n] for n in range(1_000)]  # a second freeze would take these in
    freeze_startup_heap()
    assert gc.get_freeze_count() == frozen, len(made_later)
