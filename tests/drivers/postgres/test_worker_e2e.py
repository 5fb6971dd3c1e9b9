"""The real worker on the PostgreSQL driver: enqueue in a transaction, run a
multi-step job to completion, steps recorded through the group commit."""

from __future__ import annotations

import uuid

import attrs
import pytest
import trio

from trio_jobs import JobContext, Worker, job, open_jobs
from trio_jobs.drivers.postgres import postgres_driver

from ..busy_wait import check_a_busy_key_wakes_its_waiter, check_many_runs_queue_behind_few_keys
from .conftest import sql

pytestmark = pytest.mark.postgres

ran: dict[str, int] = {}


@attrs.frozen
class Order:
    order_id: uuid.UUID


@job(input=Order, tenant="none", idempotency_key=lambda i: f"order:{i.order_id}")
async def ship(ctx: JobContext[Order]) -> dict[str, str]:
    charge = await ctx.step.run(
        "charge", lambda: ran.__setitem__("charge", ran.get("charge", 0) + 1) or {"id": "c1"}
    )
    await ctx.step.run("pack", lambda: ran.__setitem__("pack", ran.get("pack", 0) + 1))
    return {"charge": charge["id"]}


async def test_a_worker_runs_jobs_enqueued_in_a_transaction(pg_dsn: str, pg_schema: str) -> None:
    ran.clear()
    sql(pg_dsn, pg_schema, "CREATE TABLE orders (id uuid PRIMARY KEY)")
    order_ids = [uuid.uuid4() for _ in range(5)]
    async with open_jobs(postgres_driver(pg_dsn, schema=pg_schema), jobs=[ship]) as jobs:
        async with jobs.transaction() as tx:
            for oid in order_ids:
                await tx.execute("INSERT INTO orders VALUES (%s)", (oid,))
                await ship.enqueue(Order(order_id=oid))
        worker = Worker(jobs, queues=["default"], concurrency={"default": 4}, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                while (await jobs.stats())[0].done < len(order_ids):  # noqa: ASYNC110 — bounded wait on the queue
                    await trio.sleep(0.05)
            await worker.drain()
        assert ran == {"charge": 5, "pack": 5}
        views = [await jobs.show(r.id) for r in (await jobs.list(limit=10)).rows]
    assert {v.state for v in views} == {"done"}
    assert all(v.result == {"charge": "c1"} for v in views)
    assert all([s.name for s in v.steps] == ["charge", "pack"] for v in views)


async def test_a_run_waiting_on_a_busy_key_starts_when_the_holder_settles(
    pg_dsn: str, pg_schema: str
) -> None:
    await check_a_busy_key_wakes_its_waiter(postgres_driver(pg_dsn, schema=pg_schema))


async def test_many_runs_queue_behind_few_keys(pg_dsn: str, pg_schema: str) -> None:
    await check_many_runs_queue_behind_few_keys(postgres_driver(pg_dsn, schema=pg_schema))


@job(name="e2e.nul", input=int, idempotency_key=lambda i: f"nul:{i}")
async def fails_with_nul(ctx: JobContext[int]) -> None:
    await ctx.step.run("decode", _raise_nul)


def _raise_nul() -> None:
    raise ValueError("bad byte \x00 in \ud800 input")


async def test_an_error_message_holding_nul_is_recorded_not_refused(
    pg_dsn: str, pg_schema: str
) -> None:
    """PostgreSQL text holds no NUL: an exception whose message carries one (a
    decoder's, say) made the settle and the step record fail with a raw
    DataError, and the run stayed held until its lease lapsed. The message is
    recorded with U+FFFD in place of what no driver can store."""
    async with open_jobs(postgres_driver(pg_dsn, schema=pg_schema), jobs=[fails_with_nul]) as jobs:
        got = await fails_with_nul.enqueue(1)
        worker = Worker(jobs, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                while (await jobs.show(got.id)).attempts < 3 or (  # noqa: ASYNC110 — bounded wait
                    await jobs.show(got.id)
                ).state != "dead":
                    await trio.sleep(0.05)
            await worker.drain()
        view = await jobs.show(got.id)
    assert view.last_error is not None
    assert "ValueError: bad byte \ufffd in \ufffd input" in view.last_error
    assert [(s.name, s.status, s.error) for s in view.steps] == [
        ("decode", "failed", "ValueError: bad byte \ufffd in \ufffd input")
    ]
