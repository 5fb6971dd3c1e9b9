"""The conformance suite, unchanged, on the PostgreSQL driver.

Each test gets a fresh schema; the driver's clock is a :class:`ManualClock`
sent with every statement (the test-only override of the database's now), so
``advance`` lapses leases and brings delayed rows due without sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.testing._conformance_children import ChildrenConformance
from trio_jobs.testing._conformance_debounce import DebounceConformance
from trio_jobs.testing._conformance_unkept import UnkeptDoneConformance
from trio_jobs.testing.conformance import DriverConformance, ManualClock, Target

from ..refusals import RefusalConformance
from ..task_store import TaskStoreConformance

pytestmark = pytest.mark.postgres


class TestPostgresConformance(
    DriverConformance,
    DebounceConformance,
    ChildrenConformance,
    RefusalConformance,
    TaskStoreConformance,
    UnkeptDoneConformance,
):
    @pytest.fixture
    async def target(self, pg_dsn: str, pg_schema: str) -> AsyncIterator[Target]:
        clock = ManualClock()
        driver = postgres_driver(pg_dsn, schema=pg_schema, clock=clock)
        await driver.open()
        yield Target(driver, clock.advance)
        await driver.close()

    @pytest.fixture
    async def unkept_target(self, pg_dsn: str, pg_schema: str) -> AsyncIterator[Target]:
        clock = ManualClock()
        driver = postgres_driver(pg_dsn, schema=pg_schema, clock=clock, done_retention=0)
        await driver.open()
        yield Target(driver, clock.advance)
        await driver.close()
