"""Child jobs (``step.invoke``/``step.gather``) on the Redis driver, through a
real worker: the memory driver's rules (tests/steps/test_children.py), on the
server. A child's settle counts its parent down in the settle's own script and
the last one makes the parent due at once (its backstop poll is 30 s: every
wait here is bounded well under it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs
import orjson
import pytest
import trio

from trio_jobs import ErrorCode, JobContext, Retry, Worker, job, open_jobs, redis_driver
from trio_jobs.testing._harness import HarnessClock

from .conftest import pytestmark as _skip_without_redis

pytestmark = _skip_without_redis


@attrs.frozen
class Key:
    key: str


@job(input=int, idempotency_key=lambda n: str(n), name="rchild.square")
async def square(ctx: JobContext[int]) -> int:
    return ctx.input * ctx.input


@job(input=int, idempotency_key=lambda n: str(n), name="rchild.boom", retry=Retry(attempts=1))
async def boom(ctx: JobContext[int]) -> int:
    raise ValueError("no")


resumed: list[Any] = []


@job(input=Key, idempotency_key=lambda k: k.key, name="rchild.parent", retry=Retry(attempts=1))
async def parent(ctx: JobContext[Key]) -> Any:
    one = await ctx.step.invoke("one", square, 3)
    many = await ctx.step.gather("many", [(square, n) for n in range(5)])
    resumed.append((one, many))
    return {"one": one, "many": many}


@job(input=Key, idempotency_key=lambda k: k.key, name="rchild.failing", retry=Retry(attempts=1))
async def failing(ctx: JobContext[Key]) -> Any:
    return await ctx.step.invoke("bad", boom, 1)


@job(input=int, idempotency_key=lambda n: f"slow:{n}", name="rchild.slow")
async def slow(ctx: JobContext[int]) -> int:
    await ctx.step.sleep("1h", name="nap")
    return ctx.input


@job(input=Key, idempotency_key=lambda k: k.key, name="rchild.waiting", retry=Retry(attempts=1))
async def waiting(ctx: JobContext[Key]) -> Any:
    return await ctx.step.gather("slow", [(slow, n) for n in range(3)])


JOBS = [square, boom, parent, failing, slow, waiting]


async def _settled(jobs: Any, job_id: str, timeout: float = 10.0) -> Any:
    with trio.fail_after(timeout):
        while True:
            view = await jobs.show(job_id)
            if view.state in ("done", "dead", "failed", "cancelled"):
                return view
            await trio.sleep(0.02)


async def test_a_parent_resumes_with_its_childrens_results(
    redis_url: str, redis_prefix: str
) -> None:
    resumed.clear()
    async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=JOBS) as jobs:
        enq = await parent.enqueue(Key("p1"))
        worker = Worker(jobs, concurrency=8, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            view = await _settled(jobs, enq.id)  # far under the 30 s backstop poll
            await worker.drain()
        assert view.state == "done"
        assert view.result == {"one": 9, "many": [0, 1, 4, 9, 16]}
        assert resumed == [(9, [0, 1, 4, 9, 16])]
        assert view.attempts == 1  # waiting on children spent no attempt
        assert len(view.children) == 6
        kids = [await jobs.show(c) for c in view.children]
        assert {k.parent_id for k in kids} == {enq.id}
        assert [k.result for k in kids] == [9, 0, 1, 4, 9, 16]


async def test_a_failed_child_fails_its_parent(redis_url: str, redis_prefix: str) -> None:
    async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=JOBS) as jobs:
        enq = await failing.enqueue(Key("f1"))
        worker = Worker(jobs, concurrency=4, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            view = await _settled(jobs, enq.id)
            await worker.drain()
        assert view.state == "dead"
        assert view.error_code == ErrorCode.X_CHILD_FAILED
        (child,) = view.children
        assert (await jobs.show(child)).state == "dead"


async def test_cancelling_a_parent_cancels_its_live_children(
    redis_url: str, redis_prefix: str
) -> None:
    async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=JOBS) as jobs:
        enq = await waiting.enqueue(Key("w1"))
        worker = Worker(jobs, concurrency=8, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(10):
                while True:
                    view = await jobs.show(enq.id)
                    kids = [await jobs.show(c) for c in view.children]
                    if len(kids) == 3 and all(k.state == "delayed" for k in kids):
                        break
                    await trio.sleep(0.02)
            assert view.state == "suspended"
            await jobs.cancel(enq.id, reason="not needed")
            await worker.drain()
        assert {(await jobs.show(c)).state for c in view.children} == {"cancelled"}
        assert (await jobs.show(enq.id)).state == "cancelled"


@pytest.mark.parametrize("n", [0])
async def test_children_of_no_ids_reads_nothing(redis_url: str, redis_prefix: str, n: int) -> None:
    async with open_jobs(redis_driver(redis_url, prefix=redis_prefix), jobs=JOBS) as jobs:
        assert await jobs.driver.steps.children([]) == []
        gone = await jobs.driver.steps.children(["00000000-0000-4000-8000-00000000000" + str(n)])
        assert (gone[0].state, gone[0].error_code) == ("cancelled", ErrorCode.X_ABORTED)


# --------------------------------------------------------------------------- crash_proof


_NEXT_WAKE = """
local P = ARGV[1]
local best = nil
local ready = false
local function top(k)
  local t = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if #t > 0 and (not best or tonumber(t[2]) < best) then best = tonumber(t[2]) end
