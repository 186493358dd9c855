"""ultimat3-jobs core: durable background work with one driver protocol.

Declare work with ``job()`` and ``task()``, queue it through a handle, run it with
``job_worker()``; swap backends with ``set_job_driver()`` without touching a job.
"""

from .clock import SYSTEM_CLOCK, Clock, FrozenClock, SystemClock
from .constants import (
    DEFAULT_JOB_PAGE,
    DEFAULT_QUEUE,
    JOBS_CONCURRENCY_DEFAULT,
    MAX_BULK_ROWS,
    MAX_CONCURRENCY_KEY_LENGTH,
    MAX_JOB_PAGE,
    ON_SETTLED_ATTEMPTS,
    OUTBOX_WAKE,
)
from .context import JobContext, JobOutcome, Settled
from .cron import latest_occurrence, next_occurrence
from .cursor import job_cursor
from .errors import *  # noqa: F403
from .errors import __all__ as _errors
from .events import event_bus, memory_event_bus, publish_event, reset_event_bus, set_event_bus
from .execute import JobExecution, execute_job, failure_verdict
from .facade import job_driver, jobs_facade, reset_job_driver, set_job_driver, set_jobs_facade
from .ids import new_id
from .introspection import (
    cancel_job,
    inspect_dead_letters,
    inspect_job,
    inspect_manifest,
    inspect_queues,
    promote_job,
    remove_job,
    retry_job,
)
from .job import AnyJobHandle, Concurrency, JobDescriptor, JobHandle, job, job_lease_key
from .leader import LeaseStoreLeader, lease_store_leader
from .lifecycle import (
    configure_lifecycle,
    install_shutdown_signals,
    on_shutdown,
    serve_until,
    shutdown,
)
from .limits import LimitConfig, ProcessLimits, RateLimit
from .memory import memory_job_driver
from .memory.outbox import memory_outbox_store
from .memory.scheduler import always_leader, memory_scheduler_state
from .metrics import JobMetrics, job_metrics, observe_queues
from .model import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    LIVE_STATES,
    PROMOTABLE_STATES,
    REQUEUEABLE_STATES,
    AckOptions,
    BulkFilter,
    BulkResult,
    ClaimedJob,
    ClaimRef,
    Enqueued,
    EnqueueRequest,
    JobFilter,
    JobPage,
    JobRow,
    JobState,
    NackOptions,
    Progress,
    QueueStats,
    StepKind,
    StepRecord,
    claim_of,
    without_done,
)
from .nack import nack_counter, nack_state
from .outbox import OutboxJobsFacade, OutboxRelay, outbox_jobs_facade, outbox_relay
from .protocol import (
    BackfillLedger,
    ClaimBatch,
    ClaimedOnRead,
    EventBus,
    JobDriver,
    JobIntrospection,
    JobsFacade,
    Leader,
    LeaseLeader,
    LeaseStore,
    OutboxStore,
    QueueWake,
    SchedulerState,
)
from .registry import Api, define_api, registered_jobs, registered_tasks
from .retry import (
    Retry,
    equal_jitter,
    is_final_attempt,
    jitter_stated_delay,
    register_error_retry,
    retry_schedule,
)
from .scheduler import JobScheduler, job_scheduler, next_task_run
from .signal import AbortController, AbortSignal
from .steps import Step, StepSuspension
from .task import AnyTaskHandle, TaskDescriptor, TaskHandle, task
from .tenancy import Actor, cross_tenant, current_actor, require_org
from .wake import signal_enqueued
from .worker import JobWorker, WorkerStats, job_worker

__all__ = [
    *_errors,
    "DEFAULT_JOB_PAGE",
    "DEFAULT_QUEUE",
    "JOBS_CONCURRENCY_DEFAULT",
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "LIVE_STATES",
    "MAX_BULK_ROWS",
    "MAX_CONCURRENCY_KEY_LENGTH",
    "MAX_JOB_PAGE",
    "ON_SETTLED_ATTEMPTS",
    "OUTBOX_WAKE",
    "PROMOTABLE_STATES",
    "REQUEUEABLE_STATES",
    "SYSTEM_CLOCK",
    "AbortController",
    "AbortSignal",
    "AckOptions",
    "Actor",
    "AnyJobHandle",
    "AnyTaskHandle",
    "Api",
    "BackfillLedger",
    "BulkFilter",
    "BulkResult",
    "ClaimBatch",
    "ClaimRef",
    "ClaimedJob",
    "ClaimedOnRead",
    "Clock",
    "Concurrency",
    "Enqueued",
    "EnqueueRequest",
    "EventBus",
    "FrozenClock",
    "JobContext",
    "JobDescriptor",
    "JobDriver",
    "JobExecution",
    "JobFilter",
    "JobHandle",
    "JobIntrospection",
    "JobOutcome",
    "JobPage",
    "JobRow",
    "JobState",
    "JobsFacade",
    "Leader",
    "LeaseLeader",
    "LeaseStore",
    "LeaseStoreLeader",
    "NackOptions",
    "OutboxStore",
    "Progress",
    "QueueStats",
    "QueueWake",
    "Retry",
    "SchedulerState",
    "Settled",
    "Step",
    "StepKind",
    "StepRecord",
    "StepSuspension",
    "SystemClock",
    "TaskDescriptor",
    "TaskHandle",
    "claim_of",
    "cross_tenant",
    "current_actor",
    "define_api",
    "equal_jitter",
    "event_bus",
    "execute_job",
    "failure_verdict",
    "is_final_attempt",
    "jitter_stated_delay",
    "job",
    "job_cursor",
    "job_driver",
    "job_lease_key",
    "jobs_facade",
    "memory_event_bus",
    "memory_job_driver",
    "nack_counter",
    "nack_state",
    "new_id",
    "publish_event",
    "register_error_retry",
    "registered_jobs",
    "registered_tasks",
    "require_org",
    "reset_event_bus",
    "reset_job_driver",
    "retry_schedule",
    "set_event_bus",
    "serve_until",
    "set_job_driver",
    "set_jobs_facade",
    "signal_enqueued",
    "task",
    "without_done",
    "latest_occurrence",
    "next_occurrence",
    "configure_lifecycle",
    "install_shutdown_signals",
    "on_shutdown",
    "shutdown",
    "LimitConfig",
    "ProcessLimits",
    "RateLimit",
    "memory_outbox_store",
    "always_leader",
    "memory_scheduler_state",
    "JobMetrics",
    "job_metrics",
    "observe_queues",
    "OutboxJobsFacade",
    "OutboxRelay",
    "outbox_jobs_facade",
    "outbox_relay",
    "JobScheduler",
    "job_scheduler",
    "next_task_run",
    "JobWorker",
    "WorkerStats",
    "job_worker",
    "lease_store_leader",
    "cancel_job",
    "inspect_dead_letters",
    "inspect_job",
    "inspect_manifest",
    "inspect_queues",
    "promote_job",
    "remove_job",
    "retry_job",
]
