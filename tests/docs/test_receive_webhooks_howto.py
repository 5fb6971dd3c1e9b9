"""docs/how-to/receive-webhooks.md on PostgreSQL, over real HTTP: the page's
``run_site`` serves its receiver with Hypercorn, a signed event is acknowledged,
a worker runs ``record_payment`` into a real ``payments`` table, a redelivery
after the run settled runs it again and changes nothing, and ``trio-jobs list
--json`` prints what the page shows (ids and times aside). The page's own
``test_*`` functions (memory driver) run in test_tutorials.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import psycopg
import pytest
import trio
from click.testing import CliRunner

from pg_schemas import throwaway_schema

from ._pages import load_page, output_after

PAGE = "docs/how-to/receive-webhooks.md"


def _cli(*args: str) -> Any:
    from trio_jobs.cli import main

    return CliRunner().invoke(main, list(args))


async def _deliver_and_run(page: Any, dsn: str) -> tuple[list[tuple[int, dict[str, Any]]], Any]:
    from trio_jobs import Worker, open_jobs, postgres_driver

    body = json.dumps(
        {"id": "evt_1", "type": "invoice.paid", "invoice": "in_9", "amount": 900}
    ).encode()
    answers: list[tuple[int, dict[str, Any]]] = []
    async with (
        open_jobs(postgres_driver(dsn), jobs=[page.billing_events]) as jobs,
        trio.open_nursery() as nursery,
    ):
        [base] = await nursery.start(page.run_site, dsn, 0)
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:

            async def deliver() -> None:
                got = await http.post(
                    "/hooks/billing/acme", content=body, headers=page.signed(body)
                )
                answers.append((got.status_code, got.json()))

            async def run_until_done() -> None:
                worker = Worker(jobs, poll_interval="50ms")
                async with trio.open_nursery() as inner:
                    await inner.start(worker.run)
                    with trio.fail_after(30):
                        while any(  # noqa: ASYNC110 - a bounded wait on the queue
                            r.state != "done" for r in (await jobs.list(name="billing.events")).rows
                        ):
                            await trio.sleep(0.05)
                    await worker.drain()

            await deliver()
            await deliver()  # live: deduped
            await run_until_done()
            listed = await trio.to_thread.run_sync(
                _cli, "list", "--name", "billing.events", "--json", "--database-url", dsn
            )
            await deliver()  # settled: a new run, which changes nothing
            await run_until_done()
        nursery.cancel_scope.cancel()
    return answers, listed


@pytest.mark.postgres
def test_the_pages_receiver_acknowledges_runs_once_per_effect_and_the_cli_redacts() -> None:
    page = load_page(PAGE)
    with throwaway_schema("tj_hookdoc") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE payments (event_id text PRIMARY KEY, account text NOT NULL, "
                "invoice text NOT NULL, cents int NOT NULL)"
            )
        answers, out = trio.run(_deliver_and_run, page, dsn)
        assert answers == [
            (200, {"ok": True, "event_id": "evt_1", "deduped": False}),
            (200, {"ok": True, "event_id": "evt_1", "deduped": True}),
            (200, {"ok": True, "event_id": "evt_1", "deduped": False}),
        ]
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT event_id, account, invoice, cents FROM payments").fetchall()
        assert rows == [("evt_1", "acme", "in_9", 900)]

        assert out.exit_code == 0, out.output
        shown = output_after(PAGE, ".venv/bin/trio-jobs list --name billing.events --json")
        assert shown is not None
        got, want = orjson.loads(out.output), orjson.loads(shown.source)
        job_id = got["rows"][0]["id"]
        for row in [*got["rows"], *want["rows"]]:
            for varies in ("id", "run_id", "created_at", "run_at", "updated_at"):
                row.pop(varies)
        assert got == want
        show = _cli("show", job_id, "--database-url", dsn)
        assert show.exit_code == 0, show.output
        assert "[redacted]" in show.output
        assert "in_9" not in show.output
        assert "evt_1" not in show.output
