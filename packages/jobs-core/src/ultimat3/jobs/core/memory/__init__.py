"""The memory driver and its stores: real implementations over one process's heap."""

from .backfills import MemoryBackfillLedger
from .driver import MemoryJobDriver, memory_job_driver
from .introspect import MemoryIntrospection
from .leases import MemoryLeaseStore
from .outbox import MemoryOutboxStore, MemoryOutboxTransaction, memory_outbox_store
from .scheduler import AlwaysLeader, MemorySchedulerState, always_leader, memory_scheduler_state

__all__ = [
    "AlwaysLeader",
    "MemoryBackfillLedger",
    "MemoryIntrospection",
    "MemoryJobDriver",
    "MemoryLeaseStore",
    "MemoryOutboxStore",
    "MemoryOutboxTransaction",
    "MemorySchedulerState",
    "always_leader",
    "memory_job_driver",
    "memory_outbox_store",
    "memory_scheduler_state",
]
