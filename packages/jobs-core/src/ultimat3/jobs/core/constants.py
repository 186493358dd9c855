"""Named numbers of the library, each in one place."""

from __future__ import annotations

__all__ = [
    "ACK_RETRY_FIRST_S",
    "ACK_RETRY_MAX_S",
    "COUNTER_TIERS",
    "DEFAULT_EVENT_POLL_S",
    "DEFAULT_EVENT_TTL_S",
    "DEFAULT_JOB_PAGE",
    "DEFAULT_QUEUE",
    "DEFAULT_VISIBILITY_TIMEOUT_S",
    "DRAIN_DEADLINE_S",
    "IDLE_POLL_CEILING_S",
    "JOBS_CONCURRENCY_DEFAULT",
    "MAX_BULK_ROWS",
    "MAX_CATCH_UP",
    "MAX_CONCURRENCY_KEY_LENGTH",
    "MAX_IDEMPOTENCY_KEY_BYTES",
    "MAX_JOB_PAGE",
    "MAX_JSON_DEPTH",
    "MAX_NAME_BYTES",
    "MAX_TASK_FIRES",
    "MAX_WORKER_IN_FLIGHT",
    "ON_SETTLED_ATTEMPTS",
    "OUTBOX_WAKE",
    "PAUSE_RECHECK_S",
    "POLL_INTERVAL_S",
    "PROGRESS_INTERVAL_S",
    "RESUME_TIMER_WINDOW_S",
    "ROLLUP_INTERVAL_S",
    "TIMEOUT_GRACE_S",
    "UNDECLARED_GRACE_S",
    "UNDECLARED_RETRY_S",
    "WAKE_DUE_WITHIN_S",
    "WAKE_SLOT_S",
    "WOKEN_IDLE_POLL_CEILING_S",
]

DEFAULT_QUEUE = "default"
MAX_NAME_BYTES = 500
"""The longest name a row is keyed by, in UTF-8 bytes: a job, task or queue name, a run id, a
step name, a tenant. A Postgres index entry holds at most 2,704 bytes, and the live-key index
holds a name, a tenant and an idempotency key in one."""
MAX_IDEMPOTENCY_KEY_BYTES = 1000
"""The longest idempotency key, in UTF-8 bytes (see ``MAX_NAME_BYTES``)."""
MAX_JSON_DEPTH = 100
"""How deep a stored value (an input, a step's output, an event's payload) may nest: far past
what any job means to store, and well inside what every driver and the claim that reads it back
can decode (past about 900 levels Python's JSON decoder gives up, at a depth that depends on the
stack it runs on)."""
JOBS_CONCURRENCY_DEFAULT = 8
"""Slots of a queue the worker's ``concurrency`` table does not name."""

DEFAULT_VISIBILITY_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.25
"""The worker's claim interval while there is work."""
IDLE_POLL_CEILING_S = 2.0
"""Where the idle back-off stops doubling when no wake is proven."""
WOKEN_IDLE_POLL_CEILING_S = 5.0
"""The idle ceiling once a wake is proven live: notifications carry the latency, the poll is
only the guarantee."""
RESUME_TIMER_WINDOW_S = 60.0
"""A row the worker handed back that falls due within this is woken by a local timer."""
ACK_RETRY_FIRST_S = 0.1
ACK_RETRY_MAX_S = 2.0
"""An ack the driver could not deliver (``X_DRIVER_UNAVAILABLE``) is sent again after the first,
then twice as long each time up to the second, for as long as the run holds its lease."""
DRAIN_DEADLINE_S = 25.0
"""How long the close phase of a drain waits for in-flight work."""
UNDECLARED_GRACE_S = 15 * 60.0
"""A claimed row of a job the worker's process does not declare, created less than this long
ago, is handed back rather than failed: during a rolling deploy it is the new code's, and the
workers still on the old code must not spend its attempts."""
UNDECLARED_RETRY_S = 30.0
"""How long such a row waits, handed back, before any worker may claim it again."""

DEFAULT_EVENT_POLL_S = 30.0
DEFAULT_EVENT_TTL_S = 7 * 86400.0

ON_SETTLED_ATTEMPTS = 3
PROGRESS_INTERVAL_S = 1.0
MAX_CONCURRENCY_KEY_LENGTH = 200

MAX_JOB_PAGE = 200
DEFAULT_JOB_PAGE = 100
MAX_BULK_ROWS = 1_000
MAX_WORKER_IN_FLIGHT = 100
MAX_TASK_FIRES = 1_000

MAX_CATCH_UP = 10
PAUSE_RECHECK_S = 5.0
ROLLUP_INTERVAL_S = 60.0
TIMEOUT_GRACE_S = 1.0
"""How long work past its deadline (an attempt's timeout, a step's step_timeout) is given to end
once cancelled, before it is left behind and logged as ``jobs.timeout.abandoned`` when it ends:
real seconds, as the work is unwinding and reads no clock meanwhile."""
"""How often the scheduler leader, and every running worker, fold the per-job counters into their
tiers (``rollup_counters``): the counters stay within ``COUNTER_TIERS``' bound whichever roles a
deployment runs."""

WAKE_SLOT_S = 0.25
"""The wake's throttle: a row stays silent while an earlier row of its queue from the same slot of
this width (counted from the epoch) still waits, since a worker woken for that one is coming."""
OUTBOX_WAKE = ""
"""The name a ``QueueWake`` hands its subscribers for "a committed outbox row waits": the empty
name, which no queue can have, so workers pass it over and the relay hears it."""
WAKE_DUE_WITHIN_S = 1.0
"""A row due further out than this is not announced; the poll finds it."""

COUNTER_TIERS: tuple[tuple[int, int], ...] = (
    (60, 24 * 3600),
    (300, 7 * 24 * 3600),
    (3600, 30 * 24 * 3600),
)
"""(bucket width, retention) in seconds: 1-minute buckets for a day, 5-minute for a week, hourly
for thirty days — 1,440 + 2,016 + 720 = 4,176 rows per job name at most."""