end
top(P .. ':running')
for _, q in ipairs(redis.call('SMEMBERS', P .. ':queues')) do
  top(P .. ':sched:' .. q)
  if redis.call('ZCARD', P .. ':ready:' .. q) > 0 then ready = true end
end
if ready then return 'ready' end
if best then return string.format('%.6f', best) end
return ''
"""


class RedisGround:
    """crash_proof's runs on the Redis server: each run under a key prefix of
    its own (below the test's, deleted with it), on a frozen clock of its own
    sent with every script call."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.runs = 0

    @contextlib.asynccontextmanager
    async def world(self, handles: list[Any]) -> AsyncIterator[tuple[Any, Any, HarnessClock]]:
        self.runs += 1
        clock = HarnessClock()
        driver = redis_driver(self.url, prefix=f"{self.prefix}:{self.runs}", clock=clock)
        async with open_jobs(driver, jobs=handles) as facade:
            yield facade, driver, clock

    async def next_wake(self, driver: Any) -> float | None:
        """The first lease to end or delayed row to fall due; now, when a row is
        ready; None when no row is live."""
        got = await driver.client.eval(_NEXT_WAKE, args=[driver.prefix])
        if got == "ready":
            return float(driver.now())
        return float(got) if got else None

    async def started_step(self, driver: Any) -> bool:
        async for key in driver.client.scan_iter(match=f"{driver.prefix}:steps:*"):
            for value in (await driver.client.hgetall(key)).values():
                if orjson.loads(value.partition("\n")[2])["status"] == "started":
                    return True
        return False


@job(input=int, idempotency_key=lambda n: str(n), name="rcp.kid", retry=Retry(attempts=5))
async def cp_kid(ctx: JobContext[int]) -> int:
    return ctx.input * ctx.input


@job(input=int, idempotency_key=lambda n: str(n), name="rcp.parent", retry=Retry(attempts=5))
async def cp_parent(ctx: JobContext[int]) -> int:
    one = await ctx.step.invoke("one", cp_kid, ctx.input)
    many = await ctx.step.gather("many", [(cp_kid, i) for i in range(3)])
    return int(one + sum(many))


async def test_crash_proof_walks_the_child_boundaries_on_redis(
    redis_url: str, redis_prefix: str
) -> None:
    """Killed before a child's enqueue, after it, before the parent resumes and
    after its record, on the Redis server: every run ends as the clean one
    (state, result, every step's stored output)."""
    from trio_jobs.testing._crash import _crash_proof

    ground = RedisGround(redis_url, redis_prefix)
    report = await _crash_proof(
        cp_parent, 3, observe=None, reset=None, jobs=[cp_kid], ground=ground
    )
    for step in ("one", "many"):
        for boundary in ("before-step", "after-enqueue", "before-resume", "after-record"):
            assert f"{boundary}:{step}" in report.points, (boundary, step, report.points)
    assert report.reference[0] == 14
    assert ground.runs == report.boundaries + 1  # the clean run, then one per boundary
