"""``trio-jobs``: the developer's and the operator's entry point."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import click
import trio
from rich.console import Console
from rich.table import Table

from ..errors import JobsError

console = Console()


@click.group()
@click.version_option(package_name="trio-jobs")
def main() -> None:
    """Durable background jobs and workflows on Trio."""


@main.command()
@click.option("--orgs", default=3, show_default=True, help="How many example runs to enqueue.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def dev(orgs: int, as_json: bool) -> None:
    """Run the example app (an onboarding workflow) with a worker, to completion.

    Uses the memory driver for now; the PostgreSQL driver's issue switches this
    to an embedded PostgreSQL with the dashboard.
    """
    try:
        rows = trio.run(_dev, orgs)
    except JobsError as exc:
        console.print(f"[red]{exc.code}[/red] {exc.message}")
        sys.exit(1)
    if as_json:
        import orjson

        click.echo(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        return
    table = Table(title="trio-jobs dev: examples.onboard_org")
    for col in ("job", "state", "attempts", "steps (executions)"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["id"][:8], row["state"], str(row["attempts"]), row["steps"])
    console.print(table)
    from ..examples import onboarding

    console.print(f"effects: {onboarding.effects}")


async def _dev(orgs: int) -> list[dict[str, Any]]:
    from .. import Worker, memory_driver, open_jobs
    from ..examples import onboarding

    async with open_jobs(memory_driver(), jobs=onboarding.jobs) as jobs:
        ids = []
        for _ in range(orgs):
            org = uuid.uuid4()
            enq = await onboarding.onboard_org.enqueue(
                onboarding.Onboard(org_id=org, email=f"owner@{org.hex[:8]}.example")
            )
            ids.append(enq.id)
        worker = Worker(jobs, poll_interval="50ms", idle_poll_max="200ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.move_on_after(30):
                while True:
                    views = [await jobs.show(i) for i in ids]
                    if all(v.state in ("done", "dead", "failed") for v in views):
                        break
                    await trio.sleep(0.05)
            await worker.drain()
        out = []
        for i in ids:
            v = await jobs.show(i)
            steps = ", ".join(f"{s.name}({s.executions})" for s in v.steps)
            out.append({"id": v.id, "state": v.state, "attempts": v.attempts, "steps": steps, "result": v.result})
        return out
