"""The operator helpers: redaction, and honest refusals on a driver with no operator surface."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from ultimat3.jobs.core import (
    CancelUnsupportedError,
    IntrospectionUnsupportedError,
    InvariantError,
    JobFilter,
    memory_job_driver,
)
from ultimat3.jobs.core.introspection import (
    cancel_job,
    inspect_manifest,
    inspect_queues,
    redact,
)


class NoOperatorSurface:
    """A hand-rolled driver that offers nothing optional."""

    def __init__(self) -> None:
        self._inner = memory_job_driver()

    introspect = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_redact_masks_secret_looking_fields_at_any_depth() -> None:
    value = {"user": "ann", "api_key": "k", "nested": [{"Password": "p", "keep": 1}]}
    assert redact(value) == {
        "user": "ann",
        "api_key": "[redacted]",
        "nested": [{"Password": "[redacted]", "keep": 1}],
    }


async def test_a_driver_without_introspect_is_x_not_implemented() -> None:
    with pytest.raises(IntrospectionUnsupportedError) as caught:
        await inspect_queues(NoOperatorSurface())  # type: ignore[arg-type]
    assert caught.value.code == "X_NOT_IMPLEMENTED"


async def test_cancel_without_introspect_is_x_job_not_cancellable() -> None:
    with pytest.raises(CancelUnsupportedError) as caught:
        await cancel_job(NoOperatorSurface(), "some-id")  # type: ignore[arg-type]
    assert caught.value.code == "X_JOB_NOT_CANCELLABLE"


def test_the_manifest_lists_declared_jobs() -> None:
    names = {d.name for d in inspect_manifest().jobs}
    assert names  # every test module's jobs are registered in this process


@pytest.mark.parametrize("bound", ["created_from", "created_to"])
def test_a_naive_created_bound_is_refused_where_the_filter_is_built(bound: str) -> None:
    """Each backend would read a naive time differently (or fail deep in a driver)."""
    with pytest.raises(InvariantError) as refused:
        JobFilter(**{bound: datetime(2026, 1, 1)})
    assert refused.value.code == "X_INVARIANT"
    assert refused.value.meta == {"field": bound}
