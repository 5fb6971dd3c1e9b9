"""The code of docs/how-to/scrape-metrics.md, whole and runnable.

A worker process with no dashboard exposes its metrics itself;
``tests/docs/test_observability_examples.py`` runs it and scrapes it.
"""

from __future__ import annotations

import attrs
import prometheus_client
import trio

from trio_jobs import JobContext, Jobs, Worker, job, memory_driver, open_jobs
from trio_jobs.web import PrometheusObserver, render_metrics


@attrs.frozen
class Thumbnail:
    image_id: str


@job(input=Thumbnail, idempotency_key=lambda i: f"thumb:{i.image_id}", queue="media")
async def make_thumbnail(ctx: JobContext[Thumbnail]) -> None:
    await ctx.step.run("resize", lambda: {"width": 256})


def expose_metrics(port: int = 9100, addr: str = "0.0.0.0") -> int:
    """Serve this process's registry on ``port`` (a thread of prometheus-client's)."""
    server, _thread = prometheus_client.start_http_server(port, addr=addr)
    return int(server.server_port)


async def run_worker(jobs: Jobs, *, task_status: trio.TaskStatus[Worker]) -> None:
    worker = Worker(jobs, queues=["media"], observer=PrometheusObserver())
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        task_status.started(worker)


async def queue_metrics(jobs: Jobs) -> str:
    """The queue gauges (queue_depth, queue_demand, ...) as /metrics would add them."""
    return (await render_metrics(jobs)).decode()


async def main() -> None:
    expose_metrics(9100)
    async with open_jobs(memory_driver(), jobs=[make_thumbnail]) as jobs:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_worker, jobs)
            await make_thumbnail.enqueue(Thumbnail("img-1"))


if __name__ == "__main__":
    trio.run(main)
