"""The ``ujobs`` CLI's entry for ``redis://`` and ``rediss://`` URLs (entry point group
``ultimat3.jobs.drivers``)."""

from __future__ import annotations

from redis.exceptions import RedisError
from ultimat3.jobs.core.errors import DriverUnavailableError
from ultimat3.jobs.core.protocol import JobDriver

from .driver import redis_job_driver

__all__ = ["driver_from_url"]


async def driver_from_url(url: str) -> JobDriver:
    """A driver for ``url`` whose server answered a PING (the default namespace, ``ujobs``)."""
    driver = redis_job_driver(url=url)
    try:
        await driver.client.ping()
    except (RedisError, OSError) as exc:
        await driver.close()
        raise DriverUnavailableError(
            f"Redis at {url} did not answer ({exc}); check the URL and that the server is up",
            meta={"url": url},
        ) from exc
    return driver
