"""``postgres_driver(done_retention=0)``: the ack deletes a done row, through a
real worker (the driver-level rules are the conformance suite's,
``trio_jobs.testing._conformance_unkept``)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from trio_jobs import ErrorCode, JobContext, JobsError, Retry, Worker, job, open_jobs
from trio_jobs.drivers import AckOptions, ClaimOptions
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.testing.conformance import request

pytestmark = pytest.mark.postgres


@attrs.frozen
class Key:
    key: str


@job(input=int, idempotency_key=lambda n: str(n), name="unkept.square")
async def square(ctx: JobContext[int]) -> int:
    return ctx.input * ctx.input


resumed: list[Any] = []


@job(input=Key, idempotency_key=lambda k: k.key, name="unkept.parent", retry=Retry(attempts=1))
async def parent(ctx: JobContext[Key]) -> Any:
    one = await ctx.step.invoke("one", square, 3)
    many = await ctx.step.gather("many", [(square, n) for n in range(5)])
    resumed.append((one, many))
    return {"one": one, "many": many}


async def test_a_parent_reads_its_childrens_results_then_its_own_row_goes(
    pg_dsn: str, pg_schema: str
) -> None:
    resumed.clear()
    driver = postgres_driver(pg_dsn, schema=pg_schema, done_retention=0)
    async with open_jobs(driver, jobs=[parent, square]) as jobs:
        enq = await parent.enqueue(Key("p1"))
        worker = Worker(jobs, concurrency=8, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):  # far under the 30 s backstop poll
                while True:
                    row = "SELECT 1 FROM trio_jobs_jobs WHERE id = %s"
                    if resumed and not await driver.db.fetch(row, (enq.id,)):
                        break
                    await trio.sleep(0.02)
            await worker.drain()
        assert resumed == [(9, [0, 1, 4, 9, 16])]
        with pytest.raises(JobsError) as gone:
            await jobs.show(enq.id)
        assert gone.value.code == ErrorCode.X_JOB_NOT_FOUND
        # the children keep their rows (their parent read them); the parent's steps went
        kids = await driver.db.fetch(
            "SELECT state, parent_id::text FROM trio_jobs_jobs ORDER BY created_at"
        )
        assert [tuple(k) for k in kids] == [("done", enq.id)] * 6
        steps = await driver.db.fetch(
            "SELECT count(*) FROM trio_jobs_steps WHERE job_id = %s", (enq.id,)
        )
        assert steps[0][0] == 0
        counted = await driver.introspect.counters("unkept.parent", 0.0)
        assert sum(r.done for r in counted) == 1


async def test_the_retry_of_an_ack_whose_answer_was_lost_answers_landed(
    pg_dsn: str, pg_schema: str
) -> None:
    """The row is gone, so the retry (``again``) cannot see its claim on it: a
    gone row's job is not running anywhere, and the retry answers landed."""
    driver = postgres_driver(pg_dsn, schema=pg_schema, done_retention=0)
    await driver.open()
    try:
        await driver.enqueue_many([request("unkept.lost")])
        opts = ClaimOptions(worker_id="w1", queues={"default": 1}, visibility_timeout=30.0)
        (job,) = (await driver.claim(opts)).jobs
        assert await driver.ack(job.id, AckOptions(fence=job.fence))
        assert not await driver.ack(job.id, AckOptions(fence=job.fence))  # a clean answer
        driver._unsure[(job.id, job.fence.claim)] = True  # "the answer never came"
        assert await driver.ack(job.id, AckOptions(fence=job.fence))
    finally:
        await driver.close()
