"""Tracing (spec: "Observability" → OpenTelemetry): one span per job attempt, one
child span per executed step, linked to the span that enqueued the job (the
W3C trace context travels in the row); no payload value on any span. Checked
with the SDK's in-memory exporter."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import trio

import trio_jobs.tracing
from jobs_support import jobs_on_memory, running_worker, wait_state
from trio_jobs import JobContext, JobsError, Retry, job
from trio_jobs import _tracing as tracing_impl

pytest.importorskip("opentelemetry.sdk", reason="tracing tests need the `otel` extra's SDK")
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

SECRET = "acct_SECRET_7781"


@attrs.frozen
class Account:
    account: str = SECRET


@attrs.define
class Traces:
    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]


@pytest.fixture
def traces() -> Iterator[Traces]:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trio_jobs.tracing.configure(tracer_provider=provider)
    try:
        yield Traces(provider, exporter)
    finally:
        trio_jobs.tracing.configure()


@job(input=Account, idempotency_key=lambda i: f"sync:{i.account}", retry=Retry(attempts=3))
async def sync_account(ctx: JobContext[Account]) -> dict[str, str]:
    fetched = await ctx.step.run("fetch", lambda: {"account": ctx.input.account})
    if ctx.attempt == 1:
        await ctx.step.run("write", _boom)
    await ctx.step.run("write", lambda: "written")
    return {"account": fetched["account"]}


def _boom() -> None:
    raise JobsError("X_VENDOR_BUSY", f"vendor refused {SECRET}")


def all_strings(span: ReadableSpan) -> str:
    parts = [span.name, repr(dict(span.attributes or {}))]
    parts += [repr(dict(e.attributes or {})) + e.name for e in span.events]
    if span.status.description:
        parts.append(span.status.description)
    return " ".join(parts)


async def test_one_span_per_attempt_and_one_child_per_executed_step(
    traces: Traces, autojump_clock: Any
) -> None:
    app = traces.provider.get_tracer("app")
    async with jobs_on_memory([sync_account]) as (jobs, _driver):
        with app.start_as_current_span("POST /accounts/sync") as request:
            enq = await sync_account.enqueue(Account())
        async with running_worker(jobs):
            await wait_state(jobs, enq.id, "done")
    attempts = sorted(traces.named("job "), key=lambda s: s.attributes["trio_jobs.job.attempt"])  # type: ignore[index]
    assert [s.attributes["trio_jobs.job.attempt"] for s in attempts] == [1, 2]  # type: ignore[index]
    assert all(s.kind == trace.SpanKind.CONSUMER for s in attempts)
    assert all(s.attributes["trio_jobs.job.id"] == enq.id for s in attempts)  # type: ignore[index]
    # linked to the span that enqueued the job (the default), each its own trace
    enqueuer = request.get_span_context()
    for span in attempts:
        assert span.parent is None
        assert [link.context.span_id for link in span.links] == [enqueuer.span_id]
        assert span.context.trace_id != enqueuer.trace_id
    # the first attempt failed on "write" and retried; the second replayed "fetch"
    first, second = attempts
    assert first.attributes["trio_jobs.outcome"] == "retried"  # type: ignore[index]
    assert first.status.status_code == trace.StatusCode.ERROR
    assert second.attributes["trio_jobs.outcome"] == "done"  # type: ignore[index]
    assert second.status.status_code == trace.StatusCode.UNSET
    steps = traces.named("step ")
    by_parent: dict[int, list[str]] = {}
    for step in steps:
        assert step.parent is not None
        by_parent.setdefault(step.parent.span_id, []).append(step.name)
    assert by_parent == {
        first.context.span_id: ["step fetch", "step write"],
        second.context.span_id: ["step write"],  # fetch replayed from storage: not executed
    }
    failed = next(
        s for s in steps if s.parent.span_id == first.context.span_id and s.name == "step write"
    )  # type: ignore[union-attr]
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert failed.attributes["trio_jobs.error.code"] == "X_VENDOR_BUSY"  # type: ignore[index]
    assert failed.attributes["error.type"] == "JobsError"  # type: ignore[index]


async def test_no_payload_value_on_any_span(traces: Traces, autojump_clock: Any) -> None:
    app = traces.provider.get_tracer("app")
    async with jobs_on_memory([sync_account]) as (jobs, _driver):
        with app.start_as_current_span("enqueue"):
            enq = await sync_account.enqueue(Account())
        async with running_worker(jobs):
            await wait_state(jobs, enq.id, "done")
    spans = traces.named("job ") + traces.named("step ")
    assert len(spans) == 5
    for span in spans:
        assert SECRET not in all_strings(span), span.name


async def test_child_propagation_puts_attempts_in_the_enqueuers_trace(
    traces: Traces, autojump_clock: Any
) -> None:
    trio_jobs.tracing.configure(propagation="child", tracer_provider=traces.provider)
    app = traces.provider.get_tracer("app")
    async with jobs_on_memory([sync_account]) as (jobs, _driver):
        with app.start_as_current_span("POST /accounts/sync") as request:
            enq = await sync_account.enqueue(Account())
        async with running_worker(jobs):
            await wait_state(jobs, enq.id, "done")
    enqueuer = request.get_span_context()
    for span in traces.named("job "):
        assert span.parent is not None
        assert span.parent.span_id == enqueuer.span_id
        assert span.context.trace_id == enqueuer.trace_id
        assert span.links == ()


async def test_without_an_enqueuing_span_an_attempt_is_a_root_with_no_link(
    traces: Traces, autojump_clock: Any
) -> None:
    app = traces.provider.get_tracer("app")
    async with jobs_on_memory([sync_account]) as (jobs, _driver):
        enq = await sync_account.enqueue(Account())
        # the worker runs under some ambient span: it is not the job's parent
        with app.start_as_current_span("the worker process"):
            async with running_worker(jobs):
                await wait_state(jobs, enq.id, "done")
    for span in traces.named("job "):
        assert span.parent is None
        assert span.links == ()


async def test_a_job_enqueued_by_a_job_links_to_the_step_that_enqueued_it(
    traces: Traces, autojump_clock: Any
) -> None:
    @job(input=Account, idempotency_key=lambda i: f"child:{i.account}")
    async def child(ctx: JobContext[Account]) -> None:
        return None

    @job(input=Account, idempotency_key=lambda i: f"parent:{i.account}")
    async def parent(ctx: JobContext[Account]) -> None:
        await ctx.step.run("spawn", lambda: _spawn(child))

    async with jobs_on_memory([parent, child]) as (jobs, _driver):
        enq = await parent.enqueue(Account())
        async with running_worker(jobs):
            await wait_state(jobs, enq.id, "done")
            rows = await jobs.list(name=child.name)
            await wait_state(jobs, rows.rows[0].id, "done")
    spawn = traces.named("step spawn")[0]
    child_span = next(s for s in traces.named("job ") if s.name == f"job {child.name}")
    assert [link.context.span_id for link in child_span.links] == [spawn.context.span_id]


async def _spawn(child: Any) -> str:
    enq = await child.enqueue(Account())
    return str(enq.id)


async def test_without_opentelemetry_every_call_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch, traces: Traces, autojump_clock: Any
) -> None:
    monkeypatch.setattr(tracing_impl, "ENABLED", False)
    app = traces.provider.get_tracer("app")
    async with jobs_on_memory([sync_account]) as (jobs, _driver):
        with app.start_as_current_span("request"):
            assert tracing_impl.inject() is None
            enq = await sync_account.enqueue(Account())
        async with running_worker(jobs):
            await wait_state(jobs, enq.id, "done")
    assert traces.named("job ") == []
    assert trio_jobs.tracing.enabled() is False


def test_the_propagation_mode_is_checked() -> None:
    with pytest.raises(JobsError):
        trio_jobs.tracing.configure(propagation="sideways")  # type: ignore[arg-type]


@pytest.mark.postgres
async def test_the_trace_context_travels_in_the_postgres_row(traces: Traces) -> None:
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        pytest.skip("set DATABASE_URL to check the row's trace context on PostgreSQL")
    import psycopg

    from trio_jobs import open_jobs
    from trio_jobs.drivers import ClaimOptions
    from trio_jobs.drivers.postgres import postgres_driver

    schema = f"tj_trace_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        app = traces.provider.get_tracer("app")
        async with open_jobs(postgres_driver(dsn, schema=schema), jobs=[sync_account]) as jobs:
            with app.start_as_current_span("request") as request:
                await sync_account.enqueue(Account())
            claimed = await jobs.driver.claim(
                ClaimOptions(worker_id="w", queues={"default": 1}, visibility_timeout=30.0)
            )
            await trio.lowlevel.checkpoint()
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    context = claimed.jobs[0].trace_context
    assert context is not None
    ctx = request.get_span_context()
    assert context["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    assert set(context) <= {"traceparent", "tracestate"}  # no baggage: that is app data
