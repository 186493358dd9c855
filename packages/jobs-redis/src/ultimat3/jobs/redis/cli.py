"""The ``ujobs`` CLI's entry for ``redis://`` and ``rediss://`` URLs (entry point group
``ultimat3.jobs.drivers``).

The namespace rides in the URL's query as ``prefix`` (default ``ujobs``), so an operator reaches
an application's queues with one argument: ``ujobs --url 'redis://host:6379/0?prefix=shop' jobs
list``. Every other query parameter is redis-py's own.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.exceptions import RedisError
from ultimat3.jobs.core.errors import DriverUnavailableError
from ultimat3.jobs.core.protocol import JobDriver

from .driver import redis_job_driver
from .keys import DEFAULT_PREFIX

__all__ = ["driver_from_url", "split_prefix"]


def split_prefix(url: str) -> tuple[str, str]:
    """``(url without the prefix parameter, prefix)``."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = next((value for key, value in query if key == "prefix"), DEFAULT_PREFIX)
    rest = urlencode([(key, value) for key, value in query if key != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix


async def driver_from_url(url: str) -> JobDriver:
    """A driver for ``url`` whose server answered a PING."""
    target, prefix = split_prefix(url)
    try:
        driver = redis_job_driver(url=target, prefix=prefix)
    except ValueError as exc:  # redis-py's word on a URL it cannot read
        raise DriverUnavailableError(
            f"{target} is not a Redis URL redis-py can read ({exc})", meta={"url": target}
        ) from exc
    try:
        await driver.client.ping()
    except (RedisError, OSError) as exc:
        await driver.close()
        raise DriverUnavailableError(
            f"Redis at {target} did not answer ({exc}); check the URL and that the server is up",
            meta={"url": target},
        ) from exc
    return driver
