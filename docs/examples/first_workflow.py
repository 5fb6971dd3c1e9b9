"""The code of docs/tutorial/first-workflow.md, whole and runnable.

``python docs/examples/first_workflow.py`` walks one order through the workflow
with the harness; ``tests/docs/test_examples.py`` runs that and the two tests
below under Trio's ``MockClock``, and checks that every code block of the
tutorial is a verbatim part of this file.
"""

from __future__ import annotations

import attrs
import trio

from trio_jobs import JobContext, JobsError, Retry, job, publish_event, register_error_retry
from trio_jobs.testing import open_harness


@attrs.frozen
class Order:
    order_id: str
    amount: int  # in cents


@attrs.frozen
class Confirmed:
    order_id: str
    by: str


class Payments:
    """A payment provider that keeps what it did, so a run can be checked."""

    def __init__(self) -> None:
        self.charges: list[str] = []
        self.refunds: list[str] = []

    async def charge(self, order_id: str, amount: int) -> dict[str, object]:
        self.charges.append(order_id)
        return {"charge_id": f"ch_{order_id}", "amount": amount}

    async def refund(self, charge_id: str) -> None:
        self.refunds.append(charge_id)


class Warehouse:
    """A warehouse API that fails while ``outages`` holds errors."""

    def __init__(self) -> None:
        self.shipped: list[str] = []
        self.outages: list[Exception] = []

    async def ship(self, order_id: str) -> str:
        if self.outages:
            raise self.outages.pop(0)
        self.shipped.append(order_id)
        return f"parcel-{order_id}"


payments = Payments()
warehouse = Warehouse()


def reset_world() -> None:
    """Forget what the fakes did (each test starts clean)."""
    global payments, warehouse
    payments, warehouse = Payments(), Warehouse()


# An unconfirmed order will stay unconfirmed: retrying cannot help.
register_error_retry({"X_ORDER_UNCONFIRMED": "terminal"})


@job(
    input=Order,
    idempotency_key=lambda o: f"checkout:{o.order_id}",
    compensates=True,
    retry=Retry(attempts=3, backoff="exponential", base="1m"),
)
async def checkout(ctx: JobContext[Order]) -> dict[str, str]:
    order = ctx.input
    charge = await ctx.step.run(
        "charge",
        lambda: payments.charge(order.order_id, order.amount),
        compensate=lambda stored: payments.refund(stored["charge_id"]),
    )
    await ctx.step.sleep("30m")  # the customer's window to change their mind
    confirmed = await ctx.step.wait_for_event(
        "confirmation",
        "order.confirmed",
        schema=Confirmed,
        match=lambda event: event.order_id == order.order_id,
        timeout="2d",
    )
    if confirmed is None:
        raise JobsError("X_ORDER_UNCONFIRMED", "nobody confirmed the order within two days")
    parcel = await ctx.step.run("ship", lambda: warehouse.ship(order.order_id))
    return {"charge": charge["charge_id"], "parcel": parcel, "confirmed_by": confirmed.by}


async def test_a_failed_step_is_retried_alone() -> None:
    reset_world()
    warehouse.outages.append(ConnectionError("warehouse API timed out"))
    async with open_harness(jobs=[checkout]) as h:
        trace = await h.run(checkout, Order("o-1", 4200))
        assert trace.state == "delayed"  # asleep for 30 minutes; nothing is held

        h.clock.advance("30m")
        trace = await h.drain()
        assert trace.state == "suspended"  # waiting for the confirmation

        await publish_event("order.confirmed", {"order_id": "o-1", "by": "ada"})
        trace = await h.drain()

    assert trace.state == "done"
    assert trace.attempts == 2  # the sleep and the wait handed the run back uncounted
    assert trace.steps["charge"].executions == 1  # replayed from storage, not re-charged
    assert trace.steps["ship"].executions == 2  # only the failed step ran again
    assert payments.charges == ["o-1"]
    assert trace.result == {"charge": "ch_o-1", "parcel": "parcel-o-1", "confirmed_by": "ada"}


async def test_an_unconfirmed_order_is_refunded() -> None:
    reset_world()
    async with open_harness(jobs=[checkout]) as h:
        await h.run(checkout, Order("o-2", 990))
        h.clock.advance("30m")
        await h.drain()  # now waiting for a confirmation that never comes
        h.clock.advance("2d")
        trace = await h.drain()

    assert trace.state == "dead"
    assert trace.error_code == "X_ORDER_UNCONFIRMED"
    assert trace.attempts == 1  # terminal: no retry was spent on it
    assert list(trace.steps) == [
        "charge",
        "sleep:1",
        "confirmation",
        "unwinding",
        "compensate:charge",
    ]
    assert payments.refunds == ["ch_o-2"]
    assert warehouse.shipped == []


async def main() -> None:
    """One order, start to finish, printed step by step."""
    reset_world()
    async with open_harness(jobs=[checkout]) as h:
        trace = await h.run(checkout, Order("o-42", 1500))
        print("after the first pass:", trace.state)
        h.clock.advance("30m")
        trace = await h.drain()
        print("after 30 minutes:", trace.state)
        await publish_event("order.confirmed", {"order_id": "o-42", "by": "grace"})
        trace = await h.drain()
    print("after the confirmation:", trace.state, trace.result)
    for name, step in trace.steps.items():
        print(f"  {name}: {step.status}, ran {step.executions}x")


if __name__ == "__main__":
    trio.run(main)
