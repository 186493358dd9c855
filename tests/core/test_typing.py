"""mypy refuses a job declared without idempotency_key or tenant."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

_HEADER = """
from dataclasses import dataclass
from ultimat3.jobs.core import job

@dataclass
class Ping:
    host: str

async def ping(*, input: Ping) -> None:
    return None
"""


def _check(tmp_path: Path, declaration: str) -> tuple[int, str]:
    source = tmp_path / "declared.py"
    source.write_text(textwrap.dedent(_HEADER) + textwrap.dedent(declaration))
    out, err, status = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / ".cache"), str(source)]
    )
    return status, out + err


@pytest.mark.slow
def test_mypy_rejects_missing_keys_and_accepts_a_full_declaration(tmp_path: Path) -> None:
    status, report = _check(
        tmp_path,
        """
        ok = job(input=Ping, idempotency_key=lambda i: i.host, tenant="none")(ping)
        no_key = job(input=Ping, tenant="none")(ping)
        no_tenant = job(input=Ping, idempotency_key=lambda i: i.host)(ping)
        """,
    )
    assert status == 1
    errors = [line for line in report.splitlines() if ": error:" in line]
    assert len(errors) == 2, report
    assert '"idempotency_key"' in errors[0]
    assert '"tenant"' in errors[1]
