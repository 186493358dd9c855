"""Run every benchmark in this folder (``*_bench.py``), one after another, each in its own process.

    python3 dev.py bench              # all of them
    python3 dev.py bench pg           # only pg_bench.py
Each benchmark prints its own table: our figures beside the raw limits of the same server, measured
in the same run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    wanted = set(argv)
    failed = 0
    for script in sorted(HERE.glob("*_bench.py")):
        name = script.stem.removesuffix("_bench")
        if wanted and name not in wanted:
            continue
        print(f"\n=== {name} ===", flush=True)
        failed |= subprocess.run([sys.executable, str(script)]).returncode
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
