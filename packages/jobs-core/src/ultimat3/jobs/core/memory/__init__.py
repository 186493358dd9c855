"""The memory driver and its stores: real implementations over one process's heap."""

from .backfills import MemoryBackfillLedger
from .driver import MemoryJobDriver, memory_job_driver
from .introspect import MemoryIntrospection
from .leases import MemoryLeaseStore

__all__ = [
    "MemoryBackfillLedger",
    "MemoryIntrospection",
    "MemoryJobDriver",
    "MemoryLeaseStore",
    "memory_job_driver",
]
