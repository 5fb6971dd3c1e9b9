"""The conformance suite on the memory driver, the facade's refusals and the
worker's ack pipeline on it."""

from collections.abc import AsyncIterator

import pytest

from trio_jobs.drivers import JobDriver, memory_driver
from trio_jobs.testing._conformance_children import ChildrenConformance
from trio_jobs.testing._conformance_debounce import DebounceConformance
from trio_jobs.testing._conformance_unkept import UnkeptDoneConformance
from trio_jobs.testing.conformance import DriverConformance, ManualClock, Target

from ..ack_pipeline import AckPipelineConformance
from ..refusals import RefusalConformance
from ..task_store import TaskStoreConformance


class TestMemoryConformance(
    DriverConformance,
    DebounceConformance,
    ChildrenConformance,
    RefusalConformance,
    TaskStoreConformance,
    UnkeptDoneConformance,
):
    @pytest.fixture
    async def target(self) -> AsyncIterator[Target]:
        clock = ManualClock()
        driver = memory_driver(clock=clock)
        await driver.open()
        yield Target(driver, clock.advance)
        await driver.close()

    @pytest.fixture
    async def unkept_target(self) -> AsyncIterator[Target]:
        clock = ManualClock()
        driver = memory_driver(clock=clock, done_retention=0)
        await driver.open()
        yield Target(driver, clock.advance)
        await driver.close()


class TestMemoryAckPipeline(AckPipelineConformance):
    @pytest.fixture
    def fresh(self) -> JobDriver:
        return memory_driver()
