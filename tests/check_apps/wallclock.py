"""A branch on the wall clock outside a step: the morning run sends a summary,
a later one the full report. A replay that comes at another hour asks for the
other step."""

from __future__ import annotations

from datetime import UTC, datetime

import attrs

from trio_jobs import JobContext, Retry, job


@attrs.frozen
class Report:
    account: int


sent: dict[int, str] = {}


@job(
    name="report",
    input=Report,
    idempotency_key=lambda r: f"report:{r.account}",
    retry=Retry(attempts=5),
)
async def report(ctx: JobContext[Report]) -> None:
    await ctx.step.run("gather", lambda: None)
    if datetime.now(UTC).hour < 12:  # read on every attempt, outside any step
        await ctx.step.run("summary", lambda: sent.setdefault(ctx.input.account, "summary"))
    else:
        await ctx.step.run("full-report", lambda: sent.setdefault(ctx.input.account, "full"))
    await ctx.step.run("archive", lambda: None)


def trio_jobs_observe() -> dict[int, str]:
    return dict(sorted(sent.items()))


def trio_jobs_reset() -> None:
    sent.clear()
