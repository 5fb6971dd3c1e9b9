"""A scheduled task the gate checks: its inputs are occurrences on its own
schedule (drawn, not given), its effect keyed by the occurrence in a step."""

from __future__ import annotations

from trio_jobs import JobContext, Occurrence, task

fired: set[str] = set()


@task(every="1m", name="app.tick")
async def tick(ctx: JobContext[Occurrence]) -> None:
    await ctx.step.run("mark", lambda: fired.add(ctx.input.at.isoformat()))
    await ctx.step.run("done", lambda: None)


def trio_jobs_observe() -> list[str]:
    return sorted(fired)


def trio_jobs_reset() -> None:
    fired.clear()
