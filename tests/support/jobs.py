"""How the core tests declare their jobs, and the ``Item`` job most worker tests share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from support.naming import job_name_of
from ultimat3.jobs.core import Retry, job


def declared(body: Any, *, input: Any, key: Callable[[Any], str], **options: Any) -> Any:
    """``body`` as a job of ``input`` keyed by ``key``, under its durable name (``job_name_of``),
    with no tenant and three attempts one second apart without jitter; ``options`` override any
    of it."""
    fields: dict[str, Any] = {
        "name": job_name_of(body),
        "input": input,
        "idempotency_key": key,
        "tenant": "none",
        "retry": Retry(attempts=3, delay=1, jitter=False),
    }
    fields.update(options)
    return job(**fields)(body)


@dataclass
class Item:
    n: int


def item_job(body: Any, **options: Any) -> Any:
    """``body`` as a job of ``Item``, keyed by its number."""
    return declared(body, input=Item, key=lambda i: f"item:{i.n}", **options)
