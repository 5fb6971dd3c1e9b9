"""open_jobs owns its driver's lifetime (issue 13): the driver is entered with
``open_in(nursery)`` in the block's nursery, and the block's own exceptions and
cancellations pass through that nursery as they are."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from task_tree import descendants, driver_tasks
from trio_jobs import open_jobs
from trio_jobs.drivers._service import ServiceTasks
from trio_jobs.drivers.memory import MemoryDriver, memory_driver


class ServicedDriver(MemoryDriver):
    """A memory driver with a service task, the way the PostgreSQL and Redis drivers run theirs."""

    def __init__(self, *tasks: Callable[[], Awaitable[None]], hang_on_close: bool = False) -> None:
        super().__init__()
        self.service = ServiceTasks("serviced", logging.getLogger("trio_jobs.serviced"))
        self._tasks = tasks
        self._hang_on_close = hang_on_close
        self.entered_in: trio.Nursery | None = None

    @asynccontextmanager
    async def open_in(self, nursery: trio.Nursery) -> AsyncIterator[None]:
        self.entered_in = nursery
        await self.open()
        await self.service.start(*self._tasks, nursery=nursery)
        try:
            yield
        finally:
            await self.service.stop()
            if self._hang_on_close:
                await trio.sleep_forever()
            await self.close()


async def test_open_jobs_enters_the_driver_in_its_own_nursery() -> None:
    me = trio.lowlevel.current_task()
    driver = ServicedDriver(trio.sleep_forever)
    async with open_jobs(driver):
        assert driver.entered_in is not None
        assert driver.entered_in.parent_task is me
        assert {id(t) for t in driver_tasks("serviced")} <= {id(t) for t in descendants(me)}
        assert len(driver_tasks("serviced")) == 2  # the service and its task
    assert driver.closed
    assert driver_tasks("serviced") == []


async def test_the_blocks_exception_is_not_wrapped_in_a_group() -> None:
    with pytest.raises(KeyError, match="mine"):
        async with open_jobs(ServicedDriver(trio.sleep_forever)):
            raise KeyError("mine")


async def test_an_opening_failure_raises_as_it_is() -> None:
    class Refusing(MemoryDriver):
        @asynccontextmanager
        async def open_in(self, nursery: trio.Nursery) -> AsyncIterator[None]:
            raise ValueError("no server")
            yield

    with pytest.raises(ValueError, match="no server"):
        async with open_jobs(Refusing()):
            pytest.fail("the block ran without its driver")


async def test_cancelling_around_the_block_still_closes_the_driver(autojump_clock: Any) -> None:
    driver = ServicedDriver(trio.sleep_forever)
    with trio.move_on_after(1) as scope:
        async with open_jobs(driver):
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert driver.closed
    assert driver_tasks("serviced") == []


async def test_a_hanging_close_is_bounded(autojump_clock: Any) -> None:
    driver = ServicedDriver(trio.sleep_forever, hang_on_close=True)
    started = trio.current_time()
    async with open_jobs(driver):
        pass
    assert 10 <= trio.current_time() - started < 11
    assert driver_tasks("serviced") == []


async def test_a_failing_close_raises_from_the_block() -> None:
    class FailingClose(MemoryDriver):
        async def close(self) -> None:
            await super().close()
            raise OSError("the pool would not close")

    with pytest.raises(OSError, match="would not close"):
        async with open_jobs(FailingClose()):
            pass


async def test_a_failing_service_is_logged_and_never_reaches_the_nursery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs.serviced")

    async def boom() -> None:
        await trio.lowlevel.checkpoint()
        raise RuntimeError("a task outside spawn() failed")

    service = ServiceTasks("serviced", logging.getLogger("trio_jobs.serviced"))
    async with trio.open_nursery() as nursery:
        assert await service.start(boom, nursery=nursery)
        await trio.sleep(0.01)
        assert "jobs.serviced.service_failed" in caplog.text
        assert not service.running
        await service.stop()


async def test_memory_driver_open_in_opens_and_closes() -> None:
    driver = memory_driver()
    async with trio.open_nursery() as nursery, driver.open_in(nursery):
        assert not driver.closed
        await driver.stats()
    assert driver.closed
