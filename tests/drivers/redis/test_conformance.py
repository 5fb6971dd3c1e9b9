"""The conformance suite, unchanged, on the Redis driver.

Each test gets its own key prefix on the server named by ``REDIS_URL`` (deleted
afterwards); the driver's clock is a :class:`ManualClock` sent with every script
call (the test-only override of the server's ``TIME``), so ``advance`` lapses
leases and brings delayed rows due without sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from trio_jobs.drivers.redis import redis_driver
from trio_jobs.testing._conformance_children import ChildrenConformance
from trio_jobs.testing._conformance_debounce import DebounceConformance
from trio_jobs.testing._conformance_unkept import UnkeptDoneConformance
from trio_jobs.testing.conformance import DriverConformance, ManualClock, Target

from ..refusals import RefusalConformance
from ..task_store import TaskStoreConformance
from .conftest import contents
from .conftest import pytestmark as _skip_without_redis

pytestmark = _skip_without_redis


class TestRedisConformance(
    DriverConformance,
    ChildrenConformance,
    DebounceConformance,
    RefusalConformance,
    TaskStoreConformance,
    UnkeptDoneConformance,
):
    @pytest.fixture
    async def target(self, redis_url: str, redis_prefix: str) -> AsyncIterator[Target]:
        clock = ManualClock()
        driver = redis_driver(redis_url, prefix=redis_prefix, clock=clock)
        await driver.open()
        yield Target(driver, clock.advance)
        await driver.close()

    @pytest.fixture
    async def unkept_target(self, redis_url: str, redis_prefix: str) -> AsyncIterator[Target]:
        clock = ManualClock()
        driver = redis_driver(redis_url, prefix=redis_prefix, clock=clock, done_retention=0)
        await driver.open()
        yield Target(driver, clock.advance)
        await driver.close()

    async def written(self, target: Target) -> object:
        return await contents(target.driver)
