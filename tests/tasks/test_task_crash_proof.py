"""crash_proof covers a task: its run is a job's run, killed at every boundary
and resumed, with the same effects as a clean run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from trio_jobs import JobContext, Occurrence, Retry, task
from trio_jobs.testing import crash_proof

EFFECTS: set[tuple[str, str]] = set()


@task(every="1m", name="crash.tick", retry=Retry(attempts=5))
async def tick(ctx: JobContext[Occurrence]) -> None:
    at = ctx.input.at.isoformat()
    await ctx.step.run("a", lambda: EFFECTS.add(("a", at)))
    await ctx.step.run("b", lambda: EFFECTS.add(("b", at)))


async def test_a_tasks_run_is_crash_proof(autojump_clock: Any) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    report = await crash_proof(
        tick, Occurrence(at), observe=lambda: sorted(EFFECTS), reset=EFFECTS.clear
    )
    assert report.boundaries >= 6
    assert sorted(EFFECTS) == [("a", at.isoformat()), ("b", at.isoformat())]
