"""ultimat3-jobs on Redis: one Lua script per operation, every key of a namespace in one slot.

from ultimat3.jobs.core import set_job_driver
from ultimat3.jobs.redis import redis_job_driver, start_queue_wake

driver = redis_job_driver(url="redis://127.0.0.1:6379/0")
set_job_driver(driver)
wake = start_queue_wake(driver)          # in the worker process
"""

from .backfills import RedisBackfillLedger
from .driver import DEFAULT_COMMAND_TIMEOUT, DEFAULT_DONE_TTL, RedisJobDriver, redis_job_driver
from .events import RedisEventBus
from .introspect import RedisIntrospection
from .keys import DEFAULT_PREFIX, hash_slot
from .leases import RedisLeaseStore
from .scheduler import (
    RedisSchedulerState,
    redis_lease_leader,
    redis_scheduler_state,
)
from .unavailable import RedisUnavailableError
from .wake import RedisQueueWake, start_queue_wake

__all__ = [
    "DEFAULT_COMMAND_TIMEOUT",
    "DEFAULT_DONE_TTL",
    "DEFAULT_PREFIX",
    "RedisBackfillLedger",
    "RedisEventBus",
    "RedisIntrospection",
    "RedisJobDriver",
    "RedisLeaseStore",
    "RedisQueueWake",
    "RedisSchedulerState",
    "RedisUnavailableError",
    "hash_slot",
    "redis_job_driver",
    "redis_lease_leader",
    "redis_scheduler_state",
    "start_queue_wake",
]
