"""The worker's ack pipeline on Redis: the rules every driver keeps
(tests/drivers/ack_pipeline.py) on this driver, and what only it has: a batch
is one ``ack`` script call, a bad batch is refused before anything is sent, and
a batch whose reply was lost is retried ack by ack."""

from __future__ import annotations

from typing import Any

import coredis.exceptions
import pytest
import trio

from trio_jobs import JobContext, Worker, job, open_jobs
from trio_jobs.drivers import AckOptions, ClaimOptions
from trio_jobs.drivers.redis import RedisDriver, redis_driver
from trio_jobs.drivers.redis._client import translate
from trio_jobs.errors import ErrorCode, JobsError

from ..ack_pipeline import AckPipelineConformance
from .conftest import req


class TestRedisAckPipeline(AckPipelineConformance):
    @pytest.fixture
    def fresh(self, redis_url: str, redis_prefix: str) -> RedisDriver:
        return redis_driver(redis_url, prefix=redis_prefix)


@job(name="rpipe.noop", input=int, idempotency_key=lambda i: f"rpipe:{i}")
async def noop(ctx: JobContext[int]) -> int:
    return ctx.input * 2


async def _until(check: Any, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while not await check():  # noqa: ASYNC110 — bounded wait on the server
            await trio.sleep(0.02)


async def _rows(d: RedisDriver) -> list[dict[str, str]]:
    """Every job row under the driver's prefix, read directly (not through a script)."""
    client = d.client
    out = []
    async for key in client.scan_iter(match=f"{d.prefix}:job:*", count=1000):
        out.append(await client.hgetall(key))
    return out


async def _done_counted(d: RedisDriver, name: str) -> int:
    return sum(r.done for r in await d.counters(name, 0.0))


class ScriptCalls:
    """Counts the ``ack`` script calls and what each carried (wraps the driver's
    one script seam; the server runs every call for real)."""

    def __init__(self, d: RedisDriver) -> None:
        self.real = d._script
        self.acks: list[int] = []
        d._script = self  # type: ignore[method-assign]

    async def __call__(self, name: str, args: Any) -> Any:
        reply = await self.real(name, args)
        if name == "ack":
            self.acks.append(len(reply))
        return reply


async def test_the_driver_offers_the_batched_ack(driver: RedisDriver) -> None:
    # Fails on a tree whose Redis driver had no `acks` (each slot awaited its ack).
    assert driver.acks is not None
    await driver.enqueue_many([req(f"k{i}") for i in range(3)])
    got = await driver.claim(ClaimOptions("w1", {"default": 3}, 30.0))
    calls = ScriptCalls(driver)
    stale = type(got.jobs[0].fence)("w1", got.jobs[0].fence.claim + 1000)
    answers = await driver.acks.ack_many(
        [
            (got.jobs[0].id, AckOptions(fence=got.jobs[0].fence, result=1)),
            (got.jobs[1].id, AckOptions(fence=stale)),  # not its claim: refused
            (got.jobs[2].id, AckOptions(fence=got.jobs[2].fence, duration=0.5)),
            (got.jobs[0].id, AckOptions(fence=got.jobs[0].fence)),  # settled already
        ]
    )
    assert answers == [True, False, True, False]
    assert calls.acks == [4]  # one script call for the batch
    stats = await driver.stats()
    assert (sum(s.done for s in stats), sum(s.running for s in stats)) == (2, 1)
    assert await _done_counted(driver, "job") == 2


async def test_the_ack_script_takes_its_settles_as_plain_arguments(driver: RedisDriver) -> None:
    # Fails on a tree whose ack script took one JSON text of settles (it refused these).
    await driver.enqueue_many([req("p0"), req("p1")])
    got = await driver.claim(ClaimOptions("w1", {"default": 2}, 30.0))
    a, b = got.jobs
    landed = await driver._script(
        "ack",
        [
            *(a.id, "w1", str(int(a.fence.claim)), '={"n":[1,"\u00e9"]}', "", "=0.25", ""),
            *(b.id, "w1", str(int(b.fence.claim) + 1000), "", "", "", ""),  # a stale claim
        ],
    )
    assert landed == [1, 0]
    assert driver.introspect is not None
    shown = await driver.introspect.show(a.id)
    assert (shown.state, shown.result) == ("done", {"n": [1, "\u00e9"]})
    assert (await driver.introspect.show(b.id)).state == "running"
    assert await _done_counted(driver, "job") == 1


async def test_a_bad_duration_refuses_the_batch_before_anything_is_sent(
    driver: RedisDriver,
) -> None:
    assert driver.acks is not None
    await driver.enqueue_many([req("d")])
    got = await driver.claim(ClaimOptions("w1", {"default": 1}, 30.0))
    calls = ScriptCalls(driver)
    with pytest.raises(JobsError) as err:
        await driver.acks.ack_many(
            [(got.jobs[0].id, AckOptions(fence=got.jobs[0].fence, duration=-1.0))]
        )
    assert err.value.code == ErrorCode.X_INVARIANT
    assert calls.acks == []
    assert sum(s.running for s in await driver.stats()) == 1


async def test_a_batch_whose_reply_was_lost_is_recognised_by_each_retry(
    driver: RedisDriver,
) -> None:
    assert driver.acks is not None
    await driver.enqueue_many([req(f"l{i}") for i in range(2)])
    got = await driver.claim(ClaimOptions("w1", {"default": 2}, 30.0))
    real = driver._script

    async def lost(name: str, args: Any) -> Any:
        reply = await real(name, args)
        if name == "ack":
            driver._script = real  # type: ignore[method-assign]
            raise translate(coredis.exceptions.ConnectionError("connection reset"), name)
        return reply

    driver._script = lost  # type: ignore[method-assign]
    acks = [(j.id, AckOptions(fence=j.fence)) for j in got.jobs]
    with pytest.raises(JobsError) as err:
        await driver.acks.ack_many(acks)
    assert err.value.code == ErrorCode.X_DRIVER_UNAVAILABLE
    # Each retried alone (as the worker's pipeline does): landed, moved once.
    for job_id, options in acks:
        assert await driver.ack(job_id, options)
    assert await _done_counted(driver, "job") == 2
    # After a clean answer a second settle is refused again.
    assert await driver.acks.ack_many(acks) == [False, False]


async def test_a_transient_failure_of_the_batch_is_retried_alone_and_costs_no_attempt(
    redis_url: str, redis_prefix: str
) -> None:
    driver = redis_driver(redis_url, prefix=redis_prefix)
    assert driver.acks is not None
    async with open_jobs(driver, jobs=[noop]) as jobs:
        await noop.enqueue_many(range(10))
        real_flush = driver._flush_acks
        sizes: list[int] = []

        async def landed_then_dropped(batch: Any) -> set[int]:
            sizes.append(len(batch))
            landed = await real_flush(batch)
            if len(sizes) == 1:
                # The script ran and its reply is lost (a dropped connection):
                # each retry must recognise its own landed ack.
                raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "connection dropped (test)")
            return landed

        driver._flush_acks = landed_then_dropped  # type: ignore[method-assign]
        real_ack = driver.ack
        alone: list[str] = []

        async def counted_ack(job_id: str, options: AckOptions) -> bool:
            alone.append(job_id)
            return await real_ack(job_id, options)

        driver.ack = counted_ack  # type: ignore[method-assign]
        worker = Worker(jobs, concurrency=10)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)

            async def all_done() -> bool:
                return worker.stats().done == 10

            await _until(all_done)
            await worker.drain()
        rows = await _rows(driver)
        counted = await _done_counted(driver, "rpipe.noop")
    stats = worker.stats()
    assert (stats.done, stats.retried, stats.failed, stats.leases_lost) == (10, 0, 0, 0)
    assert {(r["st"], r["att"]) for r in rows} == {("done", "1")}
    assert counted == 10  # counted once, not once a try
    # Each ack of the failed batch was retried alone (driver.ack), none other was.
    assert len(alone) == sizes[0] == len(set(alone))
    assert sum(sizes[1:]) == 10 - sizes[0]
