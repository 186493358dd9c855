"""Which driver and which facade a handle's ``enqueue`` goes through.

With a facade installed (the outbox's), enqueues go there; with none, straight to the installed
driver; with neither, ``X_DRIVER_UNAVAILABLE`` at the call — never a silently dropped job.
"""

from __future__ import annotations

from .clock import SYSTEM_CLOCK, Clock
from .errors import DriverUnavailableError
from .model import Enqueued, EnqueueRequest
from .protocol import JobDriver, JobsFacade
from .wake import signal_enqueued

__all__ = [
    "enqueuer_clock",
    "installed_driver",
    "job_driver",
    "jobs_facade",
    "publish",
    "reset_job_driver",
    "set_job_driver",
    "set_jobs_facade",
]

_driver: JobDriver | None = None
_facade: JobsFacade | None = None


def set_job_driver(driver: JobDriver) -> None:
    global _driver
    _driver = driver


def reset_job_driver() -> None:
    """Forget the installed driver and facade (a test seam)."""
    global _driver, _facade
    _driver = None
    _facade = None


def job_driver() -> JobDriver:
    if _driver is None:
        raise DriverUnavailableError(
            "no job driver is installed; call set_job_driver(memory_job_driver()) for a single "
            "process, or set_job_driver(postgres_job_driver(DATABASE_URL))"
        )
    return _driver


def set_jobs_facade(facade: JobsFacade | None) -> None:
    global _facade
    _facade = facade


async def publish(driver: JobDriver, request: EnqueueRequest) -> Enqueued:
    """Insert ``request`` on the queue and, when a row was inserted, wake this process's
    workers for its queue."""
    queued = await driver.enqueue(request)
    if not queued.deduped:
        signal_enqueued(request.queue)
    return queued


class _DirectFacade:
    """Publishes straight to the installed driver: no transaction is ever joined."""

    async def enqueue(self, request: EnqueueRequest) -> Enqueued:
        return await publish(job_driver(), request)

    def current_tx(self) -> None:
        return None


_DIRECT = _DirectFacade()


def jobs_facade() -> JobsFacade:
    return _facade if _facade is not None else _DIRECT


def installed_driver() -> JobDriver | None:
    """The installed driver, or None (``job_driver()`` raises instead)."""
    return _driver


def enqueuer_clock() -> Clock:
    """The clock an enqueue stamps ``run_at`` with: the installed driver's, else the system's."""
    return _driver.clock if _driver is not None else SYSTEM_CLOCK
