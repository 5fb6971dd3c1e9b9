"""A race: a read and a write in two steps lose updates under concurrency."""

from __future__ import annotations

import attrs

from trio_jobs import JobContext, Retry, job
from trio_jobs.testing import World


@attrs.frozen
class Deposit:
    id: int
    cents: int


balance = {"total": 0}


@job(
    name="deposit",
    input=Deposit,
    idempotency_key=lambda d: f"deposit:{d.id}",
    retry=Retry(attempts=10),
)
async def deposit(ctx: JobContext[Deposit]) -> None:
    seen = await ctx.step.run("read", lambda: balance["total"])
    await ctx.step.run("write", lambda: balance.__setitem__("total", seen + ctx.input.cents))


trio_jobs_examples = {"deposit": [Deposit(i, 10 * (i + 1)) for i in range(4)]}


def trio_jobs_reset() -> None:
    balance["total"] = 0


def trio_jobs_invariant(world: World) -> None:
    done = sum(j.payload["cents"] for j in world.jobs if j.name == "deposit" and j.state == "done")
    assert balance["total"] == done, "a deposit was lost"
