"""The driver's lifetime is open_jobs's: its connection pool and pub/sub session
run in the block's nursery (issue 13)."""

from __future__ import annotations

import pytest

from trio_jobs.drivers.redis import redis_driver

from ..lifetime_checks import (
    a_failing_service_task_is_logged,
    a_swapped_driver_lives_and_ends_with_the_block,
    fallback_runs_in_a_system_task,
    services_live_under_open_jobs,
)


async def test_service_tasks_are_descendants_of_open_jobs(
    redis_url: str, redis_prefix: str
) -> None:
    driver = redis_driver(redis_url, prefix=redis_prefix)
    await services_live_under_open_jobs(driver, "redis", inner="guarded")


async def test_open_outside_open_jobs_falls_back_to_a_system_task(
    redis_url: str, redis_prefix: str
) -> None:
    await fallback_runs_in_a_system_task(redis_driver(redis_url, prefix=redis_prefix), "redis")


async def test_a_failing_service_task_is_logged_and_the_block_goes_on(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = redis_driver(redis_url, prefix=redis_prefix)
    await a_failing_service_task_is_logged(driver, "redis", caplog)


async def test_a_swapped_in_driver_lives_and_ends_with_the_block(
    redis_url: str, redis_prefix: str
) -> None:
    await a_swapped_driver_lives_and_ends_with_the_block(
        redis_driver(redis_url, prefix=redis_prefix),
        redis_driver(redis_url, prefix=redis_prefix),
        "redis",
    )
