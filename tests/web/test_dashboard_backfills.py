"""The dashboard's backfills page: the ledger (``jobs.backfills()``), one row per
pass, a pass in flight with its next cursor, values escaped."""

from __future__ import annotations

from typing import Any

import trio
from asgi_client import AsgiClient

from jobs_support import running_worker, wait_for, wait_state
from trio_jobs import backfill, memory_driver, open_jobs
from trio_jobs.web import create_app

gate = trio.Event()


def pages(_input: None, cursor: Any) -> tuple[list[int], Any]:
    after = cursor["after"] if cursor else 0
    return [after + 1, after + 2], ({"after": after + 2, "note": "<b>x</b>"} if after < 4 else None)


async def handle(ids: list[int], _input: None) -> None:
    if ids[0] == 5:
        await gate.wait()


shown = backfill(name="<i>copy</i>", idempotency_key=lambda _: "copy", source=pages, handle=handle)


async def test_the_backfills_page_lists_each_pass_with_its_progress(autojump_clock: Any) -> None:
    async with open_jobs(memory_driver(), jobs=[shown]) as jobs:
        client = AsgiClient(create_app(jobs))
        assert "No backfill pass yet." in (await client.get("/backfills")).text
        async with running_worker(jobs):
            enqueued = await shown.enqueue(None)
            await wait_for(lambda: _pages_done(jobs, 2), what="two pages handled", timeout=10)
            running = await client.get("/backfills")
            gate.set()
            await wait_state(jobs, enqueued.id, "done", timeout=10)
        done = (await client.get("/backfills")).text
        overview = (await client.get("/")).text
    assert running.status == 200
    html = running.text
    assert f'<a class="mono" href="/{enqueued.id}">{enqueued.id[:8]}</a>' in html
    assert "&lt;i&gt;copy&lt;/i&gt;" in html  # the name, escaped
    assert "<i>copy</i>" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html  # the next cursor, escaped
    assert "not finished" in html
    assert '<td class="num">2</td><td class="num">4</td>' in html
    assert '<td class="num">3</td><td class="num">6</td>' in done
    assert "not finished" not in done
    assert '<a href="/backfills" class="">Backfills</a>' in overview  # in the navigation


async def _pages_done(jobs: Any, n: int) -> bool:
    rows = await jobs.backfills()
    return bool(rows) and rows[0].pages == n
