"""The schema: one idempotent statement, applied by install() and by `ujobs migrate`."""

from __future__ import annotations

import asyncio
import inspect
import json

import psycopg
import pytest

from ultimat3.jobs.core import DriverUnavailableError, EnqueueRequest, StepRecord, new_id
from ultimat3.jobs.core.cli import driver_for_url, main
from ultimat3.jobs.pg import (
    SQL_JOBS_TABLE,
    PostgresJobDriver,
    install,
    postgres_job_driver,
    sql_backfills,
    sql_claim,
    sql_counters,
    sql_enqueue,
    sql_leases,
    sql_operator,
    sql_outbox,
    sql_pauses,
    sql_read,
    sql_reset,
    sql_scheduler,
    sql_schema,
    sql_settle,
    sql_tasks,
    sql_wake,
    sql_workers,
)
from ultimat3.jobs.pg.rows import step_record

pytestmark = pytest.mark.pg

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/none"
"""A URL nothing listens on: port 1 refuses at once."""

TABLES = {
    "x_jobs",
    "x_job_steps",
    "x_job_leases",
    "x_workers",
    "x_job_counters",
    "x_queue_pauses",
    "x_task_pauses",
    "x_task_fires",
    "x_scheduler_watermarks",
    "x_scheduler_leader",
    "x_outbox",
    "x_backfills",
    "x_job_events",
}


