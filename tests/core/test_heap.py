"""A worker process keeps the garbage collector's work per job small."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ultimat3.jobs.core import heap
from ultimat3.jobs.core.heap import YOUNG_COLLECTION_THRESHOLD, tune_collector_for_worker


@pytest.fixture
def thresholds() -> Iterator[None]:
    """The process's thresholds as they were, after a test that changes them."""
    saved = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_the_heap_alive_at_start_is_frozen_once_per_process() -> None:
    tune_collector_for_worker()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    made_later = [[n] for n in range(1_000)]  # a second freeze would take these in
    tune_collector_for_worker()
    assert gc.get_freeze_count() == frozen, len(made_later)


@pytest.mark.usefixtures("thresholds")
def test_young_collections_wait_longer_unless_the_process_chose_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(heap, "_tuned", False)
    gc.set_threshold(700, 10, 10)  # Python's defaults
    tune_collector_for_worker()
    assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, 10, 10)

    monkeypatch.setattr(heap, "_tuned", False)
    gc.set_threshold(2_000, 20, 5)  # the application's own
    tune_collector_for_worker()
    assert gc.get_threshold() == (2_000, 20, 5)
