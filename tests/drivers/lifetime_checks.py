"""The driver-lifetime checks shared by the PostgreSQL and Redis tests: under
``open_jobs`` the driver's service tasks are descendants of the task that
entered the block; leaving it leaves none; a failing service task is logged."""

from __future__ import annotations

import logging

import pytest
import trio

from task_tree import descendants, driver_tasks, every_task
from trio_jobs import open_jobs, set_job_driver
from trio_jobs.drivers import JobDriver


async def services_live_under_open_jobs(driver: JobDriver, label: str, *, inner: str) -> None:
    """``inner``: a fragment of the name of a task the service always runs."""
    me = trio.lowlevel.current_task()
    async with open_jobs(driver):
        assert driver.wake is not None
        await driver.wake.wait(["default"], 0.05)  # starts the push session
        mine = list(descendants(me))
        services = [t for t in mine if t.name == f"trio_jobs.{label}.service"]
        assert len(services) == 1, [t.name for t in every_task()]
        under = list(descendants(services[0]))
        assert any(inner in t.name for t in under), [t.name for t in under]
        assert any("guarded" in t.name for t in under), [t.name for t in under]  # the session
        # Nothing of the driver's runs outside the block's tree (no system task).
        assert {id(t) for t in driver_tasks(label)} <= {id(t) for t in mine}
    assert driver.closed
    assert driver_tasks(label) == []


async def fallback_runs_in_a_system_task(driver: JobDriver, label: str) -> None:
    """``await driver.open()`` outside open_jobs still works, the service in a system task."""
    me = trio.lowlevel.current_task()
    await driver.open()
    try:
        services = [t for t in every_task() if t.name == f"trio_jobs.{label}.service"]
        assert len(services) == 1
        assert services[0] not in list(descendants(me))
        assert driver.now() > 0
    finally:
        await driver.close()
    assert driver_tasks(label) == []


async def a_failing_service_task_is_logged(
    driver: JobDriver, label: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=f"trio_jobs.{label}")

    async def boom() -> None:
        raise RuntimeError("the service task failed")

    async with open_jobs(driver):
        driver._start_service_task(boom)  # type: ignore[attr-defined]
        await trio.sleep(0.05)
        assert f"jobs.{label}.task_failed" in caplog.text
        # The block and the driver go on.
        assert driver_tasks(label)
        assert await driver.stats() is not None
    assert driver_tasks(label) == []


async def a_swapped_driver_lives_and_ends_with_the_block(
    first: JobDriver, second: JobDriver, label: str
) -> None:
    """``set_job_driver()`` inside the block: the new driver is opened by its first
    use, from another task even, in the block's nursery, and closed with it."""
    me = trio.lowlevel.current_task()
    async with open_jobs(first) as jobs:
        set_job_driver(second)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jobs.stats)  # the first use, in a task of its own
        assert jobs.driver is second
        assert len(driver_tasks(label)) >= 2  # both drivers' services
        assert {id(t) for t in driver_tasks(label)} <= {id(t) for t in descendants(me)}
    assert first.closed
    assert second.closed
    assert driver_tasks(label) == []
