"""The dashboard's consumers page (spec: "Consumers — consumer()"; the issue's
dashboard line): each key of each consumer by its newest run, with its state,
its last batch and its lag; keys are escaped."""

from __future__ import annotations

from typing import Any

from asgi_client import AsgiClient

from trio_jobs import ConsumerBatch, Worker, consumer, memory_driver, open_jobs
from trio_jobs.web import create_app

STREAM = {"acct-1": [1, 2, 3], "<i>acct-2</i>": [4], "acct-3": []}
CURSORS: dict[str, str] = {}


async def items(key: str, cursor: str | None, signal: Any) -> Any:
    for n in STREAM[key]:
        if cursor is None or n > int(cursor):
            yield n


def handle(batch: ConsumerBatch) -> str:
    return str(batch.items[-1])


feed = consumer(
    name="feed",
    keys=lambda: sorted(STREAM),
    open=items,
    handle=handle,
    load_cursor=lambda key, tx: CURSORS.get(key),
    save_cursor=lambda key, cursor, tx: CURSORS.__setitem__(key, cursor),
    lag=lambda key, cursor: 7 if key == "acct-1" else 0,
)


async def test_the_consumers_page_lists_each_key_by_its_newest_run(autojump_clock: Any) -> None:
    async with open_jobs(memory_driver(), jobs=[feed]) as jobs:
        client = AsgiClient(create_app(jobs))
        empty = await client.get("/consumers")
        assert empty.status == 200, empty.text
        assert "No consumer run yet" in empty.text
        first = await feed.arm()
        await Worker(jobs).run_until_quiet()
        autojump_clock.jump(60)
        again = await feed.arm()  # a second run of each key: the page shows the newest
        await Worker(jobs).run_until_quiet()
        reply = await client.get("/consumers")
        assert reply.status == 200, reply.text
        html = reply.text
    assert 'href="/consumers"' in html
    assert "&lt;i&gt;acct-2&lt;/i&gt;" in html, "the key is escaped"
    assert "<i>acct-2</i>" not in html
    for e in again:
        assert e.id[:8] in html
    for e in first:
        assert e.id[:8] not in html
    assert html.count('<span class="badge s-done">done</span>') == 3
    # the newest runs found nothing new: the last batch and lag are the first runs'
    assert '<td class="num">7</td>' in html, "acct-1's lag"
    assert "none yet" in html, "acct-3 never committed a batch"
    assert html.count("ago") >= 1
