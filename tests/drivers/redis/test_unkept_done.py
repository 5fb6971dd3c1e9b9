"""``redis_driver(done_retention=0)`` beyond the conformance rules
(``testing/_conformance_unkept.py``): the option's refusals, no key or index
entry left naming a deleted job, the retry of an ack whose reply was lost, and
the TTL of the rows that are kept (a child, a ``unique_for=`` row)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import coredis.exceptions
import pytest

from trio_jobs import redis_driver
from trio_jobs.drivers import AckOptions, ClaimOptions, StepRecord
from trio_jobs.drivers.redis import RedisDriver
from trio_jobs.drivers.redis._client import translate
from trio_jobs.errors import ErrorCode, JobsError

from .conftest import contents, req
from .conftest import pytestmark as _skip_without_redis

pytestmark = _skip_without_redis


@pytest.fixture
async def driver(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisDriver]:
    d = redis_driver(redis_url, prefix=redis_prefix, done_retention=0)
    await d.open()
    yield d
    await d.close()


def _claim(queue: str = "default", n: int = 10) -> ClaimOptions:
    return ClaimOptions("w1", {queue: n}, 30.0)


async def _done_counted(driver: RedisDriver, name: str) -> int:
    assert driver.introspect is not None
    return sum(r.done for r in await driver.introspect.counters(name, 0.0))


@pytest.mark.parametrize("bad", [-1, "-1s", "soon", None, True, "200y"])
def test_a_done_retention_that_is_neither_a_duration_nor_0_is_refused(bad: object) -> None:
    with pytest.raises(JobsError) as err:
        redis_driver("redis://127.0.0.1:6379/0", done_retention=bad)  # type: ignore[arg-type]
    assert err.value.code == ErrorCode.X_CONFIG_INVALID
    message = err.value.message
    assert "done_retention of the Redis driver" in message
    assert '"14d"' in message
    assert "or 0 (keep no done rows" in message


@pytest.mark.parametrize(("value", "keep"), [(0, False), ("0s", False), ("14d", True), (60, True)])
def test_0_keeps_no_done_rows_and_a_duration_is_a_ttl(value: object, keep: bool) -> None:
    driver = redis_driver("redis://127.0.0.1:6379/0", done_retention=value)  # type: ignore[arg-type]
    assert driver.keep_done is keep


async def test_nothing_under_the_prefix_names_a_deleted_job(driver: RedisDriver) -> None:
    await driver.enqueue_many([req("gone", concurrency_key="slot"), req("stays")])
    jobs = (await driver.claim(_claim())).jobs
    gone = next(j for j in jobs if j.idempotency_key == "gone")
    assert await driver.steps.put(gone.id, gone.fence, StepRecord("s", "completed", 1, 1, 42))
    assert driver.leases is not None
    assert (await driver.leases.acquire("slot", 1, gone.id, gone.fence, 30.0)).slot == 0
    assert await driver.ack(gone.id, AckOptions(fence=gone.fence, result={"r": 1}))
    written = repr(await contents(driver))
    assert gone.id not in written  # no hash, steps, slot, live key, index or set member
    stays = next(j for j in jobs if j.idempotency_key == "stays")
    assert stays.id in written
    assert await _done_counted(driver, "job") == 1
    (stat,) = [s for s in await driver.stats() if s.queue == "default"]
    assert (stat.running, stat.done) == (1, 0)


async def test_a_retry_of_an_ack_whose_reply_was_lost_answers_landed_once(
    driver: RedisDriver,
) -> None:
    assert driver.acks is not None
    await driver.enqueue_many([req(f"l{i}") for i in range(2)])
    got = await driver.claim(_claim(n=2))
    real = driver._script

    async def lost(name: str, args: Any) -> Any:
        reply = await real(name, args)
        if name == "ack":
            driver._script = real  # type: ignore[method-assign]
            raise translate(coredis.exceptions.ConnectionError("connection reset"), name)
        return reply

    driver._script = lost  # type: ignore[method-assign]
    acks = [(j.id, AckOptions(fence=j.fence)) for j in got.jobs]
    with pytest.raises(JobsError):
        await driver.acks.ack_many(acks)
    for job_id, options in acks:  # the rows are gone: the retry knows the job is done
        assert await driver.ack(job_id, options)
    assert await _done_counted(driver, "job") == 2
    assert await driver.acks.ack_many(acks) == [False, False]  # after a clean answer


async def test_a_kept_child_and_unique_for_row_expire_as_a_kept_done_row(
    driver: RedisDriver,
) -> None:
    await driver.enqueue_many([req("parent", queue="parents")])
    (parent,) = (await driver.claim(_claim("parents", 1))).jobs
    wait = str(uuid.uuid4())
    child = attrs.evolve(
        req(f"{parent.run_id}:c", queue="kids"), id=wait, parent_id=parent.id, parent_wait=wait
    )
    async with driver.transaction() as tx:
        (child_id,) = [r.id for r in await tx.enqueue_many([child])]
        record = StepRecord("c", "waiting", 0, 1, {"children": [child_id], "wait": wait})
        assert await tx.put_step(parent.id, parent.fence, record)
    await driver.enqueue_many([attrs.evolve(req("u"), unique_for=60.0)])
    (kid,) = (await driver.claim(_claim("kids", 1))).jobs
    (unique,) = (await driver.claim(_claim("default", 1))).jobs
    assert await driver.ack(kid.id, AckOptions(fence=kid.fence, result={"v": 7}))
    assert await driver.ack(unique.id, AckOptions(fence=unique.fence))
    client = driver.client
    for kept in (kid.id, unique.id):
        ttl = await client.ttl(f"{driver.prefix}:job:{kept}")
        assert 14 * 86400 - 60 < ttl <= 14 * 86400  # the other drivers' Retention default
    assert await client.exists([f"{driver.prefix}:kids:{parent.id}"]) == 1
    assert await driver.ack(parent.id, AckOptions(fence=parent.fence))
    written = await contents(driver)
    assert not [k for k in written if parent.id in k]  # its children list too
    assert parent.id not in repr(written[f"{driver.prefix}:all"])
    assert parent.id not in repr(written[f"{driver.prefix}:ids"])
    assert kid.id in repr(written[f"{driver.prefix}:all"])  # the kept child is listed
