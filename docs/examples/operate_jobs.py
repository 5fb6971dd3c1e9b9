"""A small queue to practise the operator commands on (docs/how-to/operate-a-queue.md).

    export DATABASE_URL=postgresql://app@localhost/app
    python docs/examples/operate_jobs.py        # seed it: runs the jobs once, prints the ids
    trio-jobs list                              # then operate it

Seeding leaves done welcome mails, a dead card charge (declared
``sensitive=True``: the CLI prints its payload as ``[redacted]``), an upload
stopped on a ``once`` step whose outcome is unknown, three dead webhook
deliveries, three reports delayed an hour and 1,200 delayed digests (enough
for the bulk commands to loop). ``tests/cli/test_operator.py`` seeds the same
world and runs every command against it.
"""

from __future__ import annotations

from typing import Any

import attrs

from trio_jobs import Job, JobContext, Jobs, JobsError, Retry, Worker, job

#: A card number: the charge job is sensitive, so no command prints it.
CARD = "4242-4242-4242-4242"


@attrs.frozen
class Signup:
    user: str
    org: str


@attrs.frozen
class Charge:
    order: str
    card: str = CARD


@attrs.frozen
class Target:
    name: str


@job(
    input=Signup,
    idempotency_key=lambda i: f"welcome:{i.user}",
    tenant=lambda i: i.org,
    name="emails.welcome",
    queue="emails",
)
async def welcome(ctx: JobContext[Signup]) -> dict[str, Any]:
    await ctx.step.run("render", lambda: {"subject": f"Welcome, {ctx.input.user}"})
    ctx.progress(1, 2, note="rendered")
    await ctx.step.run("deliver", lambda: {"message_id": f"m-{ctx.input.user}"})
    ctx.progress(2, 2, note="delivered")
    return {"sent": True}


@job(
    input=Charge,
    idempotency_key=lambda i: f"charge:{i.order}",
    name="billing.charge",
    queue="billing",
    retry=Retry(attempts=1),
    sensitive=True,
)
async def charge(ctx: JobContext[Charge]) -> None:
    await ctx.step.run("authorize", lambda: {"card": ctx.input.card, "auth": "a-1"})
    raise JobsError("X_CARD_DECLINED", "the issuer declined the charge")


@job(
    input=Target,
    idempotency_key=lambda i: f"upload:{i.name}",
    name="files.upload",
    retry=Retry(attempts=2),
)
async def upload(ctx: JobContext[Target]) -> None:
    def send() -> None:
        raise RuntimeError("the connection reset mid-upload")

    # At most once, ever: a retry that finds it started stops on X_STEP_OUTCOME_UNKNOWN.
    await ctx.step.run("send", send, once=True)


@job(
    input=Target,
    idempotency_key=lambda i: f"deliver:{i.name}",
    name="webhooks.deliver",
    queue="webhooks",
    retry=Retry(attempts=1),
)
async def deliver(ctx: JobContext[Target]) -> None:
    raise RuntimeError("the endpoint answered 503")


@job(input=Target, idempotency_key=lambda i: f"nightly:{i.name}", name="reports.nightly")
async def nightly(ctx: JobContext[Target]) -> None:
    pass


@job(
    input=Target, idempotency_key=lambda i: f"digest:{i.name}", name="digests.send", queue="digests"
)
async def digest(ctx: JobContext[Target]) -> None:
    pass


ALL: list[Job[Any, Any]] = [welcome, charge, upload, deliver, nightly, digest]


@attrs.frozen
class World:
    """The ids the seed made."""

    welcomes: list[str]  # done, tenant org-a
    charge: str  # dead, sensitive
    upload: str  # dead: a once step's outcome is unknown
    deliveries: list[str]  # dead
    reports: list[str]  # delayed an hour
    digests: int  # how many delayed digests


async def _run_due(jobs: Jobs) -> None:
    """Run every due job, then take this worker off the workers list."""
    worker = Worker(jobs, poll_interval="10ms")
    await worker.run_until_quiet()
    if jobs.driver.introspect is not None:
        await jobs.driver.introspect.remove_worker(worker.id)


async def seed(jobs: Jobs, *, digests: int = 1_200) -> World:
    """Enqueue the world and run what is due, once."""
    welcomes = [(await welcome.enqueue(Signup(f"ada{n}", "org-a"))).id for n in range(3)]
    charged = (await charge.enqueue(Charge("order-1"))).id
    uploaded = (await upload.enqueue(Target("q3-report.pdf"))).id
    deliveries = [(await deliver.enqueue(Target(f"hook-{n}"))).id for n in range(3)]
    await _run_due(jobs)
    # The upload's once step failed on attempt 1; its retry (promoted to now)
    # finds it started and stops on the unknown outcome.
    await jobs.promote(uploaded)
    await _run_due(jobs)
    reports = [(await nightly.enqueue(Target(f"r{n}"), delay="1h")).id for n in range(3)]
    await digest.enqueue_many([Target(f"d{n}") for n in range(digests)], delay="1h")
    return World(welcomes, charged, uploaded, deliveries, reports, digests)


async def main() -> None:
    from trio_jobs import open_jobs
    from trio_jobs.drivers.postgres import postgres_driver

    async with open_jobs(postgres_driver(), jobs=ALL) as jobs:  # $DATABASE_URL
        world = await seed(jobs)
    for field in attrs.fields(World):
        print(f"{field.name}: {getattr(world, field.name)}")


if __name__ == "__main__":
    import trio

    trio.run(main)
