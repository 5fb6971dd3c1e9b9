"""The operator how-tos' code runs: the dashboard, metrics, tracing and logging
examples under docs/examples/ are executed here, and every ``python`` block of
their pages is a verbatim part of the example file."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
import textwrap
import urllib.request
from types import ModuleType
from typing import Any

import orjson
import pytest
import trio

pytest.importorskip("starlette", reason="the dashboard examples need the `web` extra")
pytest.importorskip("opentelemetry.sdk", reason="the tracing example needs the SDK")

import trio_jobs.logging
import trio_jobs.tracing

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"

#: how-to page -> the example file its code blocks come from.
PAGES = {
    "how-to/mount-the-dashboard.md": "dashboard_app.py",
    "how-to/scrape-metrics.md": "metrics_worker.py",
    "how-to/export-traces.md": "tracing_setup.py",
    "how-to/read-the-logs.md": "json_logs.py",
}

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def load(filename: str) -> ModuleType:
    path = EXAMPLES / filename
    name = f"_docs_example_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_code_block_is_part_of_its_example(page: str) -> None:
    source = (EXAMPLES / PAGES[page]).read_text(encoding="utf-8")
    text = (DOCS / page).read_text(encoding="utf-8")
    found = [textwrap.dedent(b).strip("\n") for b in _BLOCK.findall(text)]
    assert found, f"{page} has no python blocks"
    for block in found:
        assert block in source, f"this block of {page} is not in docs/examples/{PAGES[page]}"


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


async def test_the_mounted_dashboard_answers_operators_only() -> None:
    import httpx

    example = load("dashboard_app.py")
    async with trio_jobs_open(example) as jobs:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(example.serve_app, jobs, "127.0.0.1", 0)
            base = urls[0]

            def visit() -> dict[str, int]:
                ops = {"authorization": f"Bearer {example.OPS_TOKEN}"}
                with httpx.Client(base_url=base, timeout=10) as http:
                    return {
                        "home": http.get("/").status_code,
                        "anonymous": http.get("/admin/jobs/").status_code,
                        "operator": http.get("/admin/jobs/", headers=ops).status_code,
                        "metrics": http.get("/admin/jobs/metrics", headers=ops).status_code,
                        "wrong": http.get(
                            "/admin/jobs/", headers={"authorization": "Bearer nope"}
                        ).status_code,
                    }

            got = await trio.to_thread.run_sync(visit)
            nursery.cancel_scope.cancel()
    # the hook alone decides: even a loopback request without the token is refused
    assert got == {"home": 200, "anonymous": 403, "operator": 200, "metrics": 200, "wrong": 403}


def trio_jobs_open(example: ModuleType) -> Any:
    from trio_jobs import memory_driver, open_jobs

    return open_jobs(memory_driver(), jobs=[example.send_invoice])


async def until_done(jobs: Any, job_id: str) -> None:
    state = ""
    while state != "done":
        await trio.sleep(0.01)
        state = (await jobs.show(job_id)).state


async def test_a_worker_process_exposes_its_metrics() -> None:
    from trio_jobs import memory_driver, open_jobs

    example = load("metrics_worker.py")
    port = example.expose_metrics(0, addr="127.0.0.1")
    async with open_jobs(memory_driver(), jobs=[example.make_thumbnail]) as jobs:
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(example.run_worker, jobs)
            enq = await example.make_thumbnail.enqueue(example.Thumbnail("img-1"))
            with trio.fail_after(10):
                await until_done(jobs, enq.id)
            queues = await example.queue_metrics(jobs)
            await worker.drain()
            nursery.cancel_scope.cancel()

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            return str(reply.read().decode())

    text = await trio.to_thread.run_sync(scrape)
    assert re.search(r'jobs_total\{outcome="done",queue="media"\} [1-9]', text)
    assert "job_duration_seconds_bucket" in text
    assert 'queue_depth{queue="media"} 0.0' in queues


async def test_traces_link_the_checkout_to_the_shipping_job(autojump_clock: Any) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    example = load("tracing_setup.py")
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # the example's handler uses the global tracer; route it to this provider too
    from opentelemetry import trace

    original = trace.get_tracer
    trace.get_tracer = lambda *a, **k: provider.get_tracer(*a, **k)  # type: ignore[assignment]
    try:
        await example.main(provider)
    finally:
        trace.get_tracer = original  # type: ignore[assignment]
        trio_jobs.tracing.configure()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    checkout = spans["POST /checkout"]
    attempt = next(s for n, s in spans.items() if n.startswith("job "))
    assert [link.context.span_id for link in attempt.links] == [checkout.context.span_id]
    steps = sorted(
        n for n, s in spans.items() if s.parent and s.parent.span_id == attempt.context.span_id
    )
    assert steps == ["step label", "step reserve"]


async def test_the_json_logs_example(
    autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import logging

    logger = logging.getLogger("trio_jobs")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        await load("json_logs.py").main()
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])
    lines = capsys.readouterr().out.splitlines()
    events = [orjson.loads(line) for line in lines if line.startswith("{")]
    assert [e["event"] for e in events] == ["jobs.attempt.retried", "jobs.job.dead-lettered"]
    assert [e["attempt"] for e in events] == [1, 2]
    assert events[1]["code"] == "X_JOB_MAX_ATTEMPTS"
    assert lines[-1] == "dead"
