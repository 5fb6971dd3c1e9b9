"""The driver's lifetime is open_jobs's: its step writer, acker and LISTEN session
run in the block's nursery (issue 13)."""

from __future__ import annotations

import pytest

from trio_jobs.drivers.postgres import postgres_driver

from ..lifetime_checks import (
    a_failing_service_task_is_logged,
    a_swapped_driver_lives_and_ends_with_the_block,
    fallback_runs_in_a_system_task,
    services_live_under_open_jobs,
)

pytestmark = pytest.mark.postgres


async def test_service_tasks_are_descendants_of_open_jobs(pg_dsn: str, pg_schema: str) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    await services_live_under_open_jobs(driver, "postgres", inner="Combiner.run")


async def test_open_outside_open_jobs_falls_back_to_a_system_task(
    pg_dsn: str, pg_schema: str
) -> None:
    await fallback_runs_in_a_system_task(postgres_driver(pg_dsn, schema=pg_schema), "postgres")


async def test_a_failing_service_task_is_logged_and_the_block_goes_on(
    pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    await a_failing_service_task_is_logged(driver, "postgres", caplog)


async def test_a_swapped_in_driver_lives_and_ends_with_the_block(
    pg_dsn: str, pg_schema: str
) -> None:
    await a_swapped_driver_lives_and_ends_with_the_block(
        postgres_driver(pg_dsn, schema=pg_schema),
        postgres_driver(pg_dsn, schema=pg_schema),
        "postgres",
    )
