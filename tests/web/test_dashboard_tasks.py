"""The dashboard's tasks page (spec: "Scheduled tasks — task()"): each task's
schedule, zone, paused flag, last and next fire, and a pause button that
pauses it fleet-wide through the facade (CSRF checked, as every action)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from asgi_client import AsgiClient

from trio_jobs import JobContext, Occurrence, memory_driver, open_jobs, task
from trio_jobs._scheduler import fire_due
from trio_jobs._time import TrioClock
from trio_jobs.web import create_app

NOON = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC).timestamp()


@task(cron="0 * * * *", tz="Europe/Paris", name="hourly.<b>report</b>")
async def hourly(ctx: JobContext[Occurrence]) -> None:
    return None


async def test_the_tasks_page_shows_each_task_and_pauses_it(autojump_clock: Any) -> None:
    driver = memory_driver(clock=TrioClock(NOON - 3600))
    async with open_jobs(driver, jobs=[hourly]) as jobs:
        await fire_due(jobs, [hourly], "dash")  # armed an hour ago
        autojump_clock.jump(3600)
        assert await fire_due(jobs, [hourly], "dash") == 1  # 12:00 UTC fired
        client = AsgiClient(create_app(jobs))
        reply = await client.get("/tasks")
        assert reply.status == 200, reply.text
        html = reply.text
        assert "hourly.&lt;b&gt;report&lt;/b&gt;" in html, "the name is escaped"
        assert "<b>report</b>" not in html
        assert "<code>0 * * * *</code>" in html
        assert "Europe/Paris" in html
        assert "2026-06-01 14:00:00 CEST" in html, "the last fire, in the task's zone"
        assert "2026-06-01 15:00:00 CEST" in html, "the next fire"
        assert 'href="/tasks"' in html
        token = reply.csrf()
        refused = await client.post("/tasks/pause", {"task": hourly.name})
        assert refused.status == 403, "no CSRF token: refused"
        assert not (await jobs.tasks())[0].paused
        done = await client.post("/tasks/pause", {"csrf": token, "task": hourly.name})
        assert done.location == "/tasks?ok=task_paused"
        [view] = await jobs.tasks()
        assert view.paused
        page = (await client.get("/tasks")).text
        assert "s-paused" in page
        assert "Resume" in page
        again = await client.post("/tasks/resume", {"csrf": token, "task": hourly.name})
        assert again.location == "/tasks?ok=task_resumed"
        assert not (await jobs.tasks())[0].paused
        unknown = await client.post("/tasks/pause", {"csrf": token, "task": "nope"})
        assert unknown.location == "/tasks?refused=X_TASK_NOT_FOUND"
