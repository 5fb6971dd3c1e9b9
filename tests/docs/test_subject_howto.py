"""docs/how-to/erase-one-persons-data.md on PostgreSQL: the page's subject erases
and exports a real member (tenants kept apart by the composite key), and its
proof passes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from pg_schemas import throwaway_schema

from ._pages import load_page

PAGE = "docs/how-to/erase-one-persons-data.md"

SEED = """
INSERT INTO members VALUES (1, 7, 'a@x', 'Ann'), (2, 7, 'c@x', 'Cat');
INSERT INTO posts VALUES (1, 10, 7, 'hello'), (2, 10, 7, 'other org');
INSERT INTO comments (org_id, author_id, body) VALUES (1, 7, 'mine'), (2, 7, 'theirs');
INSERT INTO audit_copies (org_id, member_id, who) VALUES (1, 7, 'Ann'), (2, 7, 'Cat')
"""


async def _run(page: Any, dsn: str) -> tuple[Any, Any, dict[str, Any]]:
    from trio_jobs import Worker, open_jobs, postgres_driver

    async with open_jobs(
        postgres_driver(dsn), jobs=[page.erase_member, page.export_member]
    ) as jobs:
        async with jobs.transaction() as tx:
            for statement in (page.TABLES + ";" + SEED).split(";"):
                if statement.strip():
                    await tx.execute(statement)
        await page.prove(jobs)
        views = []
        worker = Worker(jobs, poll_interval="20ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            for handle in (page.export_member, page.erase_member):
                enq = await handle.enqueue(page.Member(org_id=1, member_id=7))
                with trio.fail_after(30):
                    while (view := await jobs.show(enq.id)).state not in ("done", "dead"):  # noqa: ASYNC110
                        await trio.sleep(0.02)
                views.append(view)
            await worker.drain()
        async with jobs.transaction() as tx:
            rows = {
                t: await tx.execute(f"SELECT * FROM {t} ORDER BY 1, 2")
                for t in ("members", "posts", "comments", "audit_copies")
            }
    return views[0], views[1], rows


@pytest.mark.postgres
def test_the_pages_subject_exports_then_erases_one_member() -> None:
    import obstore

    page = load_page(PAGE)
    with throwaway_schema("tj_docs") as dsn:
        exported, erased, rows = trio.run(_run, page, dsn)
    assert exported.state == "done", exported.last_error
    assert erased.state == "done", erased.last_error
    index = json.loads(bytes(obstore.get(page.exports, "org/1/subjects/7/index.json").bytes()))
    assert {t["table"]: t["rows"] for t in index["tables"]} == {
        "members": 1,
        "posts": 1,
        "comments": 1,
        "audit_copies": 1,
    }
    assert rows["members"] == [(1, 7, "erased@example.invalid", None), (2, 7, "c@x", "Cat")]
    assert rows["posts"] == [(1, 10, 7, "hello"), (2, 10, 7, "other org")]  # retained
    assert [r[3] for r in rows["comments"]] == ["theirs"]
    assert [r[3] for r in rows["audit_copies"]] == ["Cat"]
