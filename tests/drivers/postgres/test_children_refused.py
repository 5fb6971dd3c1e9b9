"""Child jobs are not run on PostgreSQL yet: ``step.invoke`` refuses with
``X_NOT_IMPLEMENTED`` before anything is written (no child row, no step record
past the refusal), rather than enqueueing a child whose settle would never wake
its parent. See docs/how-to/child-jobs.md."""

from __future__ import annotations

import pytest
import trio

from trio_jobs import ErrorCode, JobContext, Retry, Worker, job, open_jobs
from trio_jobs.drivers.postgres import postgres_driver

pytestmark = pytest.mark.postgres


@job(input=int, idempotency_key=lambda n: f"child:{n}", name="pgchild.square")
async def square(ctx: JobContext[int]) -> int:
    return ctx.input * ctx.input


@job(
    input=int,
    idempotency_key=lambda n: f"parent:{n}",
    name="pgchild.parent",
    retry=Retry(attempts=1),
)
async def parent(ctx: JobContext[int]) -> int:
    return int(await ctx.step.invoke("one", square, ctx.input))


async def test_invoke_is_refused_on_postgres_and_enqueues_no_child(
    pg_dsn: str, pg_schema: str
) -> None:
    async with open_jobs(postgres_driver(pg_dsn, schema=pg_schema), jobs=[parent, square]) as jobs:
        enq = await parent.enqueue(3)
        worker = Worker(jobs, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                while (await jobs.show(enq.id)).state not in ("done", "dead", "failed"):  # noqa: ASYNC110 — bounded wait on the queue
                    await trio.sleep(0.05)
            await worker.drain()
        view = await jobs.show(enq.id)
        rows = (await jobs.list(limit=10)).rows
    assert view.state == "dead"
    assert view.error_code == ErrorCode.X_NOT_IMPLEMENTED
    assert [r.name for r in rows] == ["pgchild.parent"]  # no child was enqueued
