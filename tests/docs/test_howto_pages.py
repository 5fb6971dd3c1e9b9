"""What the how-to pages' programs do: each page's Python blocks are loaded as
one module (``_pages.load_page``, as ``test_tutorials.py`` runs them), then
served, scraped, traced or run here, and the output a page shows is checked."""

from __future__ import annotations

import io
import logging
import os
import re
import urllib.request
from collections.abc import Iterator
from contextlib import redirect_stdout
from typing import Any

import orjson
import psycopg
import pytest
import trio

import trio_jobs.logging
import trio_jobs.tracing
from pg_schemas import throwaway_schema

from ._pages import DOCS, load_page, output_after


def test_the_logs_page_lists_every_event() -> None:
    text = (DOCS / "how-to" / "read-the-logs.md").read_text(encoding="utf-8")
    for event in trio_jobs.logging.EVENTS:
        assert f"| `{event}` |" in text, f"{event} is missing from read-the-logs.md"


@pytest.mark.parametrize("page", ["how-to/mount-the-dashboard.md"])
def test_the_screenshots_the_page_shows_are_committed(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    images = re.findall(r"\]\(\.\./images/([^)]+\.png)\)", text)
    assert images
    for image in images:
        data = (DOCS / "images" / image).read_bytes()
        assert data.startswith(b"\x89PNG"), image


# ---------------------------------------------------------------------- the dashboard


async def test_the_mounted_dashboard_answers_operators_only() -> None:
    import httpx

    from trio_jobs import memory_driver, open_jobs

    app = load_page("docs/how-to/mount-the-dashboard.md")
    async with open_jobs(memory_driver(), jobs=[app.send_invoice]) as jobs:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(app.serve_app, jobs, "127.0.0.1", 0)
            base = urls[0]

            def visit() -> dict[str, int]:
                ops = {"authorization": f"Bearer {app.OPS_TOKEN}"}
                with httpx.Client(base_url=base, timeout=10) as http:
                    return {
                        "home": http.get("/").status_code,
                        "anonymous": http.get("/admin/jobs/").status_code,
                        "operator": http.get("/admin/jobs/", headers=ops).status_code,
                        "metrics": http.get("/admin/jobs/metrics", headers=ops).status_code,
                        "wrong": http.get(
                            "/admin/jobs/", headers={"authorization": "Bearer nope"}
                        ).status_code,
                        # a name not in allowed_hosts: refused before the hook is asked
                        "rebound": http.get(
                            "/admin/jobs/", headers={**ops, "host": "evil.example"}
                        ).status_code,
                    }

            got = await trio.to_thread.run_sync(visit)
            nursery.cancel_scope.cancel()
    # the hook alone decides: even a loopback request without the token is refused
    assert got == {
        "home": 200,
        "anonymous": 403,
        "operator": 200,
        "metrics": 200,
        "wrong": 403,
        "rebound": 400,
    }


# ---------------------------------------------------------------------- metrics


async def until_done(jobs: Any, job_id: str) -> None:
    state = ""
    while state != "done":
        await trio.sleep(0.01)
        state = (await jobs.show(job_id)).state


async def test_a_worker_process_exposes_its_metrics() -> None:
    from trio_jobs import memory_driver, open_jobs

    page = load_page("docs/how-to/scrape-metrics.md")
    port = page.expose_metrics(0, addr="127.0.0.1")
    async with open_jobs(memory_driver(), jobs=[page.make_thumbnail]) as jobs:
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(page.run_worker, jobs)
            enq = await page.make_thumbnail.enqueue(page.Thumbnail("img-1"))
            with trio.fail_after(10):
                await until_done(jobs, enq.id)
            queues = await page.queue_metrics(jobs)
            await worker.drain()
            nursery.cancel_scope.cancel()

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            return str(reply.read().decode())

    text = await trio.to_thread.run_sync(scrape)
    # what the page says worker.py serves
    assert re.search(r'jobs_total\{outcome="done",queue="media"\} [1-9]', text)
    assert "job_duration_seconds_bucket" in text
    assert 'queue_depth{queue="media"} 0.0' in queues


# ---------------------------------------------------------------------- traces


async def test_traces_link_the_checkout_to_the_shipping_job(autojump_clock: Any) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    page = load_page("docs/how-to/export-traces.md")
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # OpenTelemetry's global provider can be set once per process: the page's
    # setup_tracing() is for its own process. Here both the library's spans and
    # the page's "shop" tracer go to this provider.
    trio_jobs.tracing.configure(tracer_provider=provider)
    original = trace.get_tracer
    trace.get_tracer = lambda *a, **k: provider.get_tracer(*a, **k)  # type: ignore[assignment]
    try:
        await page.main()
    finally:
        trace.get_tracer = original  # type: ignore[assignment]
        trio_jobs.tracing.configure()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert len(spans) == 4  # as the page says: four spans
    checkout = spans["POST /checkout"]
    attempt = next(s for n, s in spans.items() if n.startswith("job "))
    assert attempt.name.endswith(".ship_order")
    assert [link.context.span_id for link in attempt.links] == [checkout.context.span_id]
    steps = sorted(
        n for n, s in spans.items() if s.parent and s.parent.span_id == attempt.context.span_id
    )
    assert steps == ["step label", "step reserve"]


def test_setup_tracing_installs_a_provider_named_for_the_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    page = load_page("docs/how-to/export-traces.md")
    # The global provider can be set once per process: catch it instead.
    installed: list[Any] = []
    monkeypatch.setattr(trace, "set_tracer_provider", installed.append)
    exporter = InMemorySpanExporter()
    provider = page.setup_tracing(exporter)
    assert installed == [provider]
    assert provider.resource.attributes["service.name"] == "billing-worker"
    with provider.get_tracer("t").start_as_current_span("one"):
        pass
    provider.shutdown()  # as the page's process does at exit: the batch is exported
    assert [s.name for s in exporter.get_finished_spans()] == ["one"]


# ---------------------------------------------------------------------- logs


async def test_the_json_logs_are_the_lines_the_page_shows(autojump_clock: Any) -> None:
    page_name = "docs/how-to/read-the-logs.md"
    page = load_page(page_name)
    logger = logging.getLogger("trio_jobs")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            await page.main()
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])
    lines = out.getvalue().splitlines()
    got = [orjson.loads(line) for line in lines if line.startswith("{")]
    shown_block = output_after(page_name, ".venv/bin/python refunds.py")
    assert shown_block is not None
    shown = [orjson.loads(line) for line in shown_block.source.splitlines()]
    assert len(got) == len(shown)
    for g, s in zip(got, shown, strict=True):
        assert list(g) == list(s), "the fields, in order"
        for field in ("level", "logger", "event", "attempt", "code", "queue"):
            assert g[field] == s[field], field
        assert g["job"].rsplit(".", 1)[1] == s["job"].rsplit(".", 1)[1]
    assert lines[-1] == "dead"  # "then prints the run's state, `dead`"


