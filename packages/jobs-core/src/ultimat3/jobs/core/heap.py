"""Keep the cyclic garbage collector off what a worker process built before its worker started.

A busy worker holds its in-flight runs' objects (claims, signals, tasks, the futures of batched
settles) across two young collections, so thousands of them a second reach the oldest
generation, and those promotions set off full collections. A full collection walks the whole
heap: the modules, the job declarations, the application. Measured here, on a 40,000-job drain
of no-op jobs (Postgres, one worker process, concurrency 100), that was 12 collections of about
37 ms each, which found nothing to collect. With the objects alive at start frozen
(``gc.freeze``), the same collections took about 3 ms each, and drains interleaved with ones on
the unfrozen code ran 9% (mean) to 15% (median) faster.

Frozen objects are still freed by reference counting; only a reference cycle among them would
no longer be collected. So the garbage already there is collected first, and the freeze happens
once per process: a test suite that runs many workers freezes only what the first one found.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]

_frozen = False


def freeze_startup_heap() -> None:
    """Collect, then freeze every object alive now; the first call of the process only."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
