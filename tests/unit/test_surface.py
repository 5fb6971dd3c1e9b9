"""The public surface as PYTHON-API.md pins it (issue 15, "The public surface"):
the default driver at the top level, and bulk calls answering a pair."""

from __future__ import annotations

import sys
from typing import Any

import pytest

import trio_jobs
from trio_jobs import JobContext, job, open_jobs
from trio_jobs.drivers import BulkResult, memory_driver


def test_postgres_driver_is_importable_from_the_top_level() -> None:
    from trio_jobs import postgres_driver
    from trio_jobs.drivers.postgres import PostgresDriver

    driver = postgres_driver("postgresql://app@localhost/app")  # constructing does no I/O
    assert isinstance(driver, PostgresDriver)
    assert "postgres_driver" in trio_jobs.__all__


def test_importing_trio_jobs_does_not_load_psycopg() -> None:
    # postgres_driver is exported at the top level, but psycopg loads on first use:
    # a process on the memory or Redis driver never pays for it.
    import subprocess

    probe = "import sys, trio_jobs; print('psycopg' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_bulk_result_unpacks_as_affected_then_remaining() -> None:
    affected, remaining = BulkResult(affected=3, remaining=7)
    assert (affected, remaining) == (3, 7)
    assert tuple(BulkResult(1, 0)) == (1, 0)


@job(input=int, tenant="none", idempotency_key=lambda i: f"bulk:{i}")
async def bulk_job(ctx: JobContext[int]) -> None:
    pass


@pytest.mark.parametrize(
    ("call", "state", "expected"),
    [("promote_many", "delayed", (4, 0)), ("remove_many", "delayed", (4, 0))],
)
async def test_the_facades_bulk_calls_unpack_as_affected_then_remaining(
    call: str, state: str, expected: tuple[int, int]
) -> None:
    async with open_jobs(memory_driver(), jobs=[bulk_job]) as jobs:
        await bulk_job.enqueue_many(list(range(4)), delay=3600)
        method: Any = getattr(jobs, call)
        affected, remaining = await method(state=state)
        assert (affected, remaining) == expected
        affected, remaining = await jobs.requeue_many(state="done")
        assert (affected, remaining) == (0, 0)
