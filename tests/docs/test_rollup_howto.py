"""docs/how-to/rollups-and-views.md on PostgreSQL: the page's tables (its sql
block), its rollup of daily signups per org and its concurrent view refresh, run
by a worker; the result the page shows; the scheduling tasks enqueue each."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from pg_schemas import throwaway_schema
from rollup_support import Frozen, run_at, sql
from trio_jobs import Occurrence, Worker, open_jobs, postgres_driver

from ._pages import blocks, load_page

PAGE = "docs/how-to/rollups-and-views.md"
PARIS = ZoneInfo("Europe/Paris")


@pytest.fixture
def dsn() -> Iterator[str]:
    with throwaway_schema("tj_docs") as found:
        [tables] = [b for b in blocks(PAGE) if b.language == "sql"]
        sql(found, tables.source)
        yield found


def paris(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=PARIS)  # type: ignore[misc]


@pytest.mark.postgres
async def test_the_pages_rollup_and_refresh_run_as_the_page_says(dsn: str) -> None:
    page = load_page(PAGE)
    for org, kind, at in [
        ("acme", "signup", paris(2026, 3, 28, 23, 59)),  # older than the first bucket
        ("acme", "signup", paris(2026, 3, 29, 0, 30)),
        ("acme", "signup", paris(2026, 3, 29, 3, 30)),  # after the change, same day
        ("acme", "login", paris(2026, 3, 29, 9)),
        ("acme", "signup", paris(2026, 3, 30, 9)),
        ("globex", "signup", paris(2026, 3, 31, 9)),
    ]:
        sql(dsn, "INSERT INTO events (org_id, kind, at) VALUES (%s, %s, %s)", (org, kind, at))

    # "with lookback="2d" at 2026-03-31 12:00 in Paris, that is 2026-03-29 00:00 +01:00"
    assert page.PARIS_DAY.start(paris(2026, 3, 29, 12)) == paris(2026, 3, 29)
    view = await run_at(dsn, page.daily_signups, paris(2026, 3, 31, 12))
    assert view.state == "done", view.last_error
    assert view.result == {"since": "2026-03-29T00:00:00+01:00", "rows": 3}
    assert sql(dsn, "SELECT org_id, day, signups FROM daily_signups ORDER BY 1, 2") == [
        ("acme", paris(2026, 3, 29), 2),
        ("acme", paris(2026, 3, 30), 1),
        ("globex", paris(2026, 3, 31), 1),
    ]

    refreshed = await run_at(dsn, page.refresh_org_totals, paris(2026, 3, 31, 12))
    assert refreshed.state == "done", refreshed.last_error
    assert refreshed.result == {"view": "org_totals", "concurrently": True}
    assert sql(dsn, "SELECT org_id, signups FROM org_totals ORDER BY 1") == [
        ("acme", 3),
        ("globex", 1),
    ]
    assert page.daily_signups.idempotency_key_for(None) == "signups.daily:null"


@pytest.mark.postgres
async def test_the_pages_tasks_enqueue_the_rollup_and_the_refresh(dsn: str) -> None:
    page = load_page(PAGE)
    now = paris(2026, 3, 31, 12)
    async with open_jobs(postgres_driver(dsn, clock=Frozen(now)), jobs=page.JOBS) as jobs:
        at = Occurrence(now)
        for handle in (page.roll_up_signups, page.refresh_totals):
            await handle.enqueue(at)
        await Worker(jobs, queues=["default"], fleet="single").run_until_quiet()
        listed = await jobs.list(limit=10)
    assert sorted((row.name, row.state) for row in listed.rows) == [
        ("org-totals.refresh", "done"),
        ("org-totals.schedule", "done"),
        ("signups.daily", "done"),
        ("signups.daily.schedule", "done"),
    ]
