"""The state machine's session under an exception from outside a call: pytest-timeout's alarm
raises in the event loop's wait, between two of a call's awaits."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from types import FrameType
from typing import Any, cast

import pytest

from ultimat3.jobs.testing.conformance.stateful import _Session


class _CutOffError(Exception):
    """Raised by the alarm, as pytest-timeout's ``Failed`` is."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _CutOffError


def test_a_call_cut_off_from_outside_does_not_run_on_into_the_next_example(
    request: pytest.FixtureRequest,
) -> None:
    session = _Session(cast(Any, None), request)
    seen: list[str] = []

    async def compare() -> None:
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        seen.append("compared")

    previous = signal.signal(signal.SIGUSR1, _alarm)
    alarm = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        alarm.start()
        with pytest.raises(_CutOffError):
            session.run(compare())
        session.run(asyncio.sleep(0.4))  # the next example's calls, on the same loop
    finally:
        alarm.cancel()
        signal.signal(signal.SIGUSR1, previous)
        session.close()
    assert seen == ["cancelled"]
