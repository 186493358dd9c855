"""Keep the cyclic garbage collector's work per job small in a worker process.

Two measures, both taken once per process, when a worker's ``run()`` treats the process as its own:

- **What was built before the worker started is frozen** (``gc.freeze``). A busy worker holds its
  in-flight runs' objects (claims, signals, tasks, the futures of batched settles) across two
  young collections, so thousands of them a second reach the oldest generation, and those
  promotions set off full collections. A full collection walks the whole heap: the modules, the
  job declarations, the application. Measured here, on a 40,000-job drain of no-op jobs
  (Postgres, one worker process, concurrency 100), that was 12 collections of about 37 ms each,
  which found nothing to collect. Frozen, the same collections took about 3 ms each, and drains
  interleaved with ones on the unfrozen code ran 9% (mean) to 15% (median) faster. Frozen
  objects are still freed by reference counting; only a reference cycle among them would no
  longer be collected, so the garbage already there is collected first.
- **A young collection waits for 5,000 new objects, not Python's 700.** Each young collection
  walks every object allocated since the last one that is still alive, and in a worker most of
  those are the in-flight runs' own, alive for a few milliseconds: walked again by each
  collection until they are old enough to be promoted, and found alive each time. With the
  higher threshold they are mostly freed (by reference counting) before a collection sees them.
  Counted with callgrind (``bench/worker_instructions.py``): 212,314 instead of 231,641
  instructions per drained no-op job, the collector's own functions (its walks and visits)
  falling from 9% of them to under 2%. A process whose thresholds are not Python's defaults
  keeps its own: its owner chose them.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_COLLECTION_THRESHOLD", "tune_collector_for_worker"]

YOUNG_COLLECTION_THRESHOLD = 5_000
"""New objects a worker process allocates (net of those freed) before a young collection."""

_PYTHON_DEFAULT_THRESHOLDS = (700, 10, 10)

_tuned = False


def tune_collector_for_worker() -> None:
    """Collect, freeze every object alive now, and raise the young threshold when it is still
    Python's default; the first call of the process only (a test suite that runs many workers
    freezes only what the first one found)."""
    global _tuned
    if _tuned:
        return
    _tuned = True
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    if thresholds == _PYTHON_DEFAULT_THRESHOLDS:
        gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *thresholds[1:])
