"""Scheduled tasks on Redis, in real time (a few seconds): two workers over one
Redis, one leader, each occurrence fired once, pause and the operator view
(``jobs.tasks()`` reads the store: the driver has no other operator surface).
The store's own rules run in the conformance suite (tests/drivers/task_store.py)."""

from __future__ import annotations

import itertools
from datetime import datetime

import trio

from trio_jobs import JobContext, Occurrence, Worker, open_jobs, task
from trio_jobs.drivers.redis import redis_driver

from .conftest import pytestmark as _skip_without_redis

pytestmark = _skip_without_redis

SEEN: list[datetime] = []


@task(every="1s", name="redis.tick")
async def tick(ctx: JobContext[Occurrence]) -> None:
    SEEN.append(ctx.input.at)


async def test_two_workers_fire_each_occurrence_once_and_pause_stops_them(
    redis_url: str, redis_prefix: str
) -> None:
    SEEN.clear()
    driver = redis_driver(redis_url, prefix=redis_prefix)
    async with open_jobs(driver, jobs=[tick]) as jobs, trio.open_nursery() as nursery:
        a = Worker(jobs, worker_id="a", idle_poll_max="250ms")
        b = Worker(jobs, worker_id="b", idle_poll_max="250ms")
        await nursery.start(a.run)
        await nursery.start(b.run)
        await trio.sleep(3.5)
        assert driver.tasks is not None
        [row] = await driver.tasks.rows()
        await jobs.pause_task("redis.tick")
        await trio.sleep(0.5)
        before = len(SEEN)
        await trio.sleep(1.5)
        after = len(SEEN)
        [view] = await jobs.tasks()
        await a.drain()
        await b.drain()
    assert row.leader in ("a", "b")
    instants = sorted(at.timestamp() for at in SEEN)
    assert len(instants) == len(set(instants)) >= 3, "one run per occurrence"
    assert all(y - x == 1 for x, y in itertools.pairwise(instants))
    assert after == before, "a paused task fires nothing"
    assert view.paused
    assert view.next_fire is None
    assert view.last_fire is not None
    assert view.last_fire.timestamp() == instants[-1]
