"""The worker's ack pipeline on PostgreSQL (``driver.acks``): a slot hands its
ack off and goes on; the pipeline sends the batch, settles each attempt by its
answer, retries a transient failure within the write budget, and holds the
attempt's room until the answer came (docs/explanation/design-choices.md,
"Acks leave the slot")."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trio_jobs import JobContext, Worker, job, open_jobs
from trio_jobs._worker import PREFETCH_MAX
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.errors import ErrorCode, JobsError

from .conftest import sql

pytestmark = pytest.mark.postgres


@job(name="pipe.noop", input=int, idempotency_key=lambda i: f"pipe:{i}")
async def noop(ctx: JobContext[int]) -> int:
    return ctx.input * 2


async def _until(check: Any, what: str, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while not await check():  # noqa: ASYNC110 — bounded wait on the database
            await trio.sleep(0.02)


async def test_acks_go_through_the_pipeline_and_each_job_is_done_once(
    pg_dsn: str, pg_schema: str
) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    assert driver.acks is not None
    batches: list[int] = []
    async with open_jobs(driver, jobs=[noop]) as jobs:
        await noop.enqueue_many(range(200))
        inner = driver.acks.ack_many

        async def counting(acks: Any) -> list[bool]:
            batches.append(len(acks))
            return await inner(acks)

        driver.acks.ack_many = counting  # type: ignore[method-assign]
        worker = Worker(jobs, concurrency=32)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)

            async def all_done() -> bool:
                return worker.stats().done == 200

            await _until(all_done, "200 done")
            await worker.drain()
    assert sum(batches) == 200  # every ack through ack_many, none through ack()
    # Never more acks in flight than rows held: a queue holds at most twice its
    # slots and its prefetch while acks are in flight.
    assert max(batches) <= 2 * (32 + PREFETCH_MAX)
    rows = sql(pg_dsn, pg_schema, "SELECT state, attempts, result::text FROM trio_jobs_jobs")
    assert len(rows) == 200
    assert {(r[0], r[1]) for r in rows} == {("done", 1)}
    assert sorted(int(str(r[2])) for r in rows) == [2 * i for i in range(200)]
    assert worker.stats().in_flight == 0


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


async def test_a_refused_ack_is_unowned_and_frees_its_room(pg_dsn: str, pg_schema: str) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    assert driver.acks is not None
    async with open_jobs(driver, jobs=[noop]) as jobs:
        await noop.enqueue(1)
        inner = driver.acks.ack_many

        async def fenced_out(acks: Any) -> list[bool]:
            # Another worker took the row over: this claim's fence no longer holds.
            sql(pg_dsn, pg_schema, "UPDATE trio_jobs_jobs SET claim = claim + 1000")
            return await inner(acks)

        driver.acks.ack_many = fenced_out  # type: ignore[method-assign]
        worker = Worker(jobs, concurrency=2)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)

            async def answered() -> bool:
                return worker.stats().in_flight == 0 and bool(
                    sql(pg_dsn, pg_schema, "SELECT 1 FROM trio_jobs_jobs WHERE claim > 1000")
                )

            await _until(answered, "the refused ack's answer")
            await worker.drain()
    assert worker.stats().done == 0
    assert sql(pg_dsn, pg_schema, "SELECT state FROM trio_jobs_jobs") == [("running",)]


async def test_an_ack_in_flight_leaves_its_room_to_the_next_claim_and_the_drain_waits_for_it(
    pg_dsn: str, pg_schema: str
) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    assert driver.acks is not None
    async with open_jobs(driver, jobs=[noop]) as jobs:
        await noop.enqueue_many(range(3))
        inner = driver.acks.ack_many
        sending = trio.Event()
        release = trio.Event()

        async def held_back(acks: Any) -> list[bool]:
            sending.set()
            await release.wait()
            return await inner(acks)

        driver.acks.ack_many = held_back  # type: ignore[method-assign]
        worker = Worker(jobs, concurrency=1, drain_timeout="30s")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await sending.wait()

            async def three_held() -> bool:
                return worker.stats().in_flight == 3

            # Waited for, not slept on: a loaded box may take longer than any sleep.
            await _until(three_held, "three rows held")
            # The body returned, its ack is held back: its room goes to the next
            # claims (one slot: the bodies ran one after another), and every
            # row is still running until its ack lands.
            assert worker.stats().in_flight == 3
            assert worker.stats().done == 0
            assert sql(
                pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs WHERE state = 'running'"
            ) == [(3,)]
            nursery.start_soon(worker.drain)
            await trio.sleep(0.3)
            release.set()
    # The drain waited for the acks' answers: the jobs are done, not handed back.
    assert worker.stats().done == 3
    assert worker.stats().drained == 0
    assert sorted(r[0] for r in sql(pg_dsn, pg_schema, "SELECT state FROM trio_jobs_jobs")) == [
        "done",
        "done",
        "done",
    ]


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
