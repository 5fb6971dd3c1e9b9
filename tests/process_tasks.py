"""A scheduled task for the real-process tests
(tests/drivers/postgres/test_task_processes.py): worker subprocesses serve it
with ``python -m trio_jobs.cli worker process_tasks --database-url DSN``."""

from __future__ import annotations

from trio_jobs import JobContext, Occurrence, task


@task(every="1s", catch_up="all", name="proc.tick")
async def tick(ctx: JobContext[Occurrence]) -> None:
    return None
