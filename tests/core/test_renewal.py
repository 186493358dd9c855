"""The renewal loop holds what it renews only while it renews it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.core.renewal import RenewalLoop


class Lease:
    """A lease this test drops before anything is due: nothing may call it."""

    async def renew(self) -> bool:
        raise AssertionError("a dropped entry was renewed")

    def refused(self) -> None:
        raise AssertionError("a dropped entry was refused")

    def lapsed(self) -> None:
        raise AssertionError("a dropped entry lapsed")

    def failed(self, error: BaseException) -> None:
        raise AssertionError("a dropped entry failed") from error


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """What is freed here is freed by reference counting alone, as it must be on the hot path:
    anything left for the cycle collector outlives the job by collections, not by nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def test_a_dropped_entry_lets_go_of_its_target_at_once(
    clock: FrozenClock, no_cycle_collector: None
) -> None:
    renewals = RenewalLoop(clock, interval=10, window=30)
    lease = Lease()
    gone = weakref.ref(lease)
    entry = renewals.add(lease)
    renewals.drop(entry)
    del lease
    assert gone() is None, "the heap still holds a dropped entry's target"
