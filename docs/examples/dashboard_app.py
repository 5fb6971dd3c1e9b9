"""The code of docs/how-to/mount-the-dashboard.md, whole and runnable.

``OPS_TOKEN=... python docs/examples/dashboard_app.py`` serves an app with the
jobs dashboard mounted at ``/admin/jobs``; ``tests/docs/test_observability_examples.py``
serves it on 127.0.0.1 and checks the auth hook, and that every code block of
the page is a verbatim part of this file.
"""

from __future__ import annotations

import hmac
import os

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from trio_jobs import JobContext, Jobs, Worker, job, memory_driver, open_jobs
from trio_jobs.web import PrometheusObserver, create_app


@attrs.frozen
class Invoice:
    invoice_id: str


@job(input=Invoice, idempotency_key=lambda i: f"invoice:{i.invoice_id}", queue="billing")
async def send_invoice(ctx: JobContext[Invoice]) -> None:
    await ctx.step.run("render", lambda: {"pages": 2})
    await ctx.step.run("email", lambda: {"message_id": f"m-{ctx.input.invoice_id}"})


OPS_TOKEN = os.environ.get("OPS_TOKEN", "change-me")


def is_operator(request: Request) -> bool:
    """Serve the dashboard only to requests carrying the operators' token."""
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {OPS_TOKEN}".encode())


async def home(request: Request) -> PlainTextResponse:
    return PlainTextResponse("the app itself")


def build_app(jobs: Jobs) -> Starlette:
    return Starlette(
        routes=[
            Route("/", home),
            Mount("/admin/jobs", app=create_app(jobs, auth=is_operator)),
        ]
    )


async def serve_app(
    jobs: Jobs,
    host: str = "0.0.0.0",
    port: int = 8000,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    config = Config()
    config.bind = [f"{host}:{port}"]
    # Hypercorn's Trio worker: the app, the facade and the driver share one loop.
    await serve(build_app(jobs), config, task_status=task_status)  # type: ignore[arg-type]


async def main() -> None:
    async with open_jobs(memory_driver(), jobs=[send_invoice]) as jobs:
        await send_invoice.enqueue(Invoice("inv-1"))
        async with trio.open_nursery() as nursery:
            await nursery.start(Worker(jobs, observer=PrometheusObserver()).run)
            await nursery.start(serve_app, jobs)


if __name__ == "__main__":
    trio.run(main)
