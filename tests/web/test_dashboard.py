"""The dashboard (spec: "Operating a queue", "Observability"), called as an ASGI app
from Trio: pages, filters and paging, redaction, actions through the facade,
access closed by default, CSRF on every action."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import attrs
import pytest
import trio
from asgi_client import AsgiClient, Reply
from seed import ALL, SECRET, World, charge_card, seed, send_welcome, sync_account

from jobs_support import Item, running_worker, wait_state
from trio_jobs import (
    ErrorCode,
    JobContext,
    Jobs,
    JobsError,
    Retry,
    Worker,
    job,
    memory_driver,
    open_jobs,
)
from trio_jobs.web import CSRF_COOKIE, create_app


@attrs.define
class Site:
    jobs: Jobs
    world: World
    client: AsgiClient


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with open_jobs(memory_driver(), jobs=ALL) as jobs:
        world = await seed(jobs)
        yield Site(jobs, world, AsgiClient(create_app(jobs)))


async def page_token(client: AsgiClient, path: str) -> str:
    reply = await client.get(path)
    assert reply.status == 200, reply.text
    return reply.csrf()


# --------------------------------------------------------------------------- pages


class TestPages:
    async def test_the_overview_shows_every_queue_with_depth_in_flight_failed_and_a_sparkline(
        self, site: Site
    ) -> None:
        reply = await site.client.get("/")
        assert reply.status == 200
        assert reply.headers["content-type"].startswith("text/html")
        html = reply.text
        for queue in ("emails", "billing", "default"):
            assert f">{queue}</a>" in html
        assert "In flight" in html
        assert "Depth" in html
        assert "Failed" in html
        # the emails queue settled three welcomes: its sparkline says so
        assert re.search(r"emails: 3 done, 0 failed in the last hour", html)
        assert '<svg class="spark"' in html
        # the newest dead letters, with their codes
        assert "X_CARD_DECLINED" in html
        assert "X_STEP_OUTCOME_UNKNOWN" in html

    async def test_the_overview_lists_live_workers_with_their_last_heartbeat(
        self, site: Site
    ) -> None:
        worker = Worker(site.jobs, queues=["emails"])
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await trio.sleep(0.05)
            overview = (await site.client.get("/")).text
            workers = (await site.client.get("/workers")).text
            await worker.drain()
        assert worker.id[:8] in overview
        assert worker.id[:8] in workers
        assert "Last heartbeat" in workers
        assert "emails=8" in workers

    async def test_a_job_page_shows_the_step_timeline_progress_and_result(self, site: Site) -> None:
        job_id = site.world.welcomes[0]
        html = (await site.client.get(f"/{job_id}")).text
        # the timeline, in the order the steps were first recorded
        assert html.index("<b>render</b>") < html.index("<b>deliver</b>")
        assert "1 execution" in html
        assert "Welcome, user0" in html  # a step's output
        assert "m-user0" in html
        assert '<progress max="100" value="100">' in html
        assert "delivered" in html
        assert "&quot;sent&quot;: true" in html  # the result, as JSON
        assert "3 of 3" in html or "1 of 3" in html  # attempts / max attempts

    async def test_a_sensitive_jobs_payload_outputs_and_keys_are_redacted(self, site: Site) -> None:
        html = (await site.client.get(f"/{site.world.charge}")).text
        assert SECRET not in html
        assert "order-1" not in html  # the idempotency key is built from the payload
        assert html.count("[redacted]") >= 4  # the key, the step output, payload, result
        # the error and its code stay visible: an operator needs them
        assert "X_CARD_DECLINED" in html
        assert "the issuer declined the charge" in html

    async def test_without_the_handles_each_queue_shows_its_throughput(self) -> None:
        """``trio-jobs dashboard`` registers no handle: the counters say the queue."""
        async with open_jobs(memory_driver(), jobs=ALL) as jobs:
            await seed(jobs)
            bare = AsgiClient(create_app(Jobs(jobs.driver, [])))
            html = (await bare.get("/")).text
        assert "emails: 3 done, 0 failed in the last hour" in html
        assert "billing: 0 done, 1 failed in the last hour" in html
        assert '<span class="muted">3/h</span>' in html

    async def test_without_the_handle_the_rows_own_sensitive_flag_decides(self) -> None:
        async with open_jobs(memory_driver(), jobs=ALL) as jobs:
            world = await seed(jobs)
            # a dashboard whose facade knows none of the handles (`trio-jobs dashboard`)
            bare = AsgiClient(create_app(Jobs(jobs.driver, [])))
            plain = (await bare.get(f"/{world.welcomes[0]}")).text
            secret = (await bare.get(f"/{world.charge}")).text
        assert "m-user0" in plain  # the row says it is not sensitive
        assert "[redacted]" not in plain
        assert SECRET not in secret  # the row says it is
        assert secret.count("[redacted]") >= 4

    async def test_a_row_that_does_not_say_is_hidden_unless_revealed(self) -> None:
        from trio_jobs.web._app import Dashboard

        async with open_jobs(memory_driver(), jobs=ALL) as jobs:
            world = await seed(jobs)
            view = attrs.evolve(await jobs.show(world.welcomes[0]), sensitive=None)
            bare = Jobs(jobs.driver, [])
            options: dict[str, Any] = {"auth": None, "secret": None, "registry": None}
            hidden = Dashboard(bare, reveal_unregistered=False, **options)
            shown = Dashboard(bare, reveal_unregistered=True, **options)
            known = Dashboard(jobs, reveal_unregistered=False, **options)
        assert hidden._redacted(view) is True
        assert shown._redacted(view) is False
        assert known._redacted(view) is False  # the handle says it is not sensitive
        sensitive_handle = attrs.evolve(view, name=charge_card.name)
        assert known._redacted(sensitive_handle) is True

    async def test_an_unknown_job_is_a_404_naming_the_code(self, site: Site) -> None:
        reply = await site.client.get("/00000000-0000-4000-8000-000000000000")
        assert reply.status == 404
        assert "X_JOB_NOT_FOUND" in reply.text

    async def test_text_from_the_queue_is_escaped(self) -> None:
        @attrs.frozen
        class Evil:
            key: str

        @job(input=Evil, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def evil(ctx: JobContext[Evil]) -> None:
            await ctx.step.run("<script>alert(1)</script>", lambda: "<img src=x onerror=alert(2)>")
            raise RuntimeError("<b>bold</b>")

        async with open_jobs(memory_driver(), jobs=[evil]) as jobs:
            enq = await evil.enqueue(Evil("<i>k</i>"), tenant_id="<u>org</u>")
            await Worker(jobs).run_until_quiet()
            client = AsgiClient(create_app(jobs))
            pages = [
                (await client.get("/")).text,
                (await client.get(f"/{enq.id}")).text,
                (await client.get("/jobs")).text,
                (await client.get("/dead")).text,
            ]
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[1]
        assert "&lt;u&gt;org&lt;/u&gt;" in pages[1]
        for html in pages:
            assert "<script>alert(1)" not in html
            assert "<img src=x" not in html
            assert "<b>bold</b>" not in html
            assert "<i>k</i>" not in html
            assert "<u>org</u>" not in html

    async def test_script_in_a_name_an_error_or_a_tenant_renders_escaped_on_every_page(
        self,
    ) -> None:
        """Whatever the rows hold reaches the page as text: a job name, a tenant,
        an error message, a step name, a worker's id, host and queues (a queue
        name is refused at declaration)."""

        def script(what: str) -> str:
            return f'<script>alert("{what}")</script>'

        @attrs.frozen
        class Evil:
            key: str

        @job(
            input=Evil,
            idempotency_key=lambda i: i.key,
            name=script("name"),
            retry=Retry(attempts=1),
        )
        async def evil(ctx: JobContext[Evil]) -> None:
            await ctx.step.run(script("step"), lambda: 1)
            raise JobsError("X_EVIL", script("error"))

        async with open_jobs(memory_driver(), jobs=[evil]) as jobs:
            enq = await evil.enqueue(Evil("k"), tenant_id=script("tenant"))
            await Worker(jobs).run_until_quiet()
            intro = jobs.driver.introspect
            assert intro is not None
            from trio_jobs.drivers import WorkerInfo

            await intro.record_worker(
                WorkerInfo(
                    id=script("worker"),
                    host=script("host"),
                    pid=1,
                    started_at=jobs.driver.now(),
                    queues=[script("queue")],
                    slots={script("queue"): 1},
                    in_flight=[],
                ),
                60.0,
            )
            for handles in (jobs, Jobs(jobs.driver, [])):  # with and without the handle
                client = AsgiClient(create_app(handles))
                pages = {
                    path: (await client.get(path)).text
                    for path in ("/", "/jobs", "/dead", "/workers", f"/{enq.id}")
                }
                shown = {
                    "/": ["name", "error", "host"],
                    "/jobs": ["name"],
                    "/dead": ["name", "error"],
                    "/workers": ["host", "queue"],
                    f"/{enq.id}": ["name", "tenant", "error", "step"],
                }
                for path, html in pages.items():
                    assert "<script>alert" not in html, path
                    for what in shown[path]:
                        assert f"&lt;script&gt;alert(&#34;{what}&#34;)" in html, (path, what)


def section(html: str, heading: str) -> str:
    """The part of a page from ``<h2>heading`` to the next ``<h2>``."""
    start = html.index(f"<h2>{heading}")
    end = html.find("<h2>", start + 4)
    return html[start : end if end >= 0 else len(html)]


class TestJobHistory:
    """The job page's attempt history and step times (issue 15)."""

    async def test_each_attempt_shows_its_times_outcome_code_and_first_line(
        self, autojump_clock: Any
    ) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3, base=1))
        async def flaky(ctx: JobContext[Item]) -> str:
            if ctx.attempt == 1:
                raise JobsError("X_UPSTREAM", "the API answered 502\nbody: <html>secret</html>")
            if ctx.attempt == 2:
                raise RuntimeError("timed out")
            return "ok"

        async with open_jobs(memory_driver(), jobs=[flaky]) as jobs:
            enq = await flaky.enqueue(Item("f"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
            html = (await AsgiClient(create_app(jobs)).get(f"/{enq.id}")).text
        attempts = section(html, "Attempts")
        assert [a.outcome for a in view.attempt_log] == ["retried", "retried", "done"]
        outcomes = re.findall(r'class="badge s-([a-z-]+)"', attempts)
        assert outcomes == ["retried", "retried", "done"]
        assert "<b>X_UPSTREAM</b>" in attempts
        assert "the API answered 502" in attempts
        assert "secret" not in attempts  # the first line only
        assert "RuntimeError: timed out" in attempts
        assert attempts.count("<time datetime=") == 6  # a start and an end each

    async def test_a_sensitive_jobs_attempts_show_codes_not_messages(self, site: Site) -> None:
        html = (await site.client.get(f"/{site.world.charge}")).text
        attempts = section(html, "Attempts")
        assert "<b>X_CARD_DECLINED</b>" in attempts
        assert "the issuer declined" not in attempts
        assert "[redacted]" in attempts

    async def test_each_step_shows_its_start_end_and_duration(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key)
        async def timed(ctx: JobContext[Item]) -> None:
            await ctx.step.run("fetch", partial(trio.sleep, 3))
            await ctx.step.run("store", partial(trio.sleep, 0.25))

        async with open_jobs(memory_driver(), jobs=[timed]) as jobs:
            enq = await timed.enqueue(Item("t"))
            await Worker(jobs).run_until_quiet()
            html = (await AsgiClient(create_app(jobs)).get(f"/{enq.id}")).text
        steps = section(html, "Steps")
        fetch, store = steps.split("<b>store</b>")
        assert "took 3.0 s" in fetch
        assert "took 250 ms" in store
        assert fetch.count("<time datetime=") == 2

    async def test_a_running_job_shows_the_step_in_progress(self, autojump_clock: Any) -> None:
        release = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def upload(ctx: JobContext[Item]) -> None:
            await ctx.step.run("prepare", lambda: 1)
            await ctx.step.run("upload", release.wait)

        async with open_jobs(memory_driver(), jobs=[upload]) as jobs:
            enq = await upload.enqueue(Item("u"))
            client = AsgiClient(create_app(jobs))
            worker = Worker(jobs, heartbeat_interval=1.0)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await trio.sleep(5)  # a few heartbeats
                html = (await client.get(f"/{enq.id}")).text
                release.set()
                await trio.sleep(1)
                await worker.drain()
        attempts, steps = section(html, "Attempts"), section(html, "Steps")
        assert 's-running">running</span>' in attempts
        assert "in step <b>upload</b>" in attempts
        assert "so far" in attempts
        assert "<b>upload</b>" in steps
        assert "in progress for" in steps
        assert steps.index("<b>prepare</b>") < steps.index("<b>upload</b>")


class TestList:
    async def test_filters_are_the_same_as_jobs_list(self, site: Site) -> None:
        client = site.client
        emails = (await client.get("/jobs?queue=emails")).text
        assert emails.count("send_welcome") >= 3
        assert "charge_card" not in emails
        dead = (await client.get("/jobs?state=dead")).text
        assert "charge_card" in dead
        assert "import_rows" in dead
        assert "send_welcome" not in dead
        named = (await client.get(f"/jobs?name={charge_card.name}")).text
        assert "charge_card" in named
        assert "import_rows" not in named
        prefix = site.world.delayed[:6]
        by_id = (await client.get(f"/jobs?id_prefix={prefix}")).text
        assert site.world.delayed[:8] in by_id
        none = (await client.get("/jobs?created_to=2000-01-01T00:00")).text
        assert "No job matches." in none
        wide = (await client.get("/jobs?created_from=2000-01-01T00:00")).text
        assert site.world.delayed[:8] in wide

    async def test_keyset_paging_walks_every_row_once_both_ways(self, site: Site) -> None:
        for n in range(7):
            await send_welcome.enqueue(send_welcome.parse({"user": f"extra{n}"}))
        expected = [v.id for v in (await site.jobs.list(limit=200)).rows]
        seen: list[str] = []
        pages: list[str] = []
        path = "/jobs?limit=4"
        while True:
            html = (await site.client.get(path)).text
            pages.append(path)
            seen += re.findall(r'href="/([0-9a-f-]{36})">', html)
            older = re.search(r'href="([^"]*after=[^"]*)">Older', html)
            if older is None:
                break
            path = older.group(1).replace("&amp;", "&")
        assert seen == expected
        # and back: the newer link of the last page gives the page before it
        last = (await site.client.get(path)).text
        newer = re.search(r'href="([^"]*before=[^"]*)">← Newer', last)
        assert newer is not None
        back = (await site.client.get(newer.group(1).replace("&amp;", "&"))).text
        first_of_last = re.findall(r'href="/([0-9a-f-]{36})">', last)[0]
        at = expected.index(first_of_last)
        assert re.findall(r'href="/([0-9a-f-]{36})">', back) == expected[at - 4 : at]

    async def test_a_bad_cursor_is_shown_as_the_refusal_not_a_500(self, site: Site) -> None:
        reply = await site.client.get("/jobs?after=not-a-cursor")
        assert reply.status == 200
        assert "X_JOB_PAGE_INVALID" in reply.text
        over = await site.client.get("/jobs?limit=500")
        assert "X_JOB_PAGE_INVALID" in over.text

    async def test_dead_letters_list_the_dead_with_their_errors(self, site: Site) -> None:
        html = (await site.client.get("/dead")).text
        assert "Dead letters" in html
        assert "X_CARD_DECLINED" in html
        assert "X_STEP_OUTCOME_UNKNOWN" in html
        assert "send_welcome" not in html


# --------------------------------------------------------------------------- actions


class TestActions:
    async def test_retry_requeues_a_dead_job_through_the_facade(self, site: Site) -> None:
        job_id = site.world.charge
        token = await page_token(site.client, f"/{job_id}")
        reply = await site.client.post(f"/{job_id}/retry", {"csrf": token})
        assert reply.status == 303
        assert reply.location == f"/{job_id}?ok=retried"
        assert (await site.jobs.show(job_id)).state == "ready"
        after = await site.client.get(reply.location)
        assert "Requeued" in after.text

    async def test_retry_from_a_step_drops_that_step_and_the_later_ones(self, site: Site) -> None:
        job_id = site.world.welcomes[0]
        token = await page_token(site.client, f"/{job_id}")
        reply = await site.client.post(f"/{job_id}/retry", {"csrf": token, "from_step": "deliver"})
        assert reply.status == 303
        view = await site.jobs.show(job_id)
        assert view.state == "ready"
        assert [s.name for s in view.steps] == ["render"]

    async def test_cancel_takes_a_reason_and_a_finished_job_is_refused(self, site: Site) -> None:
        job_id = site.world.delayed
        token = await page_token(site.client, f"/{job_id}")
        reply = await site.client.post(
            f"/{job_id}/cancel", {"csrf": token, "reason": "customer left"}
        )
        assert reply.status == 303
        view = await site.jobs.show(job_id)
        assert view.state == "cancelled"
        assert "customer left" in (view.last_error or "")
        again = await site.client.post(f"/{job_id}/cancel", {"csrf": token})
        assert again.location == f"/{job_id}?refused=X_JOB_NOT_CANCELLABLE"
        shown = await site.client.get(again.location)
        assert "Refused: X_JOB_NOT_CANCELLABLE" in shown.text

    async def test_promote_runs_a_delayed_job_now(self, site: Site) -> None:
        job_id = site.world.delayed
        page = (await site.client.get(f"/{job_id}")).text
        assert "Run now" in page
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]
        reply = await site.client.post(f"/{job_id}/promote", {"csrf": token})
        assert reply.location == f"/{job_id}?ok=promoted"
        view = await site.jobs.show(job_id)
        assert view.state == "ready"
        assert view.run_at <= site.jobs.driver.now()

    async def test_remove_deletes_the_job_and_goes_back_to_the_list(self, site: Site) -> None:
        job_id = site.world.charge
        token = await page_token(site.client, f"/{job_id}")
        reply = await site.client.post(f"/{job_id}/remove", {"csrf": token})
        assert reply.location == "/jobs?ok=removed"
        with pytest.raises(JobsError) as caught:
            await site.jobs.show(job_id)
        assert caught.value.code == ErrorCode.X_JOB_NOT_FOUND

    async def test_pause_and_resume_a_queue(self, site: Site) -> None:
        token = await page_token(site.client, "/")
        reply = await site.client.post("/queues/pause", {"csrf": token, "queue": "emails"})
        assert reply.location == "/?ok=paused"
        assert await site.jobs.paused_queues() == ["emails"]
        html = (await site.client.get("/")).text
        assert "s-paused" in html
        assert ">Resume</button>" in html
        await site.client.post("/queues/resume", {"csrf": token, "queue": "emails"})
        assert await site.jobs.paused_queues() == []

    async def test_resolve_an_unknown_once_step_then_retry(self, site: Site) -> None:
        job_id = site.world.unknown
        page = (await site.client.get(f"/{job_id}")).text
        assert "Outcome unknown" in page
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]
        reply = await site.client.post(
            f"/{job_id}/resolve-step",
            {"csrf": token, "step": "upload", "ran": "1", "output": '{"rows": 3}'},
        )
        assert reply.location == f"/{job_id}?ok=resolved"
        view = await site.jobs.show(job_id)
        assert [(s.name, s.status, s.output) for s in view.steps] == [
            ("upload", "completed", {"rows": 3})
        ]

    async def test_bulk_requeue_by_filter_reports_affected_and_remaining(self, site: Site) -> None:
        token = await page_token(site.client, "/jobs?state=dead")
        reply = await site.client.post(
            "/bulk", {"csrf": token, "op": "requeue", "state": "dead", "back": "/dead"}
        )
        assert reply.status == 303
        assert reply.location.startswith("/dead?ok=requeue_many&affected=2&remaining=0")
        assert (await site.jobs.list(state="dead")).rows == []
        shown = await site.client.get(reply.location)
        assert "2 changed, 0 still match." in shown.text

    async def test_every_action_is_logged_without_payload_values(
        self, site: Site, caplog: Any
    ) -> None:
        caplog.set_level("INFO", logger="trio_jobs")
        token = await page_token(site.client, f"/{site.world.charge}")
        await site.client.post(f"/{site.world.charge}/retry", {"csrf": token})
        records = [r for r in caplog.records if r.getMessage() == "jobs.dashboard.action"]
        assert [(r.action, r.job_id, r.code) for r in records] == [  # type: ignore[attr-defined]
            ("retry", site.world.charge, None)
        ]
        assert SECRET not in repr(records[0].__dict__)


