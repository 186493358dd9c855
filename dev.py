#!/usr/bin/env python3
"""One command per task on a fresh machine with only Python 3.11+ and pip.

    python3 dev.py demo        the onboarding demo on the embedded (memory) driver
    python3 dev.py test        every test (Postgres/Redis tests skip, saying why, without servers)
    python3 dev.py lint        ruff check, ruff format --check, mypy --strict
    python3 dev.py bench       the benchmarks in bench/ (needs Postgres and Redis)

Each creates ./.venv on first use and installs the workspace into it (editable), re-installing
only when a pyproject.toml or constraints-dev.txt changes. The development tools and client
libraries are held to the versions in constraints-dev.txt, the ones the checks last passed with;
UJOBS_NEWEST=1 installs the newest releases instead. Extra arguments go to the underlying tool.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
CONSTRAINTS = ROOT / "constraints-dev.txt"

CORE = ["-e", f"{ROOT / 'packages/jobs-core'}[cron,pydantic]"]
WORKSPACE = [
    *CORE,
    "-e",
    str(ROOT / "packages/jobs-pg"),
    "-e",
    str(ROOT / "packages/jobs-redis"),
    "-e",
    str(ROOT / "packages/jobs-webhook"),
    "-e",
    f"{ROOT / 'packages/jobs-testing'}[pg,redis,containers]",
]


def _dev_group() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return list(tomllib.load(handle)["dependency-groups"]["dev"])


def _constraints() -> list[str]:
    """pip's arguments holding the install to constraints-dev.txt, unless UJOBS_NEWEST is set."""
    if os.environ.get("UJOBS_NEWEST") or not CONSTRAINTS.exists():
        return []
    return ["--constraint", str(CONSTRAINTS)]


def _fingerprint(profile: str) -> str:
    digest = hashlib.sha256(profile.encode())
    for path in sorted(ROOT.glob("**/pyproject.toml")):
        if ".venv" not in path.parts:
            digest.update(path.read_bytes())
    if _constraints():
        digest.update(CONSTRAINTS.read_bytes())
    else:
        digest.update(b"newest")
    return digest.hexdigest()


def _current(profile: str) -> bool:
    """Whether ``profile`` was installed from the pyproject files as they are now."""
    stamp = VENV / f".installed-{profile}"
    return stamp.exists() and stamp.read_text() == _fingerprint(profile)


def ensure(profile: str) -> None:
    """Create the venv and install ``profile`` ('core' or 'all') unless already current."""
    if PYTHON.exists() and (_current(profile) or (profile == "core" and _current("all"))):
        return  # 'all' holds core
    if not _has_pip():  # absent, or left half-made by a create that failed at ensurepip
        print("dev.py: creating .venv", flush=True)
        try:
            venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
        except subprocess.CalledProcessError:
            sys.exit(
                "dev.py: this Python cannot make a virtualenv with pip in it; install its venv "
                "module (on Debian or Ubuntu: apt install python3-venv) and run dev.py again"
            )
    print(f"dev.py: installing the workspace ({profile}) into .venv", flush=True)
    packages = CORE if profile == "core" else [*WORKSPACE, *_dev_group()]
    subprocess.run(
        [
            str(PYTHON),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *_constraints(),
            *packages,
        ],
        check=True,
    )
    (VENV / f".installed-{profile}").write_text(_fingerprint(profile))


def _has_pip() -> bool:
    if not PYTHON.exists():
        return False
    probe = [str(PYTHON), "-m", "pip", "--version"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def run(*command: str) -> int:
    return subprocess.run([str(PYTHON), *command], cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "lint", "bench"}:
        print(__doc__)
        return 2
    task, rest = argv[0], argv[1:]
    if task == "demo":
        ensure("core")
        return run(str(ROOT / "examples/onboarding.py"), "--sleep", "2s", *rest)
    ensure("all")
    if task == "test":
        return run("-m", "pytest", *rest)
    if task == "bench":
        return run(str(ROOT / "bench/run.py"), *rest)
    checks = (["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy", "--strict"])
    for command in checks:
        code = run("-m", *command)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
