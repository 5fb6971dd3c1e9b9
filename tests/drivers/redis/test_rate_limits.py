"""Spec: "Rate limits" on Redis: one budget for the fleet, kept in a sorted set
per window and decided by one script on the server's clock, so every driver on
the server shares it; a run refused by it is deferred with the attempt
uncounted. (The store's rules are in the conformance suite; the script's
argument checks in ``test_scripts.py``.)"""

from __future__ import annotations

import time
from typing import Any

import attrs
import pytest
import trio

from jobs_support import wait_for
from trio_jobs import (
    ErrorCode,
    JobContext,
    JobsError,
    Retry,
    Worker,
    job,
    open_jobs,
    rate_limiter,
    redis_driver,
)
from trio_jobs.drivers.redis import RedisDriver

from .conftest import pytestmark as _skip_without_redis

pytestmark = _skip_without_redis


async def test_two_drivers_on_one_server_share_one_budget(
    redis_url: str, redis_prefix: str
) -> None:
    """Two drivers are two processes' views of the server: one budget."""
    limiter = rate_limiter("redis.vendor", limit=5, per="1h")
    granted = {"a": 0, "b": 0}
    waits: list[float] = []

    async def hammer(who: str) -> None:
        async with open_jobs(redis_driver(redis_url, prefix=redis_prefix)) as jobs:
            assert jobs.driver.rate_limits is not None
            assert jobs.driver.rate_limits.shared is True
            for _ in range(8):
                try:
                    await limiter.acquire()
                    granted[who] += 1
                except JobsError as exc:
                    assert exc.code == ErrorCode.X_RATE_LIMITED
                    waits.append(exc.meta["retry_after_seconds"])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hammer, "a")
        nursery.start_soon(hammer, "b")
    assert sum(granted.values()) == 5
    # the 11 refused queue over the hours to come, 5 an hour: none before the
    # first grant leaves, at most 5 told to come back in any one hour
    assert len(waits) == 11
    waits.sort()
    assert waits[0] > 3500
    assert all(
        later - earlier >= 3600 - 1 for earlier, later in zip(waits, waits[5:], strict=False)
    )
    assert waits[-1] > 2 * 3600


async def test_a_window_key_expires_once_its_window_would_empty(driver: RedisDriver) -> None:
    assert driver.rate_limits is not None
    assert (await driver.rate_limits.acquire("redis.ttl", "acct", 3, 2.0)).granted
    keys = [k async for k in driver.client.scan_iter(match=f"{driver.prefix}:rate:*")]
    window = f"{driver.prefix}:rate:9:redis.ttl:acct"
    assert window in keys
    assert 0 < await driver.client.pttl(window) <= 3000


async def test_the_queue_key_expires_once_its_last_promise_has_passed(
    driver: RedisDriver,
) -> None:
    assert driver.rate_limits is not None
    # A loaded box may take a while between the calls: every bound below allows
    # for the time that passed since just before the first one.
    began = time.monotonic()
    assert (await driver.rate_limits.acquire("redis.q", "acct", 1, 2.0)).granted
    for n in (1, 2, 3):  # one place per window: 2, 4 and 6 seconds from the first
        wait = (await driver.rate_limits.acquire("redis.q", "acct", 1, 2.0)).retry_after
        assert 2.0 * n - (time.monotonic() - began) - 0.05 <= wait <= 2.0 * n + 0.05, (n, wait)
    queue = f"{driver.prefix}:rateq:7:redis.q:acct"
    window = f"{driver.prefix}:rate:7:redis.q:acct"
    # the queue outlives the window: a second after its last promise
    queue_ttl = await driver.client.pttl(queue)
    passed_ms = (time.monotonic() - began) * 1000
    assert 6000 - passed_ms < queue_ttl <= 7000
    assert 0 < await driver.client.pttl(window) <= 3000


@attrs.frozen
class Send:
    key: str


async def test_a_worker_defers_runs_over_the_budget_uncounted(
    redis_url: str, redis_prefix: str
) -> None:
    limiter = rate_limiter("redis.worker", limit=2, per="1h")
    sent: list[int] = []

    @job(input=Send, tenant="none", idempotency_key=lambda s: s.key, retry=Retry(attempts=1))
    async def send(ctx: JobContext[Send]) -> None:
        await limiter.acquire()
        sent.append(ctx.attempt)

    driver = redis_driver(redis_url, prefix=redis_prefix)
    async with open_jobs(driver, jobs=[send]) as jobs:
        ids = [e.id for e in await send.enqueue_many([Send(f"k{i}") for i in range(6)])]
        worker = Worker(jobs, concurrency=4)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)

            async def settled() -> Any:
                [stats] = await driver.stats()
                return stats if stats.done == 2 and stats.ready == 4 else None

            stats = await wait_for(settled, timeout=20, step=0.05, what="2 done, 4 deferred")
            await worker.drain()
        logs = [await driver.attempt_log(i) for i in ids]
    assert stats.dead == stats.failed == 0
    assert sent == [1, 1]
    deferred = [log for log in logs if log[-1].outcome == "handed-back"]
    assert len(deferred) == 4
    for log in deferred:
        assert log[-1].attempt == 1
        assert log[-1].error_code == ErrorCode.X_RATE_LIMITED
    assert worker.stats().retried == worker.stats().dead_lettered == 0


@pytest.mark.parametrize("limit", [1, 3])
async def test_concurrent_acquirers_on_one_driver_get_exactly_the_limit(
    driver: RedisDriver, limit: int
) -> None:
    assert driver.rate_limits is not None
    answers: list[bool] = []

    async def one() -> None:
        answers.append((await driver.rate_limits.acquire("redis.race", "", limit, 60.0)).granted)  # type: ignore[union-attr]

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(one)
    assert answers.count(True) == limit
