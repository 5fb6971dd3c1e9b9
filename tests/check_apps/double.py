"""A double effect: a charge outside any idempotency, repeated by a replay."""

from __future__ import annotations

import attrs

from trio_jobs import JobContext, Retry, job


@attrs.frozen
class Order:
    id: int


charged: list[int] = []


@job(name="pay", input=Order, idempotency_key=lambda o: f"pay:{o.id}", retry=Retry(attempts=5))
async def pay(ctx: JobContext[Order]) -> None:
    await ctx.step.run("charge", lambda: charged.append(ctx.input.id))
    await ctx.step.run("receipt", lambda: None)


trio_jobs_examples = {"pay": [Order(1), Order(2)]}


def trio_jobs_observe() -> list[int]:
    return sorted(charged)


def trio_jobs_reset() -> None:
    charged.clear()
