"""The worker's ack pipeline on PostgreSQL: the rules every driver keeps
(tests/drivers/ack_pipeline.py) on this driver, and what only it has: its own
retry of a batch whose answer was lost, and the counter row's shards."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trio_jobs import JobContext, Worker, job, open_jobs
from trio_jobs.drivers import JobDriver
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.errors import ErrorCode, JobsError

from ..ack_pipeline import AckPipelineConformance
from .conftest import sql

pytestmark = pytest.mark.postgres


class TestPostgresAckPipeline(AckPipelineConformance):
    @pytest.fixture
    def fresh(self, pg_dsn: str, pg_schema: str) -> JobDriver:
        return postgres_driver(pg_dsn, schema=pg_schema)


@job(name="pipe.noop", input=int, idempotency_key=lambda i: f"pipe:{i}")
async def noop(ctx: JobContext[int]) -> int:
    return ctx.input * 2


async def _until(check: Any, what: str, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while not await check():  # noqa: ASYNC110 — bounded wait on the database
            await trio.sleep(0.02)


async def test_a_transient_failure_of_the_batch_is_retried_and_costs_no_attempt(
    pg_dsn: str, pg_schema: str
) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    assert driver.acks is not None
    async with open_jobs(driver, jobs=[noop]) as jobs:
        await noop.enqueue_many(range(10))
        real_flush = driver._flush_acks
        calls = 0

        async def landed_then_dropped(batch: Any) -> set[int]:
            nonlocal calls
            calls += 1
            landed = await real_flush(batch)
            if calls == 1:
                # The statement committed and its answer is lost (a dropped
                # connection): the retry must recognise its own landed ack.
                raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "connection dropped (test)")
            return landed

        driver._flush_acks = landed_then_dropped  # type: ignore[method-assign]
        worker = Worker(jobs, concurrency=10)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)

            async def all_done() -> bool:
                return worker.stats().done == 10

            await _until(all_done, "10 done")
            await worker.drain()
    stats = worker.stats()
    assert (stats.done, stats.retried, stats.failed, stats.leases_lost) == (10, 0, 0, 0)
    rows = sql(pg_dsn, pg_schema, "SELECT state, attempts FROM trio_jobs_jobs")
    assert {(r[0], r[1]) for r in rows} == {("done", 1)}
    counted = sql(pg_dsn, pg_schema, "SELECT sum(done) FROM trio_jobs_counters")
    assert counted == [(10,)]  # counted once, not once a try


async def test_the_counters_of_one_minute_sum_over_their_shards(
    pg_dsn: str, pg_schema: str
) -> None:
    # Two connections' settles of one minute land in two shards of its row
    # (migration 0031); the history reads one row with their sum.
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    async with open_jobs(driver, jobs=[noop]):
        assert driver.introspect is not None
        bucket = float(int(driver.now() // 60) * 60)
        sql(
            pg_dsn,
            pg_schema,
            "INSERT INTO trio_jobs_counters (bucket, name, shard, done, duration, queue) "
            "VALUES (%(b)s, 'pipe.noop', 3, 2, 1.5, 'default'), "
            "(%(b)s, 'pipe.noop', 7, 5, 2.5, 'default')",
            {"b": bucket},
        )
        counters = await driver.introspect.counters("pipe.noop", 0.0)
        rows = [r for r in counters if r.bucket == bucket]
    assert [(r.done, r.duration) for r in rows] == [(7, 4.0)]
