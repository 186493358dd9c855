"""ujobs over a driver's operator surface, in-process."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs.core import AckOptions, JobFilter, NackOptions, Retry, cli, job
from ultimat3.jobs.core.memory import MemoryJobDriver


@dataclass
class Report:
    name: str
    password: str = "hunter2"


@job(
    input=Report,
    idempotency_key=lambda i: f"report:{i.name}",
    tenant="none",
    retry=Retry(attempts=1),
)
async def build_report_for_cli(*, input: Report) -> None:
    return None


@pytest.fixture
def use_driver(driver: MemoryJobDriver, monkeypatch: pytest.MonkeyPatch) -> MemoryJobDriver:
    async def memory(url: str) -> MemoryJobDriver:
        return driver

    monkeypatch.setattr(cli, "driver_for_url", memory)
    return driver


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = cli.main(["--url", "memory://", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in argv else out


async def enqueue(name: str) -> str:
    return (await build_report_for_cli.enqueue(Report(name))).id


def test_jobs_list_json_pages_newest_first(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    ids = [asyncio.run(enqueue(n)) for n in ("a", "b", "c")]
    code, page = run(capsys, "jobs", "list", "--limit", "2", "--json")
    assert code == 0
    assert [row["id"] for row in page["rows"]] == [ids[2], ids[1]]


def test_jobs_list_json_carries_the_cursors_of_the_next_and_previous_pages(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    ids = [asyncio.run(enqueue(n)) for n in ("h", "i", "j")]
    code, first = run(capsys, "jobs", "list", "--limit", "2", "--json")
    assert (code, first["last"]) == (0, False)
    code, second = run(
        capsys, "jobs", "list", "--limit", "2", "--after", first["next_after"], "--json"
    )
    assert ([row["id"] for row in second["rows"]], second["last"]) == ([ids[0]], True)
    code, back = run(
        capsys, "jobs", "list", "--limit", "2", "--before", second["prev_before"], "--json"
    )
    assert [row["id"] for row in back["rows"]] == [ids[2], ids[1]]


def test_jobs_list_filters_by_created_window(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    job_id = asyncio.run(enqueue("k"))
    (row,) = asyncio.run(use_driver.introspect.list(JobFilter())).rows
    at, later = row.created_at.isoformat(), (row.created_at + timedelta(seconds=1)).isoformat()
    code, page = run(capsys, "jobs", "list", "--created-from", at, "--created-to", later, "--json")
    assert (code, [r["id"] for r in page["rows"]]) == (0, [job_id])
    code, page = run(capsys, "jobs", "list", "--created-from", later, "--json")
    assert (code, page["rows"]) == (0, [])
    with pytest.raises(SystemExit):
        cli.main(["--url", "memory://", "jobs", "list", "--created-from", "2026-01-01T00:00:00"])


def test_removing_an_unknown_id_answers_not_found(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    code, answer = run(capsys, "jobs", "remove", "nope", "--json")
    assert (code, answer["code"]) == (1, "X_JOB_NOT_FOUND")
    job_id = asyncio.run(enqueue("l"))
    code, answer = run(capsys, "jobs", "remove", job_id, "--json")
    assert (code, answer) == (0, {"removed": job_id})


def test_delete_is_another_name_for_remove(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    job_id = asyncio.run(enqueue("d"))
    code, answer = run(capsys, "jobs", "delete", job_id, "--json")
    assert (code, answer) == (0, {"removed": job_id})


def test_jobs_show_redacts_secrets(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    job_id = asyncio.run(enqueue("d"))
    code, shown = run(capsys, "jobs", "show", job_id, "--json")
    assert code == 0
    assert shown["row"]["input"] == {"name": "d", "password": "[redacted]"}


def test_jobs_show_prints_progress_as_it_was_reported(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from ultimat3.jobs.core import Progress

    async def report(progress: Progress) -> str:
        job_id = await enqueue(f"progress-{progress.total}")
        batch = await use_driver.claim(worker_id="w", slots={"default": 1}, visibility_timeout=30)
        claimed = batch.jobs[0]
        assert await use_driver.introspect.record_progress(job_id, claimed.claim, progress)
        return job_id

    counted = asyncio.run(report(Progress(done=3)))
    assert "\nprogress 3\n" in run(capsys, "jobs", "show", counted)[1]
    noted = asyncio.run(report(Progress(done=3, total=10, note="rows")))
    assert "\nprogress 3/10 rows\n" in run(capsys, "jobs", "show", noted)[1]


def test_every_command_that_prints_a_row_redacts_its_secrets(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not only show: list, cancel, retry and promote print rows too, as JSON and as text."""
    import asyncio

    job_id = asyncio.run(enqueue("s"))
    code, page = run(capsys, "jobs", "list", "--json")
    assert (code, page["rows"][0]["input"]) == (0, {"name": "s", "password": "[redacted]"})
    later = asyncio.run(build_report_for_cli.enqueue(Report("later"), delay=60)).id
    for argv in (("cancel", job_id), ("retry", job_id), ("promote", later)):
        code, row = run(capsys, "jobs", *argv, "--json")
        assert (code, row["input"]["password"]) == (0, "[redacted]"), (argv, row)
    for argv in (("list",), ("cancel", job_id)):
        code, text = run(capsys, "jobs", *argv)
        assert code == 0
        assert "hunter2" not in text, (argv, text)


