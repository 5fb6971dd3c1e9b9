"""An app whose jobs pass the gate: inputs drawn by Hypothesis, hooks defined."""

from __future__ import annotations

import attrs

from trio_jobs import JobContext, Retry, job


@attrs.frozen
class Order:
    id: int
    cents: int


charges: dict[str, int] = {}


def charge(key: str, cents: int) -> str:
    charges.setdefault(key, cents)  # keyed by the step's own key: a retry changes nothing
    return key


@job(
    name="checkout",
    input=Order,
    idempotency_key=lambda o: f"checkout:{o.id}",
    retry=Retry(attempts=5),
)
async def checkout(ctx: JobContext[Order]) -> str:
    key = await ctx.step.run("charge", lambda: charge(f"order-{ctx.input.id}", ctx.input.cents))
    await ctx.step.sleep("1h")
    await ctx.step.run("ship", lambda: None)
    return str(key)


@job(name="nightly", input=None, idempotency_key=lambda _: "nightly", retry=Retry(attempts=5))
async def nightly(ctx: JobContext[None]) -> int:
    return int(await ctx.step.run("count", lambda: len(charges)))


def trio_jobs_observe() -> dict[str, int]:
    return dict(sorted(charges.items()))


def trio_jobs_reset() -> None:
    charges.clear()
