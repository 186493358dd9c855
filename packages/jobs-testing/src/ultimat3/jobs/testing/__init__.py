"""ultimat3-jobs testing: the driver conformance suite, run_jobs() and service fixtures.

- ``job_driver_conformance(factory)``: the whole suite as one pytest test class, for any driver;
- ``run_jobs(driver)``: drive queued work to quiescence under a ``FrozenClock``;
- the pytest fixtures ``postgres_url``, ``pg_database_url``, ``redis_url``, ``redis_prefix``
  (registered by this distribution's pytest plugin).
"""

import pytest

pytest.register_assert_rewrite("ultimat3.jobs.testing.conformance")

from .conformance import (  # noqa: E402
    CONFORMANCE_EPOCH,
    Conformance,
    ConformanceTarget,
    TargetFactory,
    check_against_reference,
    job_driver_conformance,
    open_conformance,
)
from .reference import ReferenceQueue  # noqa: E402
from .run import (  # noqa: E402
    DEFAULT_ATTEMPTS_GUARD,
    DEFAULT_STUCK_AFTER_S,
    RunawayJobsError,
    run_jobs,
)

__all__ = [
    "CONFORMANCE_EPOCH",
    "DEFAULT_ATTEMPTS_GUARD",
    "DEFAULT_STUCK_AFTER_S",
    "Conformance",
    "ConformanceTarget",
    "ReferenceQueue",
    "RunawayJobsError",
    "TargetFactory",
    "check_against_reference",
    "job_driver_conformance",
    "open_conformance",
    "run_jobs",
]
