"""The job most worker tests declare: an ``Item`` input keyed by its number, with no tenant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from support.naming import job_name_of
from ultimat3.jobs.core import Retry, job


@dataclass
class Item:
    n: int


def item_job(body: Any, **options: Any) -> Any:
    """``body`` declared as a job of ``Item`` under its durable name (``job_name_of``), three
    attempts one second apart without jitter; ``options`` override any of it."""
    fields: dict[str, Any] = {
        "name": job_name_of(body),
        "input": Item,
        "idempotency_key": lambda i: f"item:{i.n}",
        "tenant": "none",
        "retry": Retry(attempts=3, delay=1, jitter=False),
    }
    fields.update(options)
    return job(**fields)(body)
