"""The examples run as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_onboarding_demo_retries_replays_and_completes() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "onboarding.py"), "--sleep", "1s"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = done.stdout
    assert out.count("provisioning org") == 1
    assert "1. attempt 1 -> retried: provision ran, welcome-email failed" in out
    assert "provision replayed, welcome-email ran, nudge-wait suspended" in out
    assert "nudge ran" in out
    assert "final state: done" in out