def tables_of(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("select tablename from pg_tables where schemaname = 'public'")
        return {row[0] for row in rows}


async def test_install_creates_every_table(pg_url: str) -> None:
    assert tables_of(pg_url) >= TABLES


def schema_and_rows_of(url: str) -> tuple[object, ...]:
    """Every index and constraint of the public schema, as their definitions, and the jobs."""
    with psycopg.connect(url) as conn:
        indexes = conn.execute(
            "select indexname, indexdef from pg_indexes where schemaname = 'public' order by 1"
        ).fetchall()
        constraints = conn.execute(
            "select conname, pg_get_constraintdef(oid) from pg_constraint"
            " where connamespace = 'public'::regnamespace order by 1"
        ).fetchall()
        jobs = conn.execute("select * from x_jobs order by id").fetchall()
        steps = conn.execute("select * from x_job_steps order by run_id, name").fetchall()
    return tables_of(url), indexes, constraints, jobs, steps


async def test_install_twice_changes_nothing(pg_url: str, driver: PostgresJobDriver) -> None:
    now = driver.clock.now()
    queued = await driver.enqueue(
        EnqueueRequest(new_id(), new_id(), "n", "q", {"a": 1}, "k", None, 3, now)
    )
    (job,) = (await driver.claim(worker_id="w", slots={"q": 1}, visibility_timeout=30)).jobs
    assert await driver.save_step(job.id, job.claim, job.run_id, StepRecord("s", 0, {"ok": 1}))
    before = schema_and_rows_of(pg_url)
    _, indexes, constraints, jobs, steps = before
    assert indexes
    assert constraints
    assert (len(jobs), len(steps)) == (1, 1)
    await install(pg_url)
    assert schema_and_rows_of(pg_url) == before
    assert (await driver.introspect.get(queued.id)) is not None


async def test_installs_racing_from_several_processes_all_succeed(pg_database_url: str) -> None:
    await asyncio.gather(*(install(pg_database_url) for _ in range(4)))
    assert tables_of(pg_database_url) >= TABLES


def test_ujobs_migrate_applies_the_schema(pg_database_url: str) -> None:
    assert main(["migrate", "--database-url", pg_database_url]) == 0
    assert tables_of(pg_database_url) >= TABLES


def test_ujobs_migrate_reads_database_url_from_the_environment(
    pg_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", pg_database_url)
    assert main(["migrate"]) == 0
    assert tables_of(pg_database_url) >= TABLES


def test_ujobs_migrate_takes_the_url_every_command_takes(pg_database_url: str) -> None:
    assert main(["--url", as_url(pg_database_url), "migrate"]) == 0
    assert tables_of(pg_database_url) >= TABLES


def test_ujobs_migrate_refuses_the_url_of_another_backend(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--url", "redis://127.0.0.1:6379/0", "migrate"]) == 1
    assert "X_DRIVER_UNAVAILABLE: redis:// is not a Postgres URL" in capsys.readouterr().err


def test_ujobs_migrate_takes_the_common_options_after_it_and_answers_json(
    pg_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--url", as_url(pg_database_url), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"migrated": True}
    assert tables_of(pg_database_url) >= TABLES


async def test_a_server_that_refuses_the_write_is_one_answer_not_a_traceback(
    pg_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A read-only server (a standby): the server's own refusal, in the shape of every error."""
    await install(pg_database_url)
    read_only = as_url(pg_database_url) + "?options=-c%20default_transaction_read_only%3Don"
    argv = ["--url", read_only, "--json", "queues", "pause", "q"]
    assert await asyncio.to_thread(main, argv) == 1
    answer = json.loads(capsys.readouterr().out)
    assert (answer["code"], answer["meta"]) == (None, {"error": "ReadOnlySqlTransaction"})


def test_ujobs_migrate_without_a_url_answers_its_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["migrate", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["code"] == "X_DRIVER_UNAVAILABLE"


@pytest.mark.parametrize("argv", [["migrate", "--database-url", UNREACHABLE], ["queues"]])
def test_ujobs_names_why_it_could_not_connect_at_once(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """One direct attempt, not the pool's 30 s of retries; the cause is libpq's own words."""
    assert main(["--url", UNREACHABLE, *argv]) == 1
    said = capsys.readouterr().err
    assert "X_DRIVER_UNAVAILABLE: could not connect to Postgres" in said
    assert "port 1 failed" in said


async def test_a_database_without_the_schema_says_how_to_install_it(
    pg_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = postgres_job_driver(pg_database_url)
    with pytest.raises(DriverUnavailableError, match="lacks the ultimat3-jobs schema") as caught:
        await driver.stats()
    await driver.close()
    assert "ujobs migrate" in str(caught.value)
    assert await asyncio.to_thread(main, ["--url", as_url(pg_database_url), "queues"]) == 1
    assert "ujobs migrate" in capsys.readouterr().err


async def test_the_counter_rollup_on_a_database_without_the_schema_says_how_to_install_it(
    pg_database_url: str,
) -> None:
    """Every worker folds the counters once a minute: its failure names the fix too."""
    driver = postgres_job_driver(pg_database_url)
    with pytest.raises(DriverUnavailableError, match="lacks the ultimat3-jobs schema"):
        await driver.introspect.rollup_counters()
    await driver.close()


STEPS_BEFORE_KINDS = """
create table x_job_steps (
    run_id    text collate "C" not null,
    name      text collate "C" not null,
    seq       integer not null,
    output    json not null,
    completed boolean not null default true,
    saved_at  timestamptz not null,
    primary key (run_id, name)
);
insert into x_job_steps (run_id, name, seq, output, completed, saved_at)
values ('run-1', 'charge', 0, '"charged"', true, '2026-03-02T09:00:00Z');
"""
"""x_job_steps as installs made it before steps carried their kind, with one step in it."""


async def test_install_adds_the_step_kind_to_a_database_made_before_it(
    pg_database_url: str,
) -> None:
    """The steps a run stored before the upgrade stay, kindless, which any kind of step
    replays; installing again adds nothing more."""
    with psycopg.connect(pg_database_url) as conn:
        conn.execute(STEPS_BEFORE_KINDS)
    await install(pg_database_url)
    await install(pg_database_url)
    with psycopg.connect(pg_database_url) as conn:
        rows = conn.execute(sql_read.SQL_JOB_STEPS, {"run_id": "run-1"}).fetchall()
        checks = conn.execute(
            "select count(*) from pg_constraint "
            "where conrelid = 'x_job_steps'::regclass and contype = 'c'"
        ).fetchone()
    assert [step_record(*row) for row in rows] == [StepRecord("charge", 0, "charged")]
    assert checks == (1,)


def as_url(conninfo: str) -> str:
    """A ``key=value`` conninfo (as the fixtures give) as the URL an operator passes."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    return "postgresql://{user}@{host}:{port}/{dbname}".format(
        user=params.get("user", "postgres"),
        host=params.get("host", "127.0.0.1"),
        port=params.get("port", 5432),
        dbname=params["dbname"],
    )


async def test_a_postgres_url_finds_this_driver(pg_url: str) -> None:
    driver = await driver_for_url(as_url(pg_url))
    try:
        assert isinstance(driver, PostgresJobDriver)
        assert await driver.stats() == []
    finally:
        await driver.close()


STATEMENT_MODULES = (
    sql_backfills,
    sql_claim,
    sql_counters,
    sql_enqueue,
    sql_leases,
    sql_operator,
    sql_outbox,
    sql_pauses,
    sql_read,
    sql_reset,
    sql_scheduler,
    sql_schema,
    sql_settle,
    sql_tasks,
    sql_wake,
    sql_workers,
)
"""Every module of statements but sql_events: the event bus runs on the database's clock by
design."""


def statements() -> list[tuple[str, str]]:
    return [
        (name, value)
        for module in STATEMENT_MODULES
        for name, value in inspect.getmembers(module)
        if name.startswith("SQL_") and isinstance(value, str)
    ]


@pytest.mark.parametrize(("name", "text"), statements())
def test_no_statement_reads_the_servers_clock(name: str, text: str) -> None:
    lowered = text.lower()
    for server_clock in ("now()", "current_timestamp", "clock_timestamp", "localtimestamp"):
        assert server_clock not in lowered, f"{name} reads the server's clock ({server_clock})"


def test_the_schema_is_one_statement_every_table_in_it() -> None:
    for table in TABLES:
        assert f"create table if not exists {table} (" in SQL_JOBS_TABLE
