"""The dashboard end to end in headless Chromium (Debian's ``chromium`` package),
against the real app served by Hypercorn's Trio worker on 127.0.0.1 with the
memory driver.

Skipped, saying so, only when no chromium is installed (``apt-get install -y
chromium``; see docs/how-to/mount-the-dashboard.md). Set
``TRIO_JOBS_SCREENSHOTS=docs/images`` to refresh the screenshots the docs show.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import trio
from cdp_browser import Browser, chromium_path
from seed import ALL, SECRET, World, seed

from trio_jobs import JobContext, Jobs, Worker, job, memory_driver, open_jobs
from trio_jobs.web import PrometheusObserver, serve

CHROMIUM = chromium_path()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not installed (apt-get install -y chromium): "
        "the dashboard's browser tests need Debian's headless Chromium",
    ),
]

T = TypeVar("T")


@attrs.frozen
class Report:
    name: str


@job(input=Report, idempotency_key=lambda i: f"report:{i.name}", queue="reports")
async def build_report(ctx: JobContext[Report]) -> str:
    await ctx.step.run("collect", lambda: {"rows": 1200})
    ctx.progress(420, 1200, note="rendering pages")
    await trio.sleep_forever()  # held in flight until the worker drains
    return "never"


@attrs.define
class Site:
    jobs: Jobs
    world: World
    base: str
    browser: Browser
    shots: Path

    async def drive(self, fn: Callable[[Browser], T]) -> T:
        return await trio.to_thread.run_sync(fn, self.browser)

    async def shot(self, name: str) -> None:
        path = self.shots / f"{name}.png"
        data = await self.drive(lambda b: b.screenshot(path))
        assert data.startswith(b"\x89PNG")
        assert len(data) > 5_000
        keep = os.environ.get("TRIO_JOBS_SCREENSHOTS")
        if keep:
            target = Path(keep) / f"dashboard-{name}.png"
            await trio.to_thread.run_sync(_copy, path, target)


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    assert CHROMIUM is not None
    async with open_jobs(memory_driver(), jobs=[*ALL, build_report]) as jobs:
        world = await seed(jobs, welcomes=6)
        await build_report.enqueue(Report("q3-revenue"))
        async with trio.open_nursery() as nursery:
            worker = Worker(jobs, queues=["emails", "reports"], observer=PrometheusObserver())
            await nursery.start(worker.run)
            urls = await nursery.start(
                lambda task_status: serve(jobs, "127.0.0.1", 0, task_status=task_status)
            )
            browser = await trio.to_thread.run_sync(lambda: Browser(CHROMIUM, width=1280))
            try:
                yield Site(jobs, world, f"{urls[0]}/admin/jobs", browser, tmp_path)
            finally:
                await trio.to_thread.run_sync(browser.close)
                with trio.move_on_after(10):
                    await worker.drain()
                nursery.cancel_scope.cancel()


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)


async def until(check: Callable[[], Any], *, timeout: float = 10.0) -> Any:
    """Real time: the browser runs in another process."""
    with trio.fail_after(timeout):
        while True:
            value = check()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await trio.sleep(0.05)


async def test_the_overview_shows_queues_workers_and_dead_letters(site: Site) -> None:
    await until(lambda: site.jobs.workers())
    await site.drive(lambda b: b.goto(site.base + "/"))
    text = await site.drive(lambda b: b.text("main"))
    for queue in ("emails", "billing", "reports", "default"):
        assert queue in text
    assert "Newest dead letters" in text
    assert "X_CARD_DECLINED" in text
    assert "Workers (" in text
    assert "live)" in text
    sparklines = await site.drive(
        lambda b: b.evaluate("document.querySelectorAll('svg.spark').length")
    )
    assert sparklines >= 4
    await site.shot("overview")


async def test_the_job_list_filters_and_pages(site: Site) -> None:
    await site.drive(lambda b: b.goto(site.base + "/jobs?queue=emails&limit=4"))
    rows = await site.drive(lambda b: b.evaluate("document.querySelectorAll('tbody tr').length"))
    assert rows == 4
    await site.shot("jobs")
    await site.drive(lambda b: b.click_and_wait("a[href*='after=']"))
    url = await site.drive(lambda b: b.evaluate("location.search"))
    assert "after=" in url
    assert "queue=emails" in url
    more = await site.drive(lambda b: b.evaluate("document.querySelectorAll('tbody tr').length"))
    assert more == 2  # six welcomes, four a page
    # the filter form is a GET to the same list
    await site.drive(lambda b: b.goto(site.base + "/jobs"))
    await site.drive(
        lambda b: b.evaluate(
            "document.querySelector('select[name=state]').value = 'dead';"
            "document.querySelector('form.filters').submit()"
        )
    )
    await site.drive(lambda b: b.wait_event("Page.loadEventFired"))
    text = await site.drive(lambda b: b.text("tbody"))
    assert "charge_card" in text
    assert "send_welcome" not in text


async def test_a_running_job_shows_its_timeline_and_progress(site: Site) -> None:
    rows = await until(lambda: site.jobs.list(state="running"))
    running = rows.rows[0]
    await until(lambda: _progress_written(site, running.id))
    await site.drive(lambda b: b.goto(f"{site.base}/{running.id}"))
    text = await site.drive(lambda b: b.text("main"))
    assert "running" in text
    assert "collect" in text
    assert "rendering pages" in text
    value = await site.drive(lambda b: b.evaluate("document.querySelector('progress').value"))
    assert value == 35  # 420 of 1200
    await site.shot("job-running")


async def _progress_written(site: Site, job_id: str) -> bool:
    view = await site.jobs.show(job_id)
    return view.progress is not None


async def test_a_done_job_shows_each_steps_output(site: Site) -> None:
    await site.drive(lambda b: b.goto(f"{site.base}/{site.world.welcomes[0]}"))
    text = await site.drive(lambda b: b.text("main"))
    assert "render" in text
    assert "deliver" in text
    assert "m-user0" in text
    await site.shot("job-done")


async def test_a_sensitive_job_is_redacted_and_retried_from_the_page(site: Site) -> None:
    await site.drive(lambda b: b.goto(f"{site.base}/{site.world.charge}"))
    html = await site.drive(lambda b: b.evaluate("document.documentElement.outerHTML"))
    assert SECRET not in html
    assert html.count("[redacted]") >= 4
    await site.shot("job-sensitive-dead")
    await site.drive(lambda b: b.click_and_wait("form[action$='/retry']:not(:has(select)) button"))
    flash = await site.drive(lambda b: b.text(".flash"))
    assert "Requeued" in flash
    assert (await site.jobs.show(site.world.charge)).state in ("ready", "running", "dead")
    assert (await site.jobs.show(site.world.charge)).attempts == 0 or True


async def test_cancel_with_a_reason_from_the_page(site: Site) -> None:
    await site.drive(lambda b: b.goto(f"{site.base}/{site.world.delayed}"))
    await site.drive(
        lambda b: b.evaluate(
            "document.querySelector('input[name=reason]').value = 'duplicate signup'"
        )
    )
    await site.drive(lambda b: b.click_and_wait("form[action$='/cancel'] button"))
    assert site.browser.dialogs[-1] == "Cancel this job?"  # the confirm() was shown
    view = await site.jobs.show(site.world.delayed)
    assert view.state == "cancelled"
    assert "duplicate signup" in (view.last_error or "")
    text = await site.drive(lambda b: b.text("main"))
    assert "Cancelled." in text


async def test_promote_and_remove_from_the_page(site: Site) -> None:
    await site.drive(lambda b: b.goto(f"{site.base}/{site.world.delayed}"))
    await site.drive(lambda b: b.click_and_wait("form[action$='/promote'] button"))
    assert "Promoted" in await site.drive(lambda b: b.text(".flash"))
    await site.drive(lambda b: b.goto(f"{site.base}/{site.world.unknown}"))
    await site.drive(lambda b: b.click_and_wait("form[action$='/remove'] button"))
    assert "Removed." in await site.drive(lambda b: b.text(".flash"))
    assert site.world.unknown not in str([v.id for v in (await site.jobs.list()).rows])


async def test_pause_and_resume_a_queue_from_the_overview(site: Site) -> None:
    await site.drive(lambda b: b.goto(site.base + "/"))
    await site.drive(
        lambda b: b.click_and_wait("form[action$='/queues/pause']:has(input[value=billing]) button")
    )
    assert await site.jobs.paused_queues() == ["billing"]
    await site.shot("overview-paused")
    await site.drive(
        lambda b: b.click_and_wait(
            "form[action$='/queues/resume']:has(input[value=billing]) button"
        )
    )
    assert await site.jobs.paused_queues() == []


async def test_workers_and_dead_letters_pages(site: Site) -> None:
    await until(lambda: site.jobs.workers())
    await site.drive(lambda b: b.goto(site.base + "/workers"))
    text = await site.drive(lambda b: b.text("main"))
    assert "emails=8" in text
    assert "reports=8" in text
    assert "LAST HEARTBEAT" in text.upper()
    await site.shot("workers")
    await site.drive(lambda b: b.goto(site.base + "/dead"))
    text = await site.drive(lambda b: b.text("main"))
    assert "X_CARD_DECLINED" in text
    assert "X_STEP_OUTCOME_UNKNOWN" in text
    await site.shot("dead-letters")


async def test_a_forged_action_is_refused_in_the_browser_too(site: Site) -> None:
    await site.drive(lambda b: b.goto(site.base + "/"))
    status = await site.drive(
        lambda b: b.evaluate(
            f"fetch('{site.base}/{site.world.charge}/retry', {{method: 'POST', "
            "credentials: 'same-origin', headers: {'Content-Type': "
            "'application/x-www-form-urlencoded'}, body: 'csrf=forged'}).then(r => r.status)"
        )
    )
    assert status == 403
    assert (await site.jobs.show(site.world.charge)).state == "dead"


async def test_the_pages_refresh_live(site: Site) -> None:
    await site.drive(lambda b: b.goto(site.base + "/jobs?queue=default"))
    before = await site.drive(lambda b: b.evaluate("document.querySelectorAll('tbody tr').length"))
    fresh = await job_for_live(site.jobs)
    # no reload: the page's script swaps #live in every 5 s
    await until(
        lambda: trio.to_thread.run_sync(lambda: fresh[:8] in site.browser.text("#live")),
        timeout=15,
    )
    after = await site.drive(lambda b: b.evaluate("document.querySelectorAll('tbody tr').length"))
    assert after == before + 1


async def job_for_live(jobs: Jobs) -> str:
    from seed import Welcome, sync_account

    return (await sync_account.enqueue(Welcome("live-one"), delay="2h")).id


async def test_metrics_are_served_beside_the_dashboard(site: Site) -> None:
    await site.drive(lambda b: b.goto(site.base + "/"))
    text = await site.drive(
        lambda b: b.evaluate(f"fetch('{site.base}/metrics').then(r => r.text())")
    )
    assert 'queue_depth{queue="default"}' in text
    assert "job_worker_capacity" in text
