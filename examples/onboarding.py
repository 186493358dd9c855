"""The onboarding job, end to end, in one process on the embedded (memory) driver.

    python3 dev.py demo                     # the three-day nudge shortened to two seconds
    python3 examples/onboarding.py --sleep 3d

The welcome email fails once on purpose: attempt 2 replays ``provision`` from storage instead of
provisioning a second org, sends only the email, then the run sleeps (holding no process and no
attempt) and the queue hands it back for the nudge. The trace at the end shows every step of
every attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from uuid import UUID, uuid4

from pydantic import BaseModel

from ultimat3.jobs.core import (
    JobContext,
    JobExecution,
    JobState,
    Retry,
    Step,
    job,
    job_worker,
    memory_job_driver,
    set_job_driver,
)


class Onboard(BaseModel):
    org_id: UUID


class Services:
    """What the job talks to: an org store and a mailer, here printing what they do."""

    def __init__(self, nudge_after: str) -> None:
        self.nudge_after = nudge_after
        self.smtp_failures_left = 1

    async def provision(self, org_id: UUID) -> dict[str, str]:
        print(f"  provisioning org {org_id}")
        return {"org_id": str(org_id), "plan": "trial"}

    async def welcome(self, org: dict[str, str]) -> str:
        if self.smtp_failures_left:
            self.smtp_failures_left -= 1
            print("  welcome email: SMTP refused the connection (failing on purpose)")
            raise ConnectionError("smtp: connection refused")
        print("  welcome email sent")
        return "sent"

    async def nudge(self, org: dict[str, str]) -> str:
        print("  nudge email sent")
        return "sent"


@job(
    input=Onboard,
    idempotency_key=lambda i: f"onboard:{i.org_id}",
    tenant=lambda i: str(i.org_id),
    retry=Retry(attempts=5, backoff="exponential", delay="500ms"),
)
async def onboard_org(*, input: Onboard, step: Step, ctx: JobContext[Services]) -> str:
    org = await step.run("provision", lambda: ctx.services.provision(input.org_id))
    await step.run("welcome-email", lambda: ctx.services.welcome(org))
    await step.sleep("nudge-wait", ctx.services.nudge_after)
    await step.run("nudge", lambda: ctx.services.nudge(org))
    return "onboarded"


async def main(sleep: str) -> None:
    driver = memory_job_driver()
    set_job_driver(driver)
    services = Services(nudge_after=sleep)
    attempts: list[JobExecution] = []

    def seen(execution: JobExecution) -> None:
        attempts.append(execution)
        print(f"attempt {execution.attempt} ended: {execution.outcome}")

    worker = job_worker(
        driver=driver, context=lambda: services, jobs=[onboard_org], on_execution=seen
    )
    async with worker:
        queued = await onboard_org.enqueue(Onboard(org_id=uuid4()))
        print(f"queued job {queued.id} (run {queued.run_id})")
        while True:
            detail = await driver.introspect.get(queued.id)
            assert detail is not None
            if detail.row.state not in (JobState.READY, JobState.RUNNING, JobState.SUSPENDED):
                break
            await asyncio.sleep(0.05)

    print(f"\nfinal state: {detail.row.state.value}")
    print("trace, every step of every attempt:")
    for number, execution in enumerate(attempts, 1):
        steps = ", ".join(f"{name} {how}" for name, how in execution.trace)
        print(f"  {number}. attempt {execution.attempt} -> {execution.outcome}: {steps}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleep", default="3d", help="how long the run sleeps before the nudge")
    logging.basicConfig(level=logging.WARNING, format="  log: %(message)s")
    asyncio.run(main(parser.parse_args().sleep))
