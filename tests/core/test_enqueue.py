"""The handle's enqueue: ids, dedupe per tenant, options, and refusals before anything is queued."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel, Field

from ultimat3.jobs.core import (
    Actor,
    Concurrency,
    DriverUnavailableError,
    Enqueued,
    FrozenClock,
    InvariantError,
    JobConcurrencyKeyInvalidError,
    JobDeclarationInvalidError,
    JobDuplicateError,
    JobFilter,
    JobInputInvalidError,
    JobState,
    JobTenantMismatchError,
    JobTenantRequiredError,
    execute_job,
    job,
    reset_job_driver,
)
from ultimat3.jobs.core.memory import MemoryJobDriver


class Onboard(BaseModel):
    org_id: UUID


@job(
    input=Onboard,
    idempotency_key=lambda i: f"onboard:{i.org_id}",
    tenant=lambda i: str(i.org_id),
    queue="onboarding",
)
async def onboard_for_enqueue(*, input: Onboard) -> None:
    return None


class Digest(BaseModel):
    day: str


@job(input=Digest, idempotency_key=lambda i: f"digest:{i.day}", tenant="none")
async def digest_for_enqueue(*, input: Digest) -> None:
    return None


class Account(BaseModel):
    account_id: str


@job(
    input=Account,
    idempotency_key=lambda i: f"sync:{len(i.account_id)}",
    tenant="none",
    concurrency=Concurrency(key=lambda i: i.account_id, limit=1),
)
async def sync_by_length_for_enqueue(*, input: Account) -> None:
    """Its idempotency key holds none of the account id: a bad id reaches the concurrency key."""


async def rows(driver: MemoryJobDriver) -> list[object]:
    return list((await driver.introspect.list(JobFilter())).rows)


async def test_enqueue_answers_the_jobs_own_ids(driver: MemoryJobDriver) -> None:
    queued = await onboard_for_enqueue.enqueue(Onboard(org_id=uuid4()))
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.id, detail.row.run_id, queued.deduped) == (queued.id, queued.run_id, False)
    assert detail.row.queue == "onboarding"
    assert detail.row.state is JobState.READY


async def test_a_live_key_dedupes_and_names_the_live_row(driver: MemoryJobDriver) -> None:
    org = uuid4()
    first = await onboard_for_enqueue.enqueue(Onboard(org_id=org))
    again = await onboard_for_enqueue.enqueue(Onboard(org_id=org))
    assert again.deduped
    assert (again.id, again.run_id) == (first.id, first.run_id)
    assert len(await rows(driver)) == 1


async def test_on_conflict_error_raises_x_job_duplicate(driver: MemoryJobDriver) -> None:
    org = uuid4()
    await onboard_for_enqueue.enqueue(Onboard(org_id=org))
    with pytest.raises(JobDuplicateError) as caught:
        await onboard_for_enqueue.enqueue(Onboard(org_id=org), on_conflict="error")
    assert caught.value.code == "X_JOB_DUPLICATE"


async def test_the_same_key_under_another_tenant_is_another_row(driver: MemoryJobDriver) -> None:
    await digest_for_enqueue.as_(Actor(id="u1", org_id="org-a"), Digest(day="2026-11-30"))
    other = await digest_for_enqueue.as_(Actor(id="u2", org_id="org-b"), Digest(day="2026-11-30"))
    assert not other.deduped
    assert len(await rows(driver)) == 2


async def test_as_stamps_the_tenant_and_enqueued_by(driver: MemoryJobDriver) -> None:
    org = uuid4()
    queued = await onboard_for_enqueue.as_(Actor(id="user-7", org_id=str(org)), Onboard(org_id=org))
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert (detail.row.tenant_id, detail.row.enqueued_by) == (str(org), "user-7")


async def test_as_for_an_org_the_input_does_not_name_is_refused(driver: MemoryJobDriver) -> None:
    with pytest.raises(JobTenantMismatchError):
        await onboard_for_enqueue.as_(Actor(id="u", org_id="someone-else"), Onboard(org_id=uuid4()))
    assert await rows(driver) == []


async def test_run_id_names_the_run(driver: MemoryJobDriver) -> None:
    queued = await onboard_for_enqueue.enqueue(Onboard(org_id=uuid4()), run_id="request-42")
    assert queued.run_id == "request-42"


async def test_delay_and_run_at_are_on_the_enqueuers_clock(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    later = await digest_for_enqueue.enqueue(Digest(day="a"), delay="10m")
    at = datetime(2026, 6, 1, tzinfo=UTC)
    pinned = await digest_for_enqueue.enqueue(Digest(day="b"), run_at=at)
    later_row = await driver.introspect.get(later.id)
    pinned_row = await driver.introspect.get(pinned.id)
    assert later_row is not None
    assert pinned_row is not None
    assert later_row.row.run_at == clock.now() + timedelta(minutes=10)
    assert later_row.row.state is JobState.DELAYED
    assert pinned_row.row.run_at == at


async def test_a_per_call_queue_overrides_the_declared_one(driver: MemoryJobDriver) -> None:
    queued = await digest_for_enqueue.enqueue(Digest(day="c"), queue="reports")
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.queue == "reports"


async def test_input_that_fails_validation_is_refused_and_nothing_queued(
    driver: MemoryJobDriver,
) -> None:
    with pytest.raises(JobInputInvalidError) as caught:
        await onboard_for_enqueue.enqueue({"org_id": "not-a-uuid"})  # type: ignore[arg-type]
    assert caught.value.code == "X_VALIDATION"
    assert await rows(driver) == []


@dataclass
class Reading:
    value: float


@job(input=Reading, idempotency_key=lambda i: f"reading:{i.value}", tenant="none")
async def record_reading(*, input: Reading) -> None:
    return None


@pytest.mark.parametrize("value", [math.nan, math.inf])
async def test_a_dataclass_input_json_cannot_hold_is_refused_and_nothing_queued(
    driver: MemoryJobDriver, value: float
) -> None:
    """NaN and infinity have no JSON form: refused at the enqueue, as a dict holding them is."""
    with pytest.raises(JobInputInvalidError) as caught:
        await record_reading.enqueue(Reading(value))
    assert caught.value.code == "X_VALIDATION"
    assert await rows(driver) == []


async def test_a_dict_input_is_validated_and_stored_in_its_json_form(
    driver: MemoryJobDriver,
) -> None:
    org = uuid4()
    queued = await onboard_for_enqueue.enqueue({"org_id": str(org)})  # type: ignore[arg-type]
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.input == {"org_id": str(org)}


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("", id="empty"),
        pytest.param("x" * 201, id="too long"),
        pytest.param("a\x00b", id="a NUL"),
        pytest.param("\ud800", id="a lone surrogate"),
    ],
)
async def test_a_concurrency_key_no_lease_can_hold_is_refused_at_enqueue(
    driver: MemoryJobDriver, key: str
) -> None:
    with pytest.raises(JobConcurrencyKeyInvalidError) as caught:
        await sync_by_length_for_enqueue.enqueue(Account(account_id=key))
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"
    assert await rows(driver) == []


class Invoice(BaseModel):
    org_id: str | None
    number: int


@job(
    input=Invoice,
    idempotency_key=lambda i: f"invoice:{i.number}",
    tenant=lambda i: i.org_id,
)
async def bill_for_enqueue(*, input: Invoice) -> None:
    return None


@pytest.mark.parametrize("org", [None, ""])
async def test_a_tenant_function_that_names_no_org_is_refused_at_enqueue(
    driver: MemoryJobDriver, org: str | None
) -> None:
    """A run with no org would fail its first tenant-scoped read, long after the enqueue; an
    empty org would also share its keys with every other input that names none."""
    with pytest.raises(JobTenantRequiredError) as caught:
        await bill_for_enqueue.enqueue(Invoice(org_id=org, number=1))
    assert caught.value.code == "X_JOB_TENANT_REQUIRED"
    assert caught.value.meta == {"job": "bill_for_enqueue"}
    assert await rows(driver) == []


UNSTORABLE = [
    pytest.param("a\x00b", id="a NUL character"),
    pytest.param("a\ud800b", id="a lone surrogate"),
    pytest.param("é" * 600, id="over the bytes a key holds"),
]
"""Text no driver can store alike: Postgres refuses a NUL in a text column, UTF-8 has no lone
surrogate, and the memory and Redis drivers would have taken both."""


def enqueue_with(where: str, text: str) -> Awaitable[Enqueued]:
    """An enqueue with ``text`` where ``where`` says."""
    if where == "idempotency key":
        return digest_for_enqueue.enqueue(Digest(day=text))
    if where == "tenant":
        return bill_for_enqueue.enqueue(Invoice(org_id=text, number=1))
    if where == "queue":
        return digest_for_enqueue.enqueue(Digest(day="d"), queue=text)
    return digest_for_enqueue.enqueue(Digest(day="d"), run_id=text)


@pytest.mark.parametrize("text", UNSTORABLE)
@pytest.mark.parametrize("where", ["idempotency key", "tenant", "queue", "run_id"])
async def test_text_no_driver_can_store_is_refused_at_enqueue(
    driver: MemoryJobDriver, text: str, where: str
) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        await enqueue_with(where, text)
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"
    assert await rows(driver) == []


async def test_enqueue_with_nothing_installed_is_x_driver_unavailable() -> None:
    reset_job_driver()
    with pytest.raises(DriverUnavailableError) as caught:
        await digest_for_enqueue.enqueue(Digest(day="d"))
    assert caught.value.code == "X_DRIVER_UNAVAILABLE"


async def test_a_tenant_id_the_input_does_not_name_is_refused(driver: MemoryJobDriver) -> None:
    """As ``as_()`` refuses an actor of another org: the row would fail its first attempt."""
    with pytest.raises(JobTenantMismatchError):
        bill_for_enqueue.request(Invoice(org_id="org-a", number=1), tenant_id="org-b")
    request = bill_for_enqueue.request(Invoice(org_id="org-a", number=1), tenant_id="org-a")
    assert request.tenant_id == "org-a"


@pytest.mark.parametrize(
    "run_at",
    [datetime(2026, 1, 1), datetime(2026, 1, 1).date(), "2026-01-01T00:00:00Z", 0],
    ids=["naive", "a date", "text", "a number"],
)
async def test_a_run_at_that_is_not_an_aware_datetime_is_x_invariant(
    driver: MemoryJobDriver, run_at: object
) -> None:
    with pytest.raises(InvariantError) as caught:
        await digest_for_enqueue.enqueue(Digest(day="d"), run_at=run_at)  # type: ignore[arg-type]
    assert caught.value.meta == {"field": "run_at"}
    assert await rows(driver) == []


@pytest.mark.parametrize(
    "actor",
    [Actor(id="u\x00"), Actor(id="\ud800"), Actor(org_id="o\x00"), Actor(org_id="")],
    ids=["a NUL id", "a surrogate id", "a NUL org", "an empty org"],
)
async def test_an_actor_no_driver_can_store_is_refused(
    driver: MemoryJobDriver, actor: Actor
) -> None:
    with pytest.raises(InvariantError):
        await digest_for_enqueue.as_(actor, Digest(day="d"))
    assert await rows(driver) == []


class Order(BaseModel):
    order_id: str = Field(alias="orderId")


@job(input=Order, idempotency_key=lambda i: f"order:{i.order_id}", tenant="none")
async def ship_order(*, input: Order) -> str:
    return input.order_id


async def test_a_model_with_aliases_is_stored_as_it_validates(driver: MemoryJobDriver) -> None:
    """Dumped by field name, the stored input did not validate: every attempt dead-lettered
    with X_VALIDATION before its body ran."""
    queued = await ship_order.enqueue(Order(orderId="o-1"))
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.input == {"orderId": "o-1"}
    batch = await driver.claim(worker_id="w", slots={"default": 1}, visibility_timeout=30)
    execution = await execute_job(batch.jobs[0], driver=driver, handle=ship_order)
    assert (execution.outcome, execution.result) == ("completed", "o-1")


class Secretive(BaseModel):
    token: str = Field(exclude=True)


@job(input=Secretive, idempotency_key=lambda i: "secretive", tenant="none")
async def use_token(*, input: Secretive) -> None:
    return None


class Ratio(BaseModel):
    value: float


@job(input=Ratio, idempotency_key=lambda i: "ratio", tenant="none")
async def keep_ratio(*, input: Ratio) -> None:
    return None


@dataclass
class Sku:
    sku: str


@dataclass
class Line:
    item: Sku
    at: datetime


@job(input=Line, idempotency_key=lambda i: f"line:{i.item.sku}", tenant="none")
async def book_line(*, input: Line) -> None:
    return None


@job(input=dict, idempotency_key=lambda i: "any", tenant="none")
async def keep_any(*, input: dict[str, object]) -> None:
    return None


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "enqueue",
    [
        pytest.param(lambda: use_token.enqueue(Secretive(token="t")), id="a field it excludes"),
        pytest.param(lambda: keep_ratio.enqueue(Ratio(value=math.nan)), id="a model's NaN"),
        pytest.param(
            lambda: book_line.enqueue(Line(Sku("x"), datetime(2026, 1, 1, tzinfo=UTC))),
            id="a dataclass's typed fields",
        ),
        pytest.param(lambda: keep_any.enqueue({"n": 10**5000}), id="an int past JSON text"),
        pytest.param(
            lambda: record_reading.enqueue(Reading(nested(150))),  # type: ignore[arg-type]
            id="nesting past MAX_JSON_DEPTH",
        ),
    ],
)
async def test_an_input_that_would_not_read_back_is_refused_at_enqueue(
    driver: MemoryJobDriver, enqueue: Callable[[], Awaitable[Enqueued]]
) -> None:
    """Each of these was queued, then dead-lettered at its first claim without its body
    running (or stored by one driver and refused by another)."""
    with pytest.raises(JobInputInvalidError) as caught:
        await enqueue()
    assert caught.value.code == "X_VALIDATION"
    assert await rows(driver) == []


class Credentials(BaseModel):
    host_name: str
    api_key: str


@job(input=Credentials, idempotency_key=lambda i: i.host_name, tenant="none")
async def connect(*, input: Credentials) -> None:
    return None


async def test_an_input_that_no_longer_parses_says_where_not_what(
    driver: MemoryJobDriver,
) -> None:
    """The message goes into last_error and the log, which redact nothing: it names the fields
    that failed, never the values the input held."""
    with pytest.raises(JobInputInvalidError) as caught:
        connect.codec.parse({"host": "db-1", "api_key": "sk-live-SECRET"})
    assert "sk-live-SECRET" not in str(caught.value)
    assert "host_name" in str(caught.value)
