"""A clock read outside a step: the step's name comes from it."""

from __future__ import annotations

import time

import attrs

from trio_jobs import JobContext, Retry, job


@attrs.frozen
class Export:
    account: int


@job(
    name="export",
    input=Export,
    idempotency_key=lambda e: f"export:{e.account}",
    retry=Retry(attempts=5),
)
async def export(ctx: JobContext[Export]) -> None:
    batch = f"upload-{time.time_ns()}"  # read on every attempt: a replay asks for another step
    await ctx.step.run("render", lambda: None)
    await ctx.step.run(batch, lambda: None)
