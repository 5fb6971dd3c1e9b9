"""Child jobs (step.invoke, step.gather) on the memory driver: the parent's
effect is keyed by the child's stored result, so a crash anywhere repeats
nothing."""

from __future__ import annotations

import attrs

from trio_jobs import JobContext, Retry, job


@attrs.frozen
class Order:
    id: int


@attrs.frozen
class Part:
    order: int
    n: int


shipped: dict[str, list[int]] = {}


@job(name="app.part", input=Part, idempotency_key=lambda p: f"part:{p.order}:{p.n}")
async def part(ctx: JobContext[Part]) -> int:
    return int(await ctx.step.run("weigh", lambda: ctx.input.n * 10))


@job(name="app.label", input=Order, idempotency_key=lambda o: f"label:{o.id}")
async def label(ctx: JobContext[Order]) -> str:
    return f"label-{ctx.input.id}"


@job(
    name="app.ship",
    input=Order,
    idempotency_key=lambda o: f"ship:{o.id}",
    retry=Retry(attempts=5),
)
async def ship(ctx: JobContext[Order]) -> str:
    tag = await ctx.step.invoke("label", label, ctx.input)
    weights = await ctx.step.gather("parts", [(part, Part(ctx.input.id, n)) for n in range(3)])
    await ctx.step.run("ship", lambda: shipped.setdefault(str(tag), weights))
    return str(tag)


trio_jobs_examples = {
    "app.ship": [Order(1), Order(2)],
    "app.label": [Order(7)],
    "app.part": [Part(7, 1)],
}


def trio_jobs_observe() -> dict[str, list[int]]:
    return dict(sorted(shipped.items()))


def trio_jobs_reset() -> None:
    shipped.clear()
