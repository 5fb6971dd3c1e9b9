"""A job that books an order in its own transaction, outside any step: a crash
after that commit and before the step's record re-runs it, and the plain INSERT
meets its own first row (a unique violation: the job dies where the clean run
finished). ``trio_jobs_setup`` makes the app's table in the gate's schema."""

from __future__ import annotations

import attrs

from trio_jobs import JobContext, Retry, Transaction, current_jobs, job


async def trio_jobs_setup(tx: Transaction) -> None:
    await tx.execute("CREATE TABLE IF NOT EXISTS ck_paid (order_id int PRIMARY KEY)", ())


@attrs.frozen
class Order:
    id: int


async def _pay(order_id: int) -> None:
    # The bug: a write of its own, not the step's (ctx.step.transaction would
    # commit the row and the step's record together).
    async with current_jobs().transaction() as tx:
        await tx.execute("INSERT INTO ck_paid VALUES (%s)", (order_id,))


@job(name="app.pay", input=Order, idempotency_key=lambda o: f"pay:{o.id}", retry=Retry(attempts=3))
async def pay(ctx: JobContext[Order]) -> None:
    await ctx.step.run("pay", lambda: _pay(ctx.input.id))
    await ctx.step.run("receipt", lambda: None)


trio_jobs_examples = {"app.pay": [Order(1)]}
