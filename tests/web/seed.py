"""Jobs and a seeded world for the dashboard tests (and its screenshots)."""

from __future__ import annotations

from typing import Any

import attrs

from trio_jobs import JobContext, Jobs, JobsError, Retry, Worker, job

__all__ = ["SECRET", "World", "charge_card", "import_rows", "seed", "send_welcome", "sync_account"]

#: A payload value no page, log line or span may show for a sensitive job.
SECRET = "4242-4242-SECRET"


@attrs.frozen
class Welcome:
    user: str


@attrs.frozen
class Charge:
    order: str
    card: str = SECRET


@job(input=Welcome, idempotency_key=lambda i: f"welcome:{i.user}", queue="emails")
async def send_welcome(ctx: JobContext[Welcome]) -> dict[str, Any]:
    body = await ctx.step.run("render", lambda: {"subject": f"Welcome, {ctx.input.user}"})
    ctx.progress(1, 2, note="rendered")
    await ctx.step.run("deliver", lambda: {"message_id": f"m-{ctx.input.user}"})
    ctx.progress(2, 2, note="delivered")
    return {"sent": True, "subject": body["subject"]}


@job(
    input=Charge,
    idempotency_key=lambda i: f"charge:{i.order}",
    queue="billing",
    retry=Retry(attempts=1),
    sensitive=True,
)
async def charge_card(ctx: JobContext[Charge]) -> None:
    await ctx.step.run("authorize", lambda: {"card": ctx.input.card, "auth": "ok"})
    raise JobsError("X_CARD_DECLINED", "the issuer declined the charge")


@job(input=Welcome, idempotency_key=lambda i: f"sync:{i.user}")
async def sync_account(ctx: JobContext[Welcome]) -> str:
    return "synced"


@job(input=Welcome, idempotency_key=lambda i: f"import:{i.user}", retry=Retry(attempts=2))
async def import_rows(ctx: JobContext[Welcome]) -> None:
    def upload() -> None:
        raise RuntimeError("the connection reset mid-upload")

    await ctx.step.run("upload", upload, once=True)


ALL = [send_welcome, charge_card, sync_account, import_rows]


async def _quietly(jobs: Jobs) -> None:
    """Run every due job, then take the worker's row off the workers list (a
    ``run_until_quiet`` worker leaves it to expire)."""
    worker = Worker(jobs, poll_interval="10ms")
    await worker.run_until_quiet()
    intro = jobs.driver.introspect
    if intro is not None:
        await intro.remove_worker(worker.id)


@attrs.frozen
class World:
    welcomes: list[str]
    charge: str
    delayed: str
    unknown: str


async def seed(jobs: Jobs, *, welcomes: int = 3) -> World:
    """Done, dead (sensitive), dead on an unknown once-step outcome, and delayed jobs."""
    done = [(await send_welcome.enqueue(Welcome(f"user{n}"))).id for n in range(welcomes)]
    charge = (await charge_card.enqueue(Charge("order-1"))).id
    unknown = (await import_rows.enqueue(Welcome("acme"))).id
    await _quietly(jobs)
    # the once step failed on attempt 1; its retry (run now) stops on the unknown outcome
    await jobs.promote(unknown)
    await _quietly(jobs)
    delayed = (await sync_account.enqueue(Welcome("later"), delay="1h")).id
    return World(done, charge, delayed, unknown)
