"""The event loop a benchmark's worker process runs on: uvloop when it is installed.

The peer harness runs PgQueuer's worker the same way ("pgq's CLI runs on uvloop when it is
installed"), so the two workers are measured on the same loop. Measured here, uvloop takes about a
fifth off the worker's CPU per job. The enqueue measurements stay on asyncio, as the harness's do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def run_worker(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
