"""The example app ``trio-jobs dev`` runs: onboarding an org, as a durable workflow.

Three steps and a durable timer. The welcome mail fails once, so the run retries
and replays ``provision`` from storage instead of provisioning twice.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs

from trio_jobs import Job, JobContext, Retry, job


@attrs.frozen
class Onboard:
    org_id: uuid.UUID
    email: str


#: What the example's "outside world" saw, so the run can be checked.
effects: dict[str, int] = {"provisioned": 0, "mails": 0, "mail_failures": 0, "nudges": 0}


async def provision(org_id: uuid.UUID) -> dict[str, str]:
    effects["provisioned"] += 1
    return {"org_id": str(org_id), "plan": "trial"}


async def send_welcome(org: dict[str, str]) -> str:
    if effects["mail_failures"] == 0:
        effects["mail_failures"] += 1
        raise ConnectionError("mail vendor timed out")  # the step retries; provision does not
    effects["mails"] += 1
    return f"welcome sent to {org['org_id']}"


async def send_nudge(org: dict[str, str]) -> None:
    effects["nudges"] += 1


@job(
    input=Onboard,
    tenant=lambda i: str(i.org_id),
    idempotency_key=lambda i: f"onboard:{i.org_id}",
    retry=Retry(attempts=5, backoff="exponential", base="100ms"),
    name="examples.onboard_org",
)
async def onboard_org(ctx: JobContext[Onboard]) -> dict[str, str]:
    org = await ctx.step.run("provision", lambda: provision(ctx.input.org_id))
    receipt = await ctx.step.run("welcome-email", lambda: send_welcome(org))
    await ctx.step.sleep("2s")  # a real app sleeps "3d": nothing is held meanwhile
    await ctx.step.run("nudge", lambda: send_nudge(org))
    return {"org": org["org_id"], "receipt": receipt}


jobs: list[Job[Any, Any]] = [onboard_org]
