"""``trio-jobs dev``: the zero-setup path.

The embedded PostgreSQL under ``./.trio-jobs/`` (or ``--database-url`` /
``$DATABASE_URL``), migrations, a worker, and the example app
(:mod:`trio_jobs.examples.onboarding`) run to completion: its runs are
enqueued in one transaction (commit is the enqueue), the worker runs them
(the welcome mail fails once and retries; ``provision`` replays from storage;
a durable ``step.sleep`` hands the slot back), and the result table is printed.
``--serve`` keeps the worker running afterwards, with the dashboard on
``http://127.0.0.1:8765/admin/jobs/`` (``--port``), until Ctrl-C (or SIGTERM),
which drains it.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import trio

from .._time import UuidSource
from ..errors import ErrorCode, JobsError
from ._common import log_event, resolve_database

__all__ = ["run_example"]

#: How long the example may take before ``dev`` gives up on it.
EXAMPLE_TIMEOUT = 60.0
_TERMINAL = ("done", "dead", "failed", "cancelled")


async def run_example(
    orgs: int, serve: bool, database_url: str | None, port: int = 8765
) -> dict[str, Any]:
    from .. import Worker, open_jobs
    from ..drivers.postgres import postgres_driver
    from ..examples import onboarding

    if orgs < 1:
        raise JobsError(ErrorCode.X_CONFIG_INVALID, "--orgs must be 1 or more")
    ids_source = UuidSource()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        db = await resolve_database(database_url, redis=False)
        log_event(logging.INFO, "jobs.dev.database", database=db.source)
        async with open_jobs(postgres_driver(db.dsn), jobs=onboarding.jobs) as jobs:
            async with jobs.transaction():
                # One transaction: the runs exist once it commits, not before.
                staged = await onboarding.onboard_org.enqueue_many(
                    [
                        onboarding.Onboard(org_id=org, email=f"owner@{org.hex[:8]}.example")
                        for org in (_uuid(ids_source.new_id()) for _ in range(orgs))
                    ]
                )
            ids = [e.id for e in staged]
            worker = Worker(jobs, concurrency=8, poll_interval="100ms", idle_poll_max="1s")
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)

                async def interrupt() -> None:
                    async for _signum in signals:
                        stop.set()
                        return

                nursery.start_soon(interrupt)
                with trio.move_on_after(EXAMPLE_TIMEOUT):
                    async with trio.open_nursery() as race:

                        async def settled() -> None:
                            await _settled(jobs, ids)
                            race.cancel_scope.cancel()

                        async def stopped() -> None:
                            await stop.wait()
                            race.cancel_scope.cancel()

                        race.start_soon(settled)
                        race.start_soon(stopped)
                rows = [_row(await jobs.show(i)) for i in ids]
                if serve and not stop.is_set():
                    from ..web import serve as serve_dashboard

                    urls = await nursery.start(
                        lambda task_status: serve_dashboard(
                            jobs, "127.0.0.1", port, task_status=task_status
                        )
                    )
                    log_event(
                        logging.WARNING,
                        "jobs.dev.serving",
                        note="the worker keeps running and the dashboard is up; Ctrl-C drains and exits",
                        worker_id=worker.id,
                        dashboard=[u + "/admin/jobs/" for u in urls],
                    )
                    _print_rows(rows)
                    await stop.wait()
                await worker.drain()
                nursery.cancel_scope.cancel()
    return {
        "rows": rows,
        "effects": dict(onboarding.effects),
        "database": db.source,
        "interrupted": stop.is_set(),
    }


async def _settled(jobs: Any, ids: list[str]) -> None:
    """Until every run ended. A poll of the rows: the runs may settle in any
    worker, this process's or another's."""
    while True:
        if all(v.state in _TERMINAL for v in [await jobs.show(i) for i in ids]):
            return
        await trio.sleep(0.1)


def _uuid(value: str) -> Any:
    import uuid

    return uuid.UUID(value)


def _row(view: Any) -> dict[str, Any]:
    return {
        "id": view.id,
        "state": view.state,
        "attempts": view.attempts,
        "steps": ", ".join(f"{s.name}({s.executions})" for s in view.steps),
        "result": view.result,
    }


def _print_rows(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="trio-jobs dev: examples.onboard_org")
    for col in ("job", "state", "attempts", "steps (executions)"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["id"][:8], row["state"], str(row["attempts"]), row["steps"])
    Console().print(table)
