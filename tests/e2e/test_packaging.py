"""Each package builds a wheel on its own, and every extra of the meta-distribution resolves to
exactly the packages it names — from a folder of wheels, with no direct-URL dependencies."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["core", "pg", "redis", "webhook", "testing"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    for source in [ROOT, *(ROOT / "packages" / f"jobs-{p}" for p in PACKAGES)]:
        subprocess.run(
            [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(folder)],
            cwd=source,
            check=True,
            capture_output=True,
        )
    return folder


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode()


def test_every_package_ships_its_one_import_name_under_pep420_namespaces(wheels: Path) -> None:
    for package in PACKAGES:
        [wheel] = wheels.glob(f"ultimat3_jobs_{package}-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            modules = {n for n in archive.namelist() if n.endswith(".py")}
        assert modules, package
        assert all(m.startswith(f"ultimat3/jobs/{package}/") for m in modules), package
        assert f"ultimat3/jobs/{package}/py.typed" in archive.namelist()


def test_no_published_metadata_has_a_direct_url_dependency(wheels: Path) -> None:
    for wheel in wheels.glob("*.whl"):
        requires = [
            line for line in _metadata(wheel).splitlines() if line.startswith("Requires-Dist:")
        ]
        assert not any(" @ " in line for line in requires), (wheel.name, requires)


def _resolved(wheels: Path, requirement: str) -> set[str]:
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--report",
            "-",
            "--find-links",
            str(wheels),
            requirement,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    installed = json.loads(report.stdout)["install"]
    return {
        item["metadata"]["name"]
        for item in installed
        if item["metadata"]["name"].startswith("ultimat3")
    }


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("", {"core"}),
        ("[pg]", {"core", "pg"}),
        ("[redis]", {"core", "redis"}),
        ("[webhook]", {"core", "webhook"}),
        ("[testing]", {"core", "testing"}),
        ("[all]", set(PACKAGES)),
    ],
)
def test_an_extra_installs_exactly_core_and_what_it_names(
    wheels: Path, extra: str, expected: set[str]
) -> None:
    names = _resolved(wheels, f"ultimat3-jobs{extra}")
    assert names == {"ultimat3-jobs", *(f"ultimat3-jobs-{p}" for p in expected)}