# --------------------------------------------------------------------------- access


class TestAccess:
    async def test_closed_by_default_to_a_non_loopback_client(self, site: Site) -> None:
        outsider = AsgiClient(create_app(site.jobs), client=("203.0.113.7", 40000))
        for path in ("/", "/jobs", f"/{site.world.charge}", "/metrics"):
            reply = await outsider.get(path)
            assert reply.status == 403, path
            assert "auth hook" in reply.text or "auth" in reply.text
        refused = await outsider.post(f"/{site.world.charge}/retry", {"csrf": "x"})
        assert refused.status == 403
        assert (await site.jobs.show(site.world.charge)).state == "dead"

    @pytest.mark.parametrize("header", ["x-forwarded-for", "forwarded", "x-real-ip"])
    async def test_a_loopback_peer_relaying_for_someone_else_is_refused(
        self, site: Site, header: str
    ) -> None:
        reply = await site.client.get("/", headers={header: "203.0.113.7"})
        assert reply.status == 403

    async def test_an_ipv6_loopback_client_is_served(self, site: Site) -> None:
        for address in ("::1", "::ffff:127.0.0.1", "127.0.0.9"):
            client = AsgiClient(create_app(site.jobs), client=(address, 40000))
            assert (await client.get("/")).status == 200, address

    async def test_an_auth_hook_opens_it_and_alone_decides(self, site: Site) -> None:
        def is_operator(request: Any) -> bool:
            return bool(request.headers.get("authorization") == "Bearer ops-token")

        app = create_app(site.jobs, auth=is_operator)
        remote = AsgiClient(app, client=("203.0.113.7", 40000))
        assert (await remote.get("/")).status == 403
        ok = await remote.get("/", headers={"authorization": "Bearer ops-token"})
        assert ok.status == 200
        # the hook decides alone: a loopback client without the token is refused too
        assert (await AsgiClient(app).get("/")).status == 403

    async def test_an_async_auth_hook_is_awaited(self, site: Site) -> None:
        async def is_operator(request: Any) -> bool:
            await trio.lowlevel.checkpoint()
            return request.headers.get("x-operator") == "yes"

        remote = AsgiClient(create_app(site.jobs, auth=is_operator), client=("10.9.8.7", 1))
        assert (await remote.get("/", headers={"x-operator": "yes"})).status == 200
        assert (await remote.get("/", headers={"x-operator": "no"})).status == 403

    async def test_a_hook_answering_something_truthy_but_not_true_is_a_refusal(
        self, site: Site
    ) -> None:
        remote = AsgiClient(create_app(site.jobs, auth=lambda r: "yes"), client=("10.9.8.7", 1))  # type: ignore[arg-type, return-value]
        assert (await remote.get("/")).status == 403

    async def test_pages_forbid_framing_and_inline_code_without_the_nonce(self, site: Site) -> None:
        reply = await site.client.get("/")
        csp = reply.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp
        nonce = re.search(r"script-src 'nonce-([^']+)'", csp).group(1)  # type: ignore[union-attr]
        assert f'<script nonce="{nonce}">' in reply.text
        assert reply.headers["x-frame-options"] == "DENY"
        assert reply.headers["cache-control"] == "no-store"