# ---------------------------------------------------------------------- outbox


@pytest.fixture
def schema_dsn() -> Iterator[str]:
    with throwaway_schema("tj_docs") as dsn:
        yield dsn


@pytest.mark.postgres
async def test_the_outbox_program_prints_what_the_page_shows(
    schema_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    page_name = "docs/how-to/outbox.md"
    shown = output_after(
        page_name, "DATABASE_URL=postgresql://app@localhost/app .venv/bin/python posts.py"
    )
    assert shown is not None
    monkeypatch.setenv("DATABASE_URL", schema_dsn)  # the page reads it
    page = load_page(page_name)
    out = io.StringIO()
    with redirect_stdout(out):
        await page.main()
    assert out.getvalue() == shown.source
    with psycopg.connect(schema_dsn, autocommit=True) as conn:
        assert conn.execute("select id from posts").fetchall() == [("p-1",)]


# ---------------------------------------------------------------------- Redis

REDIS_URL = os.environ.get("REDIS_URL")


def _delete_keys(url: str, prefix: str) -> None:
    import coredis

    async def go() -> None:
        client: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
        async with client:
            keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
            if keys:
                await client.delete(keys)

    trio.run(go)


@pytest.fixture
def redis_url() -> Iterator[str]:
    """REDIS_URL, with the page's keys (the default prefix, which no other test
    uses) deleted before and after."""
    if not REDIS_URL:
        pytest.skip("REDIS_URL is unset: no Redis server to run the Redis page against")
    _delete_keys(REDIS_URL, "trio_jobs")
    try:
        yield REDIS_URL
    finally:
        _delete_keys(REDIS_URL, "trio_jobs")


def test_the_redis_program_prints_what_the_page_shows(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    page_name = "docs/how-to/redis-driver.md"
    shown = output_after(
        page_name, "REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python on_redis.py"
    )
    assert shown is not None
    monkeypatch.setenv("REDIS_URL", redis_url)
    page = load_page(page_name)
    out = io.StringIO()
    with redirect_stdout(out):
        trio.run(page.main)
    assert out.getvalue() == shown.source
