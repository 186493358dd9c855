"""The entry a driver author uses: the README's one-file wiring runs as written, in pytest-asyncio's
strict mode, and skips what the target does not offer, naming it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ultimat3.jobs.testing.conformance.stateful import EXAMPLES_ENV, STEPS_ENV, _env_count

pytest_plugins = ["pytester"]

README = Path(__file__).parents[2] / "packages" / "jobs-testing" / "README.md"

ACME_JOBS = '''
"""A stand-in for a third party's driver package: the memory driver under another name."""

from pathlib import Path

from ultimat3.jobs.core import FrozenClock
from ultimat3.jobs.core.memory import MemoryJobDriver


class AcmeJobDriver(MemoryJobDriver):
    def __init__(self, path: Path, *, clock: FrozenClock) -> None:
        super().__init__(clock=clock)
        self.path = path

    async def reset(self) -> None:
        AcmeJobDriver.__init__(self, self.path, clock=self.clock)


def acme_job_driver(path: Path, *, clock: FrozenClock) -> AcmeJobDriver:
    return AcmeJobDriver(path, clock=clock)
'''


def _readme_wiring() -> str:
    section = README.read_text().split("## Prove your driver conforms", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README lost its wiring example"
    return match.group(1)


def test_the_readme_wiring_runs_the_suite_as_written(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EXAMPLES_ENV, "3")
    monkeypatch.setenv(STEPS_ENV, "10")
    pytester.makepyfile(acme_jobs=ACME_JOBS, test_driver_conformance=_readme_wiring())
    pytester.syspathinsert()
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-o", "asyncio_default_fixture_loop_scope=function", "-rs", "-q"
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()[-3000:]
    assert outcomes.get("errors", 0) == 0
    assert outcomes["passed"] > 200
    result.stdout.fnmatch_lines(
        [
            "*the target offers no outbox store (ConformanceTarget.outbox)",
            "*the target offers no scheduler state (ConformanceTarget.scheduler_state)",
            "*the target offers no leader (ConformanceTarget.leader)",
        ],
        consecutive=False,
    )


def test_a_malformed_example_count_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EXAMPLES_ENV, "lots")
    with pytest.raises(ValueError, match="UJOBS_CONFORMANCE_EXAMPLES='lots' is not a whole number"):
        _env_count(EXAMPLES_ENV, 25)


def test_example_counts_default_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EXAMPLES_ENV, raising=False)
    assert _env_count(EXAMPLES_ENV, 25) == 25