class TestCsrf:
    async def test_an_action_without_a_token_is_refused(self, site: Site) -> None:
        await site.client.get(f"/{site.world.charge}")  # has the cookie
        reply = await site.client.post(f"/{site.world.charge}/retry", {})
        assert reply.status == 403
        assert "CSRF" in reply.text
        assert (await site.jobs.show(site.world.charge)).state == "dead"

    async def test_a_token_from_another_cookie_is_refused(self, site: Site) -> None:
        other = AsgiClient(create_app(site.jobs))
        foreign = await page_token(other, "/")
        await site.client.get("/")
        reply = await site.client.post(f"/{site.world.charge}/retry", {"csrf": foreign})
        assert reply.status == 403
        assert (await site.jobs.show(site.world.charge)).state == "dead"

    async def test_a_request_without_the_cookie_is_refused_even_with_a_valid_looking_token(
        self, site: Site
    ) -> None:
        token = await page_token(site.client, "/")
        site.client.cookies.clear()
        reply = await site.client.post(f"/{site.world.charge}/retry", {"csrf": token})
        assert reply.status == 403

    async def test_a_cross_site_post_is_refused_even_with_the_token(self, site: Site) -> None:
        token = await page_token(site.client, "/")
        reply = await site.client.post(
            f"/{site.world.charge}/retry",
            {"csrf": token},
            headers={"origin": "https://evil.example", "sec-fetch-site": "cross-site"},
        )
        assert reply.status == 403
        same = await site.client.post(
            f"/{site.world.charge}/retry",
            {"csrf": token},
            headers={"origin": "http://localhost", "sec-fetch-site": "same-origin"},
        )
        assert same.status == 303

    async def test_the_cookie_is_httponly_and_samesite_lax_and_scoped_to_the_mount(
        self, site: Site
    ) -> None:
        mounted = AsgiClient(create_app(site.jobs), root_path="/admin/jobs")
        reply = await mounted.get("/")
        raw = reply.headers["set-cookie"]
        assert raw.startswith(f"{CSRF_COOKIE}=")
        assert "HttpOnly" in raw
        assert "samesite=lax" in raw.lower()
        assert "Path=/admin/jobs/" in raw
        # links follow the mount
        assert 'href="/admin/jobs/jobs"' in reply.text

    async def test_a_token_signed_by_another_secret_is_refused(self, site: Site) -> None:
        first = AsgiClient(create_app(site.jobs, secret=b"a" * 32))
        token = await page_token(first, "/")
        second = AsgiClient(create_app(site.jobs, secret=b"b" * 32))
        second.cookies = dict(first.cookies)
        assert (await second.post(f"/{site.world.charge}/retry", {"csrf": token})).status == 403
        shared = AsgiClient(create_app(site.jobs, secret=b"a" * 32))
        shared.cookies = dict(first.cookies)
        assert (await shared.post(f"/{site.world.charge}/retry", {"csrf": token})).status == 303


