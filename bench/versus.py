"""Ours against the nearest peer, in alternating rounds: ratios a shared machine can support.

    python bench/versus.py pg --peer-python VENV/bin/python         # against PgQueuer
    python bench/versus.py redis --peer-python VENV/bin/python      # against SAQ (Redis)

A machine whose speed drifts by a third within minutes (a shared host) makes a ratio of two
figures taken minutes apart mean little. Here each round runs the peer harness
(``../shared/bench/peers``, or ``--peers DIR``) twice, each in its own process: on the peer (its
libraries installed in the virtualenv of ``--peer-python``) and on us (``peer_ujobs.py``, this
workspace's adapter of the same harness, so both sides are measured by one method), the order
swapped every round; a ratio is taken within each round, and the table gives their median and
spread.

Each side measures single enqueue, batched enqueue and the drain at concurrency 100
(``BENCH_REPS`` runs a round, default 1; ``--rounds``, default 4). The servers are ours:
``BENCH_PG_URL`` and ``REDIS_URL`` as the benchmarks take them, handed to the peer harness as
its ``PG*`` and ``REDIS_*`` variables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from psycopg.conninfo import conninfo_to_dict

HERE = Path(__file__).resolve().parent
DEFAULT_PEERS = HERE.parent.parent / "shared" / "bench" / "peers"

PEER = {
    "pg": ("PgQueuer", "peer_pgqueuer.py", "pgqueuer", {}),
    "redis": ("SAQ", "peer_saq.py", "saq-redis", {"SAQ_BACKEND": "redis"}),
}
"""Per backend: the peer's name, its harness script, its result file and its environment."""

FIGURES = (
    ("single enqueue", ("enqueue_single", "rate", "median")),
    ("batched enqueue", ("enqueue_batch", "rate", "median")),
    ("drain, c=100", ("drain", "100", "rate", "median")),
)
"""What a round compares: a name, and where the harness's result file holds it."""


def server_environment() -> dict[str, str]:
    """The peer harness's variables for the servers our benchmarks use."""
    pg = conninfo_to_dict(
        os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    redis = urlsplit(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    env = {
        "PGHOST": str(pg.get("host") or "127.0.0.1"),
        "PGPORT": str(pg.get("port") or 5432),
        "PGUSER": str(pg.get("user") or "postgres"),
        "REDIS_HOST": redis.hostname or "127.0.0.1",
        "REDIS_PORT": str(redis.port or 6379),
    }
    if pg.get("password"):
        env["PGPASSWORD"] = str(pg["password"])
    return env


def quietly(command: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
    """Run one side of a round; its log is shown only when it fails."""
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode})")


def run_harness(
    python: str, script: Path | str, result: str, extra: dict[str, str], peers: Path, out: Path
) -> dict[str, Any]:
    """One side of a round: the harness's single enqueue and drain (whose filling is the batched
    enqueue) at concurrency 100, and the result file it wrote."""
    env = {**os.environ, **server_environment(), **extra, "BENCH_RESULTS_DIR": str(out)}
    env.setdefault("BENCH_REPS", "1")
    quietly([python, str(script), "--only", "single,drain", "--conc", "100"], env, cwd=peers)
    loaded: dict[str, Any] = json.loads((out / f"{result}.json").read_text())
    return loaded


def run_peer(backend: str, python: str, peers: Path, out: Path) -> dict[str, Any]:
    _, script, result, extra = PEER[backend]
    return run_harness(python, script, result, extra, peers, out)


def run_ours(backend: str, peers: Path, out: Path) -> dict[str, Any]:
    extra = {"UJOBS_BACKEND": backend, "BENCH_PEERS": str(peers)}
    script = HERE / "peer_ujobs.py"
    return run_harness(sys.executable, script, f"ultimat3-jobs-{backend}", extra, peers, out)


def figure(result: dict[str, Any], path: tuple[str, ...]) -> float:
    node: Any = result
    for part in path:
        node = node[part]
    return float(node)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backend", choices=sorted(PEER))
    parser.add_argument("--peer-python", required=True, help="python of the peers' virtualenv")
    parser.add_argument("--peers", type=Path, default=DEFAULT_PEERS, help="the peer harness")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    name = PEER[args.backend][0]
    ratios: dict[str, list[float]] = {label: [] for label, _ in FIGURES}
    with tempfile.TemporaryDirectory(prefix="ujobs-versus-") as scratch:
        for round_ in range(args.rounds):
            out = Path(scratch) / f"round-{round_}"
            out.mkdir()
            if round_ % 2:
                ours = run_ours(args.backend, args.peers, out)
                theirs = run_peer(args.backend, args.peer_python, args.peers, out)
            else:
                theirs = run_peer(args.backend, args.peer_python, args.peers, out)
                ours = run_ours(args.backend, args.peers, out)
            cells = []
            for label, path in FIGURES:
                mine, peer = figure(ours, path), figure(theirs, path)
                ratios[label].append(mine / peer)
                cells.append(f"{label} {mine:,.0f} vs {peer:,.0f} ({mine / peer:.2f}x)")
            print(f"round {round_ + 1}: " + "; ".join(cells), flush=True)
    print()
    print(f"| {args.backend}: ours / {name}, per round | median | min | max |")
    print("|---|---|---|---|")
    for label, values in ratios.items():
        print(
            f"| {label} | {statistics.median(values):.2f}x | {min(values):.2f}x "
            f"| {max(values):.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
