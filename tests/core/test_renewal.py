"""The renewal loop holds what it renews only while it renews it."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest
from support.eventually import run_clock, settle, until

from ultimat3.jobs.core import FrozenClock, renewal
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


class OnTheWire:
    """A lease whose renewal stays on the wire until released, then comes back refused."""

    def __init__(self) -> None:
        self.sent = asyncio.Event()
        self.release = asyncio.Event()
        self.ended: str | None = None
        self.reported: list[str] = []

    async def renew(self) -> bool:
        self.sent.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise
        self.ended = "landed"
        return False

    def refused(self) -> None:
        self.reported.append("refused")

    def lapsed(self) -> None:
        self.reported.append("lapsed")

    def failed(self, error: BaseException) -> None:
        self.reported.append("failed")


async def renewing(clock: FrozenClock) -> tuple[RenewalLoop, OnTheWire]:
    """A started loop with one renewal on the wire."""
    renewals = RenewalLoop(clock, interval=10, window=30)
    renewals.start()
    lease = OnTheWire()
    renewals.add(lease)
    await run_clock(clock, 10)
    await until(lease.sent.is_set)
    return renewals, lease


async def test_stop_waits_for_the_renewal_on_the_wire_which_reports_nothing(
    clock: FrozenClock,
) -> None:
    renewals, lease = await renewing(clock)
    stopping = asyncio.create_task(renewals.stop())
    await settle()
    assert not stopping.done(), "stop() returned with a renewal still on the wire"
    lease.release.set()
    await stopping
    assert (lease.ended, lease.reported) == ("landed", [])


async def test_stop_cancels_a_renewal_still_on_the_wire_after_its_grace(
    clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(renewal, "STOP_GRACE_S", 0.05)
    renewals, lease = await renewing(clock)
    await asyncio.wait_for(renewals.stop(), 5)
    await settle()
    assert (lease.ended, lease.reported) == ("cancelled", [])