def test_an_unknown_id_answers_its_code(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    code, answer = run(capsys, "jobs", "show", "nope", "--json")
    assert (code, answer["code"]) == (1, "X_JOB_NOT_FOUND")
    for command in ("retry", "promote", "remove"):
        code, other = run(capsys, "jobs", command, "nope", "--json")
        assert (code, other["message"]) == (1, answer["message"]), command


def test_cancel_then_retry_and_queue_pause(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    job_id = asyncio.run(enqueue("e"))
    assert run(capsys, "jobs", "cancel", job_id, "--reason", "runaway", "--json")[0] == 0
    code, answer = run(capsys, "jobs", "cancel", job_id, "--json")
    assert (code, answer["code"]) == (1, "X_JOB_NOT_CANCELLABLE")
    code, row = run(capsys, "jobs", "retry", job_id, "--json")
    assert (code, row["state"]) == (0, "ready")
    assert run(capsys, "queues", "pause", "default", "--json")[0] == 0
    code, queues = run(capsys, "queues", "--json")
    assert queues[0]["paused"] is True


def test_queues_prints_a_count_for_every_state(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """A queue holding only cancelled rows is not all zeros."""
    import asyncio

    job_id = asyncio.run(enqueue("cancelled-only"))
    assert run(capsys, "jobs", "cancel", job_id, "--json")[0] == 0
    code, out = run(capsys, "queues")
    assert (code, out) == (
        0,
        "default: ready 0 delayed 0 running 0 suspended 0 done 0 failed 0 dead 0 cancelled 1\n",
    )


def test_bulk_retry_moves_every_finished_row(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    for name in ("f", "g"):
        asyncio.run(use_driver.introspect.cancel(asyncio.run(enqueue(name))))
    code, result = run(capsys, "jobs", "retry-many", "--state", "cancelled", "--all", "--json")
    assert (code, result) == (0, {"affected": 2, "remaining": 0})


def test_a_url_no_installed_driver_handles_is_x_driver_unavailable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--url", "nosuch://x", "queues"]) == 1
    assert "X_DRIVER_UNAVAILABLE" in capsys.readouterr().err


async def settle_one(driver: MemoryJobDriver, name: str, *, ok: bool) -> None:
    """Enqueue, claim and settle one report: acked after 40 ms, or dead-lettered after 20."""
    await enqueue(name)
    claimed = (await driver.claim(worker_id="w", slots={"default": 1}, visibility_timeout=30)).jobs[
        0
    ]
    ref = claimed.claim
    if ok:
        await driver.ack(claimed.id, AckOptions(ref.worker_id, ref.claim, duration_ms=40))
    else:
        await driver.nack(
            claimed.id, NackOptions(ref.worker_id, ref.claim, dead_letter=True, duration_ms=20)
        )


def test_counters_print_each_jobs_settles_and_their_mean_duration(
    use_driver: MemoryJobDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    asyncio.run(settle_one(use_driver, "h", ok=True))
    asyncio.run(settle_one(use_driver, "i", ok=False))
    code, out = run(capsys, "counters")
    assert code == 0
    assert out == f"{build_report_for_cli.name}: done 1 retried 0 failed 0 dead 1, mean 30.0 ms\n"
    code, out = run(capsys, "counters", "--job", build_report_for_cli.name)
    assert out.endswith("(1 min): done 1 retried 0 failed 0 dead 1, mean 30.0 ms\n")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("workers",), "no live workers"),
        (("tasks", "fires"), "no task has fired"),
        (("counters",), "nothing settled since 1h"),
        (("queues",), "no queues"),
        (("jobs", "list"), "no jobs match"),
    ],
)
def test_an_empty_answer_says_so(
    use_driver: MemoryJobDriver,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    said: str,
) -> None:
    assert run(capsys, *argv) == (0, f"{said}\n")


APP = """
from ultimat3.jobs.core import job


@job(input=dict, idempotency_key=lambda i: "k", tenant="none", name="cli_manifest_probe")
async def probe(*, input: dict) -> None:
    return None
"""


def test_manifest_imports_the_app_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ``python -m`` finds it: a console script's own path leaves the directory out."""
    (tmp_path / "acme_cli_app.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "acme_cli_app", raising=False)
    code, manifest = run(capsys, "manifest", "--app", "acme_cli_app", "--json")
    assert code == 0
    assert "cli_manifest_probe" in [entry["name"] for entry in manifest["jobs"]]


def test_manifest_of_a_module_it_cannot_import_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["manifest", "--app", "no_such_app_module"]) == 2
    assert "cannot import 'no_such_app_module'" in capsys.readouterr().err


def test_a_backend_error_no_code_names_is_one_line_not_a_traceback(
    driver: MemoryJobDriver, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The backend's own refusal (here: a read-only server) is said in one line; with --json,
    in the shape every error has, its code None."""

    class ServerRefusedError(Exception):
        pass

    async def refusing(url: str) -> MemoryJobDriver:
        raise ServerRefusedError("cannot execute INSERT in a read-only transaction")

    monkeypatch.setattr(cli, "driver_for_url", refusing)
    assert cli.main(["--url", "memory://", "queues", "pause", "mail"]) == 1
    said = capsys.readouterr()
    assert said.err == (
        "ujobs: ServerRefusedError: cannot execute INSERT in a read-only transaction\n"
    )
    assert cli.main(["--url", "memory://", "--json", "queues", "pause", "mail"]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert (answer["code"], answer["meta"]) == (None, {"error": "ServerRefusedError"})


def test_a_reader_that_went_away_ends_the_command_quietly(
    use_driver: MemoryJobDriver, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ujobs … --json | head -1`: the pipe closed under the output is no traceback."""
    read, write = os.pipe()

    class ClosedPipe:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return write

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    try:
        assert cli.main(["--url", "memory://", "--json", "jobs", "list"]) == 1
    finally:
        os.close(read)
        os.close(write)
    assert capsys.readouterr().err == ""


def test_a_plugin_that_cannot_register_is_skipped_saying_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command plugin written for another signature takes no core command down."""

    def old_register(subparsers: Any) -> None:
        raise AssertionError("never called with one argument")

    class EntryPoint:
        name = "old"

        def load(self) -> Any:
            return old_register

    def plugins(*, group: str) -> list[EntryPoint]:
        return [EntryPoint()] if group == "ultimat3.jobs.commands" else []

    monkeypatch.setattr(cli, "entry_points", plugins)
    assert cli.main(["--url", "nosuch://x", "queues"]) == 1
    assert "skipping the 'old' commands" in capsys.readouterr().err
