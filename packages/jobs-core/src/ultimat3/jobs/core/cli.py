"""``ujobs``: the operator's command line over any driver's ``introspect``.

The driver comes from ``--url`` (else ``DATABASE_URL``, else ``REDIS_URL``), chosen by the URL's
scheme among installed drivers: a driver distribution registers ``driver_from_url`` under the
``ultimat3.jobs.drivers`` entry-point group, and may add subcommands (``migrate``) under
``ultimat3.jobs.commands``: a function given the subparsers and the parser of the options every
command takes (``--url``, ``--json``), to pass as ``parents``. Every command takes ``--json`` for
machine-readable output, and an error is one line (with ``--json``, one object with its code).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import urlsplit

from .cursor import job_cursor
from .durations import parse_duration
from .errors import DriverUnavailableError, JobsError
from .introspection import (
    cancel_job,
    inspect_job,
    inspect_manifest,
    inspect_queues,
    introspection_of,
    promote_job,
    redact,
    remove_job,
    retry_job,
    to_jsonable,
)
from .model import BulkFilter, CounterBucket, CounterTotals, JobFilter, JobRow, JobState
from .protocol import JobDriver
from .refusals import job_not_found

__all__ = ["driver_for_url", "main"]

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


async def driver_for_url(url: str) -> JobDriver:
    """The installed driver whose scheme ``url`` names."""
    scheme = urlsplit(url).scheme.split("+", 1)[0]
    found = {ep.name: ep for ep in entry_points(group="ultimat3.jobs.drivers")}
    if scheme not in found:
        known = ", ".join(sorted(found)) or "none installed"
        raise DriverUnavailableError(
            f"no installed driver handles {scheme!r} URLs (known: {known}); "
            "pip install 'ultimat3-jobs[pg]' or 'ultimat3-jobs[redis]'"
        )
    factory: Callable[[str], Awaitable[JobDriver]] = found[scheme].load()
    return await factory(url)


def _url(args: argparse.Namespace) -> str:
    url = (
        getattr(args, "url", None) or os.environ.get("DATABASE_URL") or os.environ.get("REDIS_URL")
    )
    if not url:
        raise DriverUnavailableError("pass --url, or set DATABASE_URL or REDIS_URL")
    return str(url)


def _emit(args: argparse.Namespace, value: Any, lines: Iterable[str]) -> None:
    """``value`` as JSON with ``--json``, else the human ``lines``."""
    if getattr(args, "json", False):
        json.dump(to_jsonable(value), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.writelines(f"{line}\n" for line in lines)


def _with_driver(run: Callable[[argparse.Namespace, JobDriver], Awaitable[int]]) -> Handler:
    async def handler(args: argparse.Namespace) -> int:
        driver = await driver_for_url(_url(args))
        try:
            return await run(args, driver)
        finally:
            await driver.close()

    return handler


# -- jobs -------------------------------------------------------------------------------------


async def _jobs_list(args: argparse.Namespace, driver: JobDriver) -> int:
    page = await introspection_of(driver).list(
        JobFilter(
            queue=args.queue,
            name=args.name,
            state=JobState(args.state) if args.state else None,
            tenant_id=args.tenant,
            id_prefix=args.id_prefix,
            created_from=args.created_from,
            created_to=args.created_to,
            limit=args.limit,
            after=args.after,
            before=args.before,
        )
    )

    lines = _or_none([_row_line(row) for row in page.rows], "no jobs match")
    if not page.last:
        lines.append(f"-- more: --after {job_cursor(page.rows[-1])}")
    # The cursors a JSON reader pages with (they are opaque: it cannot build them from a row).
    paged = {
        **to_jsonable(dataclasses.replace(page, rows=[_redacted(row) for row in page.rows])),
        "last": page.last,
        "next_after": job_cursor(page.rows[-1]) if page.rows else None,
        "prev_before": job_cursor(page.rows[0]) if page.rows else None,
    }
    _emit(args, paged, lines)
    return 0


async def _jobs_remove(args: argparse.Namespace, driver: JobDriver) -> int:
    if not await remove_job(driver, args.id):  # as show, retry and promote answer a typo
        raise job_not_found(args.id)
    _emit(args, {"removed": args.id}, [f"removed {args.id}"])
    return 0


async def _jobs_show(args: argparse.Namespace, driver: JobDriver) -> int:
    found = await inspect_job(driver, args.id)

    row = found.row
    lines = [
        f"{row.name} {row.id} [{row.state.value}] queue={row.queue}",
        f"run {row.run_id}  attempt {row.attempt}/{row.max_attempts}",
        f"input {json.dumps(row.input)}",
    ]
    lines += [
        f"  step {step.seq:>3} {step.kind or '?':<5} {step.name} "
        f"({'done' if step.completed else 'waiting'})"
        for step in found.steps
    ]
    if row.progress is not None:
        done = row.progress.done
        total = "" if row.progress.total is None else f"/{row.progress.total}"
        note = "" if row.progress.note is None else f" {row.progress.note}"
        lines.append(f"progress {done}{total}{note}")
    if row.last_error:
        lines.append(f"last error:\n{row.last_error}")
    _emit(args, found, lines)
    return 0


def _row_command(
    act: Callable[[argparse.Namespace, JobDriver], Awaitable[JobRow]],
) -> Callable[[argparse.Namespace, JobDriver], Awaitable[int]]:
    async def run(args: argparse.Namespace, driver: JobDriver) -> int:
        row = _redacted(await act(args, driver))
        _emit(args, row, [_row_line(row)])
        return 0

    return run


def _redacted(row: JobRow) -> JobRow:
    """A row as the CLI prints it: its input redacted, as ``show`` prints it."""
    return dataclasses.replace(row, input=redact(row.input))


def _row_line(row: JobRow) -> str:
    return (
        f"{row.id}  {row.state.value:<9} {row.queue:<12} {row.name:<24} "
        f"attempt {row.attempt}/{row.max_attempts}  {row.created_at:%Y-%m-%d %H:%M:%S}"
    )


def _bulk(member: str) -> Callable[[argparse.Namespace, JobDriver], Awaitable[int]]:
    async def run(args: argparse.Namespace, driver: JobDriver) -> int:
        introspect = introspection_of(driver)
        action = getattr(introspect, member)
        selection = BulkFilter(
            state=JobState(args.state), queue=args.queue, name=args.name, tenant_id=args.tenant
        )
        affected = 0
        while True:
            result = await action(selection)
            affected += result.affected
            if not args.all or result.remaining == 0 or result.affected == 0:
                break
        outcome = {"affected": affected, "remaining": result.remaining}
        _emit(args, outcome, [f"{affected} moved, {result.remaining} left"])
        return 0

    return run


# -- queues, tasks, workers, counters ---------------------------------------------------------


async def _queues(args: argparse.Namespace, driver: JobDriver) -> int:
    queues = await inspect_queues(driver)

    _emit(
        args,
        queues,
        _or_none(
            [
                f"{q.stats.queue}{' (paused)' if q.paused else ''}: ready {q.stats.ready} "
                f"delayed {q.stats.delayed} running {q.stats.running} suspended "
                f"{q.stats.suspended} done {q.stats.done} failed {q.stats.failed} "
                f"dead {q.stats.dead} cancelled {q.stats.cancelled}"
                for q in queues
            ],
            "no queues",
        ),
    )
    return 0


def _pause(kind: str, pause: bool) -> Callable[[argparse.Namespace, JobDriver], Awaitable[int]]:
    async def run(args: argparse.Namespace, driver: JobDriver) -> int:
        introspect = introspection_of(driver)
        verb = "pause" if pause else "resume"
        await getattr(introspect, f"{verb}_{kind}")(args.target)
        _emit(args, {kind: args.target, "paused": pause}, [f"{verb}d {kind} {args.target}"])
        return 0

    return run


async def _workers(args: argparse.Namespace, driver: JobDriver) -> int:
    workers = await introspection_of(driver).workers()

    _emit(
        args,
        workers,
        _or_none(
            [
                f"{w.id} on {w.host}: {len(w.in_flight)} in flight, queues "
                f"{', '.join(w.queues)}, last heartbeat {w.last_heartbeat:%Y-%m-%d %H:%M:%S}"
                for w in workers
            ],
            "no live workers",
        ),
    )
    return 0


async def _task_fires(args: argparse.Namespace, driver: JobDriver) -> int:
    fires = await introspection_of(driver).task_fires()
    _emit(
        args,
        fires,
        _or_none(
            [
                f"{f.task}: occurrence {_occurrence(f.occurrence_ms)}, "
                f"fired {f.fired_at:%Y-%m-%d %H:%M:%S}"
                for f in fires
            ],
            "no task has fired",
        ),
    )
    return 0


async def _counters(args: argparse.Namespace, driver: JobDriver) -> int:
    since = driver.clock.now() - timedelta(seconds=parse_duration(args.since, field="--since"))
    introspect = introspection_of(driver)
    result: Sequence[CounterBucket | CounterTotals]
    if args.job:
        result = await introspect.counters(args.job, since=since)
    else:
        result = await introspect.counter_totals(since=since)
    _emit(
        args,
        result,
        _or_none([_counts_line(item) for item in result], f"nothing settled since {args.since}"),
    )
    return 0


def _counts_line(counts: CounterBucket | CounterTotals) -> str:
    """One job's totals, or one bucket of its history: the settles by kind and their mean
    duration."""
    if isinstance(counts, CounterBucket):
        label = f"{counts.start:%Y-%m-%d %H:%M} ({counts.width_s // 60} min)"
    else:
        label = counts.name
    settled = counts.done + counts.retried + counts.failed + counts.dead
    mean = f", mean {counts.duration_ms / settled:.1f} ms" if settled else ""
    return (
        f"{label}: done {counts.done} retried {counts.retried} failed {counts.failed} "
        f"dead {counts.dead}{mean}"
    )


def _occurrence(ms: int) -> str:
    return f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M:%S}"


def _or_none(lines: list[str], none: str) -> list[str]:
    """``lines``, or one line saying there is nothing: an empty answer is not silence."""
    return lines or [none]


async def _manifest(args: argparse.Namespace) -> int:
    if args.app:
        # The working directory first, as `python -m` has it: a console script's path leaves it
        # out, and the app's own modules are found from where the operator stands.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            importlib.import_module(args.app)
        except ImportError as exc:
            sys.stderr.write(
                f"ujobs manifest: cannot import {args.app!r} ({exc}); run ujobs from the "
                "directory it is importable from, or pass its dotted path\n"
            )
            return 2
    manifest = inspect_manifest()
    _emit(args, manifest, [json.dumps(to_jsonable(manifest), indent=2)])
    return 0


def _by_id(
    act: Callable[[JobDriver, str], Awaitable[JobRow]],
) -> Callable[[argparse.Namespace, JobDriver], Awaitable[JobRow]]:
    async def run(args: argparse.Namespace, driver: JobDriver) -> JobRow:
        return await act(driver, args.id)

    return run


# -- the parser -------------------------------------------------------------------------------


def _instant(text: str) -> datetime:
    """An ISO 8601 time that says its offset: a bare local time would mean another instant on
    every host the command runs on."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time") from None
    if at.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset; add one (+00:00, Z)")
    return at


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: an option given before the subcommand must survive the subparser's defaults.
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="the queue's URL (default: DATABASE_URL, then REDIS_URL)",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )

    parser = argparse.ArgumentParser(
        prog="ujobs",
        description="The operator's command line over a queue's jobs, queues, tasks, workers "
        "and counters. The queue comes from --url, else DATABASE_URL, else REDIS_URL; every "
        "command takes --json for machine-readable output.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True)

    jobs = sub.add_parser("jobs", help="inspect and operate on jobs").add_subparsers(
        dest="action", required=True
    )
    listing = jobs.add_parser("list", parents=[common], help="one page, newest first")
    for flag in ("--queue", "--name", "--tenant", "--id-prefix", "--after", "--before"):
        listing.add_argument(flag)
    listing.add_argument("--state", choices=[s.value for s in JobState])
    listing.add_argument("--limit", type=int)
    for flag in ("--created-from", "--created-to"):
        listing.add_argument(flag, type=_instant, help="an ISO 8601 time with its UTC offset")
    listing.set_defaults(handler=_with_driver(_jobs_list))

    show = jobs.add_parser("show", parents=[common], help="one job with its step trace")
    show.add_argument("id")
    show.set_defaults(handler=_with_driver(_jobs_show))

    retry = jobs.add_parser("retry", parents=[common], help="requeue a finished job")
    retry.add_argument("id")
    retry.add_argument("--from-step", help="drop this step and every later one first")
    retry.set_defaults(
        handler=_with_driver(_row_command(lambda a, d: retry_job(d, a.id, from_step=a.from_step)))
    )
    cancel = jobs.add_parser("cancel", parents=[common], help="stop a live job")
    cancel.add_argument("id")
    cancel.add_argument("--reason")
    cancel.set_defaults(
        handler=_with_driver(_row_command(lambda a, d: cancel_job(d, a.id, a.reason)))
    )
    remove = jobs.add_parser(
        "remove", aliases=["delete"], parents=[common], help="delete one job and its steps"
    )
    remove.add_argument("id")
    remove.set_defaults(handler=_with_driver(_jobs_remove))
    promote = jobs.add_parser("promote", parents=[common], help="make a waiting job due now")
    promote.add_argument("id")
    promote.set_defaults(handler=_with_driver(_row_command(_by_id(promote_job))))
    for verb, member in (
        ("retry-many", "requeue_many"),
        ("remove-many", "remove_many"),
        ("promote-many", "promote_many"),
    ):
        bulk = jobs.add_parser(verb, parents=[common], help=f"{member} (1,000 rows per call)")
        bulk.add_argument("--state", required=True, choices=[s.value for s in JobState])
        for flag in ("--queue", "--name", "--tenant"):
            bulk.add_argument(flag)
        bulk.add_argument("--all", action="store_true", help="repeat until nothing is left")
        bulk.set_defaults(handler=_with_driver(_bulk(member)))

    queues = sub.add_parser("queues", parents=[common], help="depth per queue")
    queues.set_defaults(handler=_with_driver(_queues))
    queue_actions = queues.add_subparsers(dest="action")
    tasks = sub.add_parser("tasks", help="pause, resume, last fires").add_subparsers(
        dest="action", required=True
    )
    for group, kind in ((queue_actions, "queue"), (tasks, "task")):
        for verb in ("pause", "resume"):
            action = group.add_parser(verb, parents=[common], help=f"{verb} a {kind}")
            action.add_argument("target")
            action.set_defaults(handler=_with_driver(_pause(kind, verb == "pause")))
    tasks.add_parser(
        "fires", parents=[common], help="last dispatched occurrence per task"
    ).set_defaults(handler=_with_driver(_task_fires))

    sub.add_parser("workers", parents=[common], help="live workers").set_defaults(
        handler=_with_driver(_workers)
    )
    counters = sub.add_parser("counters", parents=[common], help="per-job history")
    counters.add_argument("--job")
    counters.add_argument("--since", default="1h")
    counters.set_defaults(handler=_with_driver(_counters))

    manifest = sub.add_parser("manifest", parents=[common], help="declared jobs and tasks")
    manifest.add_argument("--app", help="module to import first (it declares the jobs)")
    manifest.set_defaults(handler=_manifest)

    for ep in entry_points(group="ultimat3.jobs.commands"):
        try:  # a broken plugin must not take the core commands down
            ep.load()(sub, common)
        except Exception as exc:
            sys.stderr.write(f"ujobs: skipping the {ep.name!r} commands: {exc}\n")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        handler: Handler = args.handler
        return asyncio.run(handler(args))
    except JobsError as error:
        _report(args, error.code, error.message, error.meta, str(error))
        return 1
    except BrokenPipeError:
        # The reader went away (`ujobs … | head`): nothing more is said to it, even at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as error:  # the backend's own refusal: a read-only server, a timeout
        if os.environ.get("UJOBS_TRACEBACK"):
            raise
        said = f"{type(error).__name__}: {error}"
        _report(args, None, said, {"error": type(error).__name__}, said)
        return 1


def _report(args: argparse.Namespace, code: str | None, message: str, meta: Any, line: str) -> None:
    """A failed command's one answer: an object on stdout with ``--json``, else a line on
    stderr. ``code`` is None for an error no ``X_`` code names (the backend's own)."""
    if getattr(args, "json", False):
        json.dump({"code": code, "message": message, "meta": meta}, sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        sys.stderr.write(f"ujobs: {line}\n")


if __name__ == "__main__":
    sys.exit(main())
