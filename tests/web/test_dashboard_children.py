"""The dashboard's job page shows a job's tree (issue 19): its parent, itself
and its children with their states; names are escaped."""

from __future__ import annotations

from typing import Any

from asgi_client import AsgiClient

from trio_jobs import JobContext, Retry, Worker, job, memory_driver, open_jobs
from trio_jobs.web import create_app


@job(input=int, idempotency_key=lambda n: str(n), name="<b>leaf</b>", retry=Retry(attempts=1))
async def leaf(ctx: JobContext[int]) -> int:
    if ctx.input == 2:
        raise ValueError("no")
    return ctx.input


@job(input=int, idempotency_key=lambda n: str(n), name="tree.root", retry=Retry(attempts=1))
async def root(ctx: JobContext[int]) -> Any:
    return await ctx.step.gather("all", [(leaf, i) for i in range(ctx.input)])


async def test_the_job_page_shows_parent_children_and_their_states() -> None:
    async with open_jobs(memory_driver(), jobs=[root, leaf]) as jobs:
        enq = await root.enqueue(3)
        await Worker(jobs).run_until_quiet()
        view = await jobs.show(enq.id)
        client = AsgiClient(create_app(jobs))
        page = await client.get(f"/{enq.id}")
        assert page.status == 200, page.text
        kid = await client.get(f"/{view.children[0]}")
        assert kid.status == 200, kid.text
    html = page.text
    assert view.state == "dead"  # one child died: X_CHILD_FAILED
    assert "<h2>Tree</h2>" in html
    assert "3 children:" in html
    assert html.count("&lt;b&gt;leaf&lt;/b&gt;") == 3, "each child by name, escaped"
    assert "<b>leaf</b>" not in html
    for child_id in view.children:
        assert f'href="/{child_id}"' in html
    tree = html[html.index("<h2>Tree</h2>") : html.index("<h2>Attempts</h2>")]
    assert tree.count('<span class="badge s-done">done</span>') == 2 + 1  # two, and the count
    assert tree.count('<span class="badge s-dead">dead</span>') == 2 + 1  # root, child, count
    # the child's page names its parent, linked, with its state
    assert "Parent: <a href=" in kid.text
    assert f'href="/{enq.id}">tree.root</a>' in kid.text
    assert "children:" not in kid.text


async def test_a_leaf_page_shows_no_tree() -> None:
    async with open_jobs(memory_driver(), jobs=[root, leaf]) as jobs:
        enq = await leaf.enqueue(1)
        await Worker(jobs).run_until_quiet()
        page = await AsgiClient(create_app(jobs)).get(f"/{enq.id}")
    assert page.status == 200
    assert "<h2>Tree</h2>" not in page.text