def test_create_app_refuses_what_is_not_a_facade() -> None:
    with pytest.raises(JobsError) as caught:
        create_app(object())  # type: ignore[arg-type]
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID
    with pytest.raises(JobsError):
        create_app(Jobs(memory_driver(), []), secret=b"short")


async def test_a_page_reply_is_one_round_of_facade_reads_not_sql(site: Site) -> None:
    """Actions and pages go through the facade: the app module holds no SQL."""
    import inspect

    import trio_jobs.web._actions as actions_module
    import trio_jobs.web._app as app_module
    import trio_jobs.web._pages as pages_module

    for module in (app_module, pages_module, actions_module):
        source = inspect.getsource(module).lower()
        for pattern in (
            r"\bselect\b[^<>\n]*\bfrom\b",
            r"\bupdate \w+ set\b",
            "delete from",
            "insert into",
        ):
            assert not re.search(pattern, source), (module.__name__, pattern)
        assert "execute(" not in source
        assert "driver." not in source.replace("jobs.driver.now", ""), module.__name__
    _ = (sync_account, Reply)


def test_html_comes_from_autoescaping_templates_one_per_page() -> None:
    """No module of the web package writes HTML: the pages are Jinja2 templates
    (autoescape on) shipped in the package, one per page."""
    import importlib.resources
    import inspect

    import trio_jobs.web as web
    from trio_jobs.web import _actions, _app, _metrics, _pages, _security, _serve, _templates

    assert _templates.environment().autoescape is True
    folder = importlib.resources.files(web) / "templates"
    shipped = {entry.name for entry in folder.iterdir()}
    for page in ("overview.html", "jobs.html", "dead.html", "workers.html", "job.html"):
        assert page in shipped
        _templates.environment().get_template(page)  # found through the package loader
    tag = re.compile(r"<(td|tr|th|div|span|a|form|input|table|pre|h1|h2|p|li|ol|svg|b)[ >]")
    for module in (_actions, _app, _metrics, _pages, _security, _serve, _templates):
        assert not tag.search(inspect.getsource(module)), module.__name__
