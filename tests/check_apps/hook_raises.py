"""A reset hook that raises."""

from __future__ import annotations

from trio_jobs import JobContext, job


@job(name="plain", input=None, idempotency_key=lambda _: "one")
async def plain(ctx: JobContext[None]) -> None:
    await ctx.step.run("a", lambda: None)


def trio_jobs_reset() -> None:
    raise KeyError("the-secret-table")
