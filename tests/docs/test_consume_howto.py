"""docs/how-to/consume-a-stream.md on PostgreSQL: the page's consumer mirrors a
real ``events`` table with a worker, one run per account, each batch's rows and
cursor committed together in the app's tables; ``jobs.show(id).consumer`` and
``trio-jobs show --json`` report the key, the last batch and the lag; a second
arm after new events starts each key at its cursor. The page's own ``test_*``
function (memory) runs in test_tutorials.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest
import trio
from click.testing import CliRunner

from pg_schemas import throwaway_schema

from ._pages import blocks, load_page

PAGE = "docs/how-to/consume-a-stream.md"


@pytest.fixture
def schema_dsn() -> Iterator[str]:
    with throwaway_schema("tj_docs") as dsn:
        yield dsn


def _sql(dsn: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def _add_events(dsn: str, per_account: dict[str, int]) -> None:
    for account, n in per_account.items():
        _sql(
            dsn,
            "INSERT INTO events (account, body) SELECT %s, 'event ' || g FROM generate_series(1, %s) g",
            (account, n),
        )


async def _arm_and_run(page: Any, dsn: str) -> list[Any]:
    from trio_jobs import Worker, open_jobs, postgres_driver

    async with open_jobs(postgres_driver(dsn), jobs=[page.mirror_events]) as jobs:
        ids = await page.start_now(dsn)
        worker = Worker(jobs, queues=["default"], poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(60):
                while [(await jobs.show(i)).state for i in ids] != ["done"] * len(ids):  # noqa: ASYNC110 — bounded wait on the queue
                    await trio.sleep(0.05)
            await worker.drain()
        return [await jobs.show(i) for i in ids]


@pytest.mark.postgres
def test_the_pages_consumer_mirrors_a_real_table_one_run_per_account(schema_dsn: str) -> None:
    from trio_jobs.cli import main

    [tables] = [b for b in blocks(PAGE) if b.language == "sql"]
    for statement in tables.source.split(";"):
        if statement.strip():
            _sql(schema_dsn, statement)
    _add_events(schema_dsn, {"acct-1": 1200, "acct-2": 30})
    page = load_page(PAGE)

    views = trio.run(_arm_and_run, page, schema_dsn)
    assert sorted(v.payload for v in views) == ["acct-1", "acct-2"]
    assert _sql(schema_dsn, "SELECT account, count(*) FROM mirrored GROUP BY 1 ORDER BY 1") == [
        ("acct-1", 1200),
        ("acct-2", 30),
    ]
    last = dict(_sql(schema_dsn, "SELECT account, max(id)::text FROM events GROUP BY 1"))
    assert dict(_sql(schema_dsn, "SELECT key, cursor FROM stream_cursors")) == last
    by_key = {v.payload: v for v in views}
    one = by_key["acct-1"]
    assert one.result == {"batches": 12, "items": 1200}
    assert [s.name for s in one.steps] == ["batch"]
    assert one.steps[0].executions == 12
    assert one.consumer is not None
    assert one.consumer["key"] == "acct-1"
    assert one.consumer["lag"] == 0
    assert one.consumer["last_batch_at"] == one.steps[0].ended_at

    out = CliRunner().invoke(main, ["show", one.id, "--json", "--database-url", schema_dsn])
    assert out.exit_code == 0, out.output
    got = orjson.loads(out.output)["consumer"]
    assert got == {"key": "acct-1", "last_batch_at": one.consumer["last_batch_at"], "lag": 0.0}
    [example] = [b for b in blocks(PAGE) if b.language == "json"]
    assert set(orjson.loads(example.source)["consumer"]) == set(got)

    # new events: the next arm starts each key at its committed cursor
    _add_events(schema_dsn, {"acct-1": 5, "acct-3": 2})
    again = trio.run(_arm_and_run, page, schema_dsn)
    assert sorted(v.result["items"] for v in again) == [0, 2, 5]
    assert _sql(schema_dsn, "SELECT count(*) FROM mirrored") == [(1237,)]
