"""A retried settle on Redis recognises its own landed settle (``lua/queue.lua``).

The worker retries a settle that met ``X_DRIVER_UNAVAILABLE`` (``_write_retry.py``).
The script may have run before the reply was lost (a dropped connection, a
stream timeout): the retry must then answer landed, moving nothing twice, and
never "lost lease". Here the reply is lost for real work: the script runs on the
real server, and only its answer is replaced by the error a dropped connection
gives.
"""

from __future__ import annotations

from typing import Any

import coredis.exceptions
import pytest

from trio_jobs.drivers import AckOptions, ClaimOptions, NackOptions
from trio_jobs.drivers.redis import RedisDriver
from trio_jobs.drivers.redis._client import NotConnected, translate
from trio_jobs.errors import ErrorCode, JobsError

from .conftest import req


class LostReply:
    """The next call of script ``name`` runs, then its reply is lost."""

    def __init__(self, driver: RedisDriver, name: str) -> None:
        self.real = driver._script
        self.name = name
        self.armed = True
        driver._script = self  # type: ignore[method-assign]

    async def __call__(self, name: str, args: Any) -> Any:
        reply = await self.real(name, args)
        if name == self.name and self.armed:
            self.armed = False
            raise translate(coredis.exceptions.ConnectionError("connection reset"), name)
        return reply


async def _claim_one(d: RedisDriver, key: str, name: str) -> Any:
    await d.enqueue_many([req(key, name=name)])
    got = await d.claim(ClaimOptions("w1", {"default": 1}, 30.0))
    assert len(got.jobs) == 1
    return got.jobs[0]


async def _counts(d: RedisDriver, name: str) -> tuple[int, int, int, int]:
    rows = await d.counters(name, 0.0)
    return (
        sum(r.done for r in rows),
        sum(r.retried for r in rows),
        sum(r.failed for r in rows),
        sum(r.dead for r in rows),
    )


async def test_an_ack_whose_reply_was_lost_answers_landed_when_retried(
    driver: RedisDriver,
) -> None:
    job = await _claim_one(driver, "a", "acked")
    LostReply(driver, "ack")
    ack = AckOptions(fence=job.fence, result={"r": 1})
    with pytest.raises(JobsError) as err:
        await driver.ack(job.id, ack)
    assert err.value.code == ErrorCode.X_DRIVER_UNAVAILABLE
    assert await driver.ack(job.id, ack)  # the retry: landed
    assert await _counts(driver, "acked") == (1, 0, 0, 0)
    assert not await driver.ack(job.id, ack)  # after a clean answer: refused
    assert sum(s.done for s in await driver.stats()) == 1


async def test_a_nack_whose_reply_was_lost_answers_landed_when_retried(
    driver: RedisDriver,
) -> None:
    job = await _claim_one(driver, "n", "nacked")
    LostReply(driver, "nack")
    nack = NackOptions(fence=job.fence, state="ready", counted=True, delay=60.0)
    with pytest.raises(JobsError):
        await driver.nack(job.id, nack)
    assert await driver.nack(job.id, nack)
    assert await _counts(driver, "nacked") == (0, 1, 0, 0)
    stats = await driver.stats()
    assert (sum(s.ready for s in stats), sum(s.running for s in stats)) == (1, 0)


async def test_a_retry_whose_first_try_never_ran_lands_it(driver: RedisDriver) -> None:
    job = await _claim_one(driver, "f", "first")
    real = driver._script
    calls = 0

    async def refused(name: str, args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise translate(NotConnected("ConnectionRefusedError"), name)
        return await real(name, args)

    driver._script = refused  # type: ignore[method-assign]
    with pytest.raises(JobsError):
        await driver.ack(job.id, AckOptions(fence=job.fence))
    assert await driver.ack(job.id, AckOptions(fence=job.fence))
    assert await _counts(driver, "first") == (1, 0, 0, 0)


async def test_a_retry_with_another_claims_fence_is_refused(driver: RedisDriver) -> None:
    job = await _claim_one(driver, "o", "other")
    LostReply(driver, "ack")
    with pytest.raises(JobsError):
        await driver.ack(job.id, AckOptions(fence=job.fence))
    stale = type(job.fence)(job.fence.worker_id, job.fence.claim + 1000)
    # the same job, but a claim that never settled it: refused
    driver._unsure[(job.id, stale.claim)] = True
    assert not await driver.ack(job.id, AckOptions(fence=stale))
    assert await _counts(driver, "other") == (1, 0, 0, 0)
