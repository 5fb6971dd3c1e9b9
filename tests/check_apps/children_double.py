"""A child-job parent with a double effect: it counts each label it got outside
any step, so a replay after the invoke (which answers the stored result without
running the child again) counts it again."""

from __future__ import annotations

import attrs

from trio_jobs import JobContext, Retry, job


@attrs.frozen
class Order:
    id: int


labels: list[str] = []


@job(name="app.label", input=Order, idempotency_key=lambda o: f"label:{o.id}")
async def label(ctx: JobContext[Order]) -> str:
    return f"label-{ctx.input.id}"


@job(
    name="app.ship",
    input=Order,
    idempotency_key=lambda o: f"ship:{o.id}",
    retry=Retry(attempts=5),
)
async def ship(ctx: JobContext[Order]) -> None:
    tag = await ctx.step.invoke("label", label, ctx.input)
    labels.append(str(tag))  # the bug: an effect outside a step, repeated by every replay
    await ctx.step.run("ship", lambda: None)


trio_jobs_examples = {"app.ship": [Order(1)], "app.label": [Order(7)]}


def trio_jobs_observe() -> list[str]:
    return sorted(labels)


def trio_jobs_reset() -> None:
    labels.clear()
