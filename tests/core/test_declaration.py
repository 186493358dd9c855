"""job() refuses, where it is declared, everything no worker could honour."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ultimat3.jobs.core import (
    Concurrency,
    IdempotencyRequiredError,
    JobDeclarationInvalidError,
    JobTenantRequiredError,
    Retry,
    job,
)
from ultimat3.jobs.core.job import JobHandle


@dataclass
class Sync:
    account_id: str


def _key(i: Sync) -> str:
    return f"sync:{i.account_id}"


async def _body(*, input: Sync) -> None:
    return None


def declare(**options: Any) -> Any:
    fields: dict[str, Any] = {"input": Sync, "idempotency_key": _key, "tenant": "none"}
    fields.update(options)
    return job(**fields)(_body)


def test_missing_idempotency_key_is_x_idempotency_required() -> None:
    with pytest.raises(IdempotencyRequiredError) as caught:
        job(input=Sync, tenant="none")(_body)  # type: ignore[call-overload]
    assert caught.value.code == "X_IDEMPOTENCY_REQUIRED"


def test_missing_tenant_is_x_job_tenant_required() -> None:
    with pytest.raises(JobTenantRequiredError) as caught:
        job(input=Sync, idempotency_key=_key)(_body)  # type: ignore[call-overload]
    assert caught.value.code == "X_JOB_TENANT_REQUIRED"


def test_tenant_none_declares_a_tenantless_job() -> None:
    assert declare().describe().tenant == "none"


@pytest.mark.parametrize("tenant", ["", "org", 42])
def test_tenant_must_be_a_function_or_none(tenant: object) -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(tenant=tenant)


def test_idempotency_key_must_be_a_function() -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(idempotency_key="sync")


@pytest.mark.parametrize("cap", [0, -1, 1.5, math.nan, math.inf, True, "2"])
def test_a_plain_concurrency_no_worker_can_honour_is_refused(cap: object) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        declare(concurrency=cap)
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"


@pytest.mark.parametrize("limit", [0, -3, 0.5, math.nan])
def test_a_keyed_limit_below_one_is_refused(limit: object) -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(concurrency=Concurrency(key=lambda i: i.account_id, limit=limit))  # type: ignore[arg-type]


def test_a_concurrency_key_that_is_not_a_function_is_refused() -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(concurrency=Concurrency(key="account_id", limit=1))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "cap",
    [{"limit": 1}, {"key": lambda i: i.account_id, "limit": 1, "whenBusy": "fail"}],
    ids=["without-key", "unknown-field"],
)
def test_a_concurrency_mapping_that_is_no_concurrency_is_refused(cap: object) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        declare(concurrency=cap)
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"


def test_when_busy_outside_wait_and_fail_is_refused() -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(concurrency=Concurrency(key=lambda i: i.account_id, when_busy="queue"))  # type: ignore[arg-type]


@given(st.integers(min_value=1, max_value=10_000))
def test_any_whole_positive_cap_is_accepted(cap: int) -> None:
    handle: JobHandle[Any, Any] = declare(concurrency=cap)
    assert handle.describe().concurrency == {"limit": cap}


@pytest.mark.parametrize("field", ["step_timeout", "event_poll", "timeout"])
@pytest.mark.parametrize("value", [0, -1, "0s", "-5s"])
def test_a_zero_or_negative_ceiling_is_refused(field: str, value: object) -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(**{field: value})


@pytest.mark.parametrize("field", ["step_timeout", "event_poll", "timeout"])
@pytest.mark.parametrize("value", [timedelta.max, 10**12, 10**400, "4000000d"], ids=repr)
def test_a_ceiling_past_a_century_is_refused_not_overflowed_at_every_attempt(
    field: str, value: object
) -> None:
    """``timedelta.max`` written for "no ceiling": now plus it is no datetime, and every attempt
    failed before its body ran (and settled nothing) until the last was buried dead."""
    with pytest.raises(JobDeclarationInvalidError):
        declare(**{field: value})


def test_a_malformed_duration_is_refused_at_declaration() -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(timeout="ten seconds")


def test_ceilings_take_timedelta_seconds_and_unit_strings() -> None:
    from datetime import timedelta

    described = declare(timeout=timedelta(minutes=2), step_timeout=5, event_poll="250ms").describe()
    assert (described.timeout_s, described.step_timeout_s, described.event_poll_s) == (120, 5, 0.25)


def test_event_poll_defaults_to_thirty_seconds() -> None:
    assert declare().describe().event_poll_s == 30


@pytest.mark.parametrize("attempts", [0, -1, 1.5, True])
def test_retry_attempts_below_one_are_refused(attempts: object) -> None:
    with pytest.raises(JobDeclarationInvalidError):
        Retry(attempts=attempts)  # type: ignore[arg-type]


def test_an_unknown_backoff_is_refused() -> None:
    with pytest.raises(JobDeclarationInvalidError):
        Retry(backoff="random")  # type: ignore[arg-type]


def test_an_empty_queue_is_refused() -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(queue="")


def test_a_body_asking_for_an_unknown_parameter_is_refused() -> None:
    async def body(*, input: Sync, services: object) -> None:
        return None

    with pytest.raises(JobDeclarationInvalidError, match="services"):
        job(input=Sync, idempotency_key=_key, tenant="none")(body)


def test_an_input_that_is_not_a_model_dataclass_dict_or_none_is_refused() -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(input=int)


def test_on_settled_must_be_callable() -> None:
    with pytest.raises(JobDeclarationInvalidError):
        declare(on_settled="notify")


def test_describe_is_the_manifest_row() -> None:
    described = declare(
        name="declaration.describe",
        queue="sync",
        retry=Retry(attempts=5, backoff="linear"),
        concurrency=Concurrency(key=lambda i: i.account_id, limit=2, when_busy="fail"),
    ).describe()
    assert described.kind == "job"
    assert described.name == "declaration.describe"
    assert described.queue == "sync"
    assert described.input == "Sync"
    assert described.retry.attempts == 5
    assert described.concurrency == {"limit": 2, "keyed": True, "when_busy": "fail"}


def test_a_sync_body_that_takes_step_is_refused_where_it_is_declared() -> None:
    """Its step calls would answer coroutines nobody awaits: no step would ever run."""

    def sync_with_steps(*, input: Sync, step: Any) -> None:
        step.run("charge", lambda: None)

    with pytest.raises(JobDeclarationInvalidError, match="async def") as caught:
        job(input=Sync, idempotency_key=_key, tenant="none")(sync_with_steps)
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"


def test_a_sync_body_without_step_is_declared() -> None:
    def sync_body(*, input: Sync) -> None:
        return None

    assert job(input=Sync, idempotency_key=_key, tenant="none")(sync_body).parameters == ("input",)


class Deliver:
    """A body as an object whose ``__call__`` is a coroutine function."""

    def __init__(self) -> None:
        self.delivered: list[str] = []

    async def __call__(self, *, input: dict[str, str], step: Any) -> str:
        return str(await step.run("deliver", lambda: self.delivered.append(input["to"]) or "sent"))


async def test_an_object_whose_call_is_async_is_an_async_body(driver: Any) -> None:
    """It takes ``step`` like any async body, and its coroutine is awaited: taken for a sync
    body, it was refused for asking for ``step`` (or, without it, run in a thread that made a
    coroutine and ran nothing)."""
    from ultimat3.jobs.core import execute_job, job

    body = Deliver()
    handle = job(
        input=dict,
        idempotency_key=lambda i: i["to"],
        tenant="none",
        name="declaration-async-callable",
    )(body)
    await handle.enqueue({"to": "ada"})
    batch = await driver.claim(worker_id="w", slots={"default": 1}, visibility_timeout=30)
    execution = await execute_job(batch.jobs[0], driver=driver, handle=handle)
    assert (execution.outcome, execution.result, body.delivered) == ("completed", "sent", ["ada"])
