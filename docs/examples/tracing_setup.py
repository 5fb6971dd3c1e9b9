"""The code of docs/how-to/export-traces.md, whole and runnable.

``tests/docs/test_observability_examples.py`` runs :func:`main` with an
in-memory exporter and checks the spans it produced.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

import trio_jobs.tracing
from trio_jobs import JobContext, Worker, job, memory_driver, open_jobs


def otlp_exporter() -> SpanExporter:
    # pip install opentelemetry-exporter-otlp-proto-http
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
        OTLPSpanExporter,
    )

    exporter: SpanExporter = OTLPSpanExporter(endpoint="http://localhost:4318/v1/traces")
    return exporter


def setup_tracing(exporter: SpanExporter) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "billing-worker"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


@attrs.frozen
class Order:
    order_id: str


@job(input=Order, idempotency_key=lambda i: f"ship:{i.order_id}")
async def ship_order(ctx: JobContext[Order]) -> None:
    await ctx.step.run("reserve", lambda: {"slot": "A4"})
    await ctx.step.run("label", lambda: {"tracking": "1Z999"})


async def handle_checkout(order_id: str) -> None:
    tracer = trace.get_tracer("shop")
    with tracer.start_as_current_span("POST /checkout"):
        await ship_order.enqueue(Order(order_id))  # the row carries this span's context


async def main(provider: Any = None) -> None:
    if provider is not None:  # a test hands in its own provider
        trio_jobs.tracing.configure(tracer_provider=provider)
    async with open_jobs(memory_driver(), jobs=[ship_order]) as jobs:
        await handle_checkout("o-1")
        await Worker(jobs).run_until_quiet()


if __name__ == "__main__":
    provider = setup_tracing(otlp_exporter())
    trio.run(main)
    provider.shutdown()
