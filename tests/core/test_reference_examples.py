"""The canonical example jobs, made real: onboarding replay, the fan-out trio, tenancy."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel
from support.drive import drain

from ultimat3.jobs.core import (
    FrozenClock,
    JobContext,
    JobFilter,
    JobState,
    Retry,
    Step,
    TenancyActorOrgRequiredError,
    cross_tenant,
    current_actor,
    job,
    require_org,
    task,
)
from ultimat3.jobs.core.memory import MemoryJobDriver


class Onboard(BaseModel):
    org_id: UUID


class Services:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.welcome_failures = 1

    async def provision(self, org_id: UUID) -> dict[str, str]:
        self.calls.append("provision")
        return {"org": str(org_id)}

    async def welcome(self, org: dict[str, str]) -> None:
        self.calls.append("welcome-email")
        if self.welcome_failures:
            self.welcome_failures -= 1
            raise ConnectionError("smtp down")

    async def nudge(self, org: dict[str, str]) -> None:
        self.calls.append("nudge")


@job(
    input=Onboard,
    idempotency_key=lambda i: f"onboard:{i.org_id}",
    tenant=lambda i: str(i.org_id),
    retry=Retry(attempts=5, backoff="exponential"),
)
async def onboard_org(*, input: Onboard, step: Step, ctx: JobContext[Services]) -> None:
    org = await step.run("provision", lambda: ctx.services.provision(input.org_id))
    await step.run("welcome-email", lambda: ctx.services.welcome(org))
    await step.sleep("3d")
    await step.run("nudge", lambda: ctx.services.nudge(org))


async def test_a_failed_welcome_replays_provision_and_resends_only_the_email(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    services = Services()
    await onboard_org.enqueue(Onboard(org_id=uuid4()))
    executions = await drain(driver, clock, onboard_org, services=services)
    assert [e.outcome for e in executions] == ["retried", "suspended", "completed"]
    assert services.calls == ["provision", "welcome-email", "welcome-email", "nudge"]
    assert executions[1].trace[0] == ("provision", "replayed")


async def test_the_three_day_sleep_holds_no_process_and_burns_no_attempt(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    services = Services()
    services.welcome_failures = 0
    queued = await onboard_org.enqueue(Onboard(org_id=uuid4()))
    executions = await drain(driver, clock, onboard_org, services=services)
    assert [e.attempt for e in executions] == [1, 1]
    detail = await driver.introspect.get(queued.id)
    assert detail is not None
    assert detail.row.attempt == 1


# -- the fan-out trio: a task hands its instant to ONE job, which enqueues one child per row ---

HOSTS = ["h1", "h2", "h3"]
probed: list[str] = []
listed: list[int] = []


class HostTick(BaseModel):
    host_id: str
    occurrence_ms: int


class Tick(BaseModel):
    occurrence_ms: int


@job(
    input=HostTick,
    idempotency_key=lambda i: f"poll-host:{i.host_id}:{i.occurrence_ms}",
    tenant="none",
    retry=Retry(attempts=3, backoff="exponential"),
)
async def poll_host(*, input: HostTick) -> None:
    probed.append(input.host_id)


@job(
    input=Tick,
    idempotency_key=lambda i: f"poll-hosts:{i.occurrence_ms}",
    tenant="none",
    retry=Retry(attempts=3, backoff="exponential"),
)
async def poll_hosts(*, input: Tick, step: Step, attempt: int) -> None:
    hosts = await step.run("list", lambda: listed.append(1) or HOSTS)
    for host in hosts:
        await step.run(
            f"enqueue:{host}",
            lambda host=host: poll_host.enqueue(
                HostTick(host_id=host, occurrence_ms=input.occurrence_ms)
            ),
        )
        if attempt == 1 and host == "h2":
            raise ConnectionError("the fan-out died halfway")


poll_fleet = task(
    cron="*/5 * * * *",
    tz="UTC",
    enqueue=lambda occurrence_ms: [(poll_hosts, Tick(occurrence_ms=occurrence_ms))],
)


async def test_the_task_names_only_the_fan_out_job(driver: MemoryJobDriver) -> None:
    assert poll_fleet.describe().jobs == ["poll_hosts"]


async def test_a_replayed_fan_out_enqueues_each_child_once(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    probed.clear()
    listed.clear()
    [queued] = await poll_fleet.enqueue()
    executions = await drain(driver, clock, poll_hosts, poll_host)
    assert sorted(probed) == HOSTS
    assert listed == [1]
    fan_out = [e for e in executions if e.job_id == queued.id]
    assert [e.outcome for e in fan_out] == ["retried", "completed"]
    children = await driver.introspect.list(JobFilter(name="poll_host"))
    assert len(children.rows) == 3
    assert all(row.state is JobState.DONE for row in children.rows)


async def test_the_same_row_for_the_same_tick_is_one_row(driver: MemoryJobDriver) -> None:
    first = await poll_host.enqueue(HostTick(host_id="h9", occurrence_ms=60_000))
    again = await poll_host.enqueue(HostTick(host_id="h9", occurrence_ms=60_000))
    later = await poll_host.enqueue(HostTick(host_id="h9", occurrence_ms=120_000))
    assert again.deduped
    assert again.id == first.id
    assert not later.deduped


# -- tenancy ----------------------------------------------------------------------------------


class OrgInput(BaseModel):
    org_id: str


seen_orgs: list[str | None] = []


@job(input=OrgInput, idempotency_key=lambda i: f"scoped:{i.org_id}", tenant=lambda i: i.org_id)
async def scoped_read(*, input: OrgInput, ctx: JobContext[Any]) -> None:
    actor = current_actor()
    seen_orgs.append(actor.org_id if actor else None)
    assert ctx.actor.org_id == input.org_id
    assert require_org() == input.org_id


@job(input=OrgInput, idempotency_key=lambda i: f"sweep:{i.org_id}", tenant="none")
async def tenantless_sweep(*, input: OrgInput) -> str:
    async def spanning_read() -> str:
        actor = current_actor()
        assert actor is not None
        return actor.cross_tenant_reason or ""

    try:
        require_org()
    except TenancyActorOrgRequiredError:
        return await cross_tenant("nightly sweep over every org", spanning_read)
    return "had an org"


async def test_the_body_runs_as_the_org_the_job_declared(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    seen_orgs.clear()
    await scoped_read.enqueue(OrgInput(org_id="org-42"))
    [execution] = await drain(driver, clock, scoped_read)
    assert execution.outcome == "completed"
    assert seen_orgs == ["org-42"]
    assert current_actor() is None


async def test_a_tenantless_job_reads_across_tenants_only_inside_cross_tenant(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    await tenantless_sweep.enqueue(OrgInput(org_id="any"))
    [execution] = await drain(driver, clock, tenantless_sweep)
    assert execution.result == "nightly sweep over every org"


async def test_a_row_queued_for_another_org_than_its_input_names_dead_letters(
    driver: MemoryJobDriver, clock: FrozenClock
) -> None:
    queued = await scoped_read.enqueue(OrgInput(org_id="org-1"))
    driver._state.rows[queued.id].tenant_id = "org-2"
    [execution] = await drain(driver, clock, scoped_read)
    assert (execution.outcome, execution.stop_reason) == ("dead-lettered", "terminal")
    assert getattr(execution.error, "code", None) == "X_JOB_TENANT_MISMATCH"


async def test_cross_tenant_needs_a_reason() -> None:
    async def read() -> None:
        return None

    with pytest.raises(ValueError, match="reason"):
        await cross_tenant("  ", read)
