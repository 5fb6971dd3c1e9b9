"""Fixtures for the Redis driver tests.

Every test runs against the real server named by ``$REDIS_URL`` (``.ci/run``
sets it to the server on 127.0.0.1:6379), under its own key prefix, and its
keys are deleted afterwards. Without ``REDIS_URL`` these tests skip, saying so.
The server is never mocked.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import trio

from trio_jobs.drivers import EnqueueRequest, JobDriver
from trio_jobs.drivers.redis import RedisDriver, redis_driver

REDIS_URL = os.environ.get("REDIS_URL")

pytestmark = pytest.mark.skipif(
    not REDIS_URL, reason="REDIS_URL is unset: no Redis server to test the Redis driver against"
)


def _delete_prefix(url: str, prefix: str) -> None:
    import coredis

    async def go() -> None:
        client: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
        async with client:
            batch: list[str] = []
            async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    await client.delete(batch)
                    batch = []
            if batch:
                await client.delete(batch)

    trio.run(go)


@pytest.fixture(scope="session")
def redis_url() -> str:
    if not REDIS_URL:
        pytest.skip("REDIS_URL is unset: no Redis server to test the Redis driver against")
    return REDIS_URL


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix for one test; every key under it is deleted afterwards."""
    prefix = f"tj-test-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        _delete_prefix(redis_url, prefix)


@pytest.fixture
async def driver(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisDriver]:
    d = redis_driver(redis_url, prefix=redis_prefix)
    await d.open()
    try:
        yield d
    finally:
        await d.close()


def req(key: str, *, name: str = "job", queue: str = "default", **kw: object) -> EnqueueRequest:
    return EnqueueRequest(
        id=str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        name=name,
        queue=queue,
        payload={"key": key},
        idempotency_key=key,
        max_attempts=3,
        **kw,  # type: ignore[arg-type]
    )


async def contents(driver: JobDriver) -> dict[str, object]:
    """Every key under the driver's prefix with what it holds (read directly,
    outside the driver's scripts): equal before and after a call means the call
    wrote nothing."""
    assert isinstance(driver, RedisDriver)
    client = driver.client
    out: dict[str, object] = {}
    async for key in client.scan_iter(match=f"{driver.prefix}:*", count=1000):
        kind = await client.type(key)
        value: object
        if kind == "hash":
            value = await client.hgetall(key)
        elif kind == "zset":
            value = await client.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            value = sorted(await client.smembers(key))
        elif kind == "list":
            value = await client.lrange(key, 0, -1)
        else:
            value = await client.get(key)
        out[key] = (kind, value)
    return out
