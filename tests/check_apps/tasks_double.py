"""A scheduled task with a double effect: it counts its firings outside any
step, so a replay after a crash counts the same occurrence again."""

from __future__ import annotations

from trio_jobs import JobContext, Occurrence, task

counted: list[str] = []


@task(cron="0 * * * *", name="app.hourly")
async def hourly(ctx: JobContext[Occurrence]) -> None:
    await ctx.step.run("read", lambda: None)
    counted.append(ctx.input.at.isoformat())  # the bug: outside a step
    await ctx.step.run("done", lambda: None)


def trio_jobs_observe() -> list[str]:
    return sorted(counted)


def trio_jobs_reset() -> None:
    counted.clear()
