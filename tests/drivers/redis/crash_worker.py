"""A worker process for the SIGKILL test (run as a script, not collected).

``python crash_worker.py URL PREFIX MARKS MODE``: enqueues the one ``crashy`` job
(idempotent: a second process dedupes onto the live row) and runs a Worker on
the Redis driver. Every step appends a line to the file ``MARKS``. In ``hang``
mode step ``two`` starts, says so, and blocks until the process is killed; in
``finish`` mode it completes, and the process exits once the job is done.
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import trio

from trio_jobs import JobContext, Retry, Worker, job, open_jobs, redis_driver

URL, PREFIX, MARKS, MODE = sys.argv[1:5]


def mark(line: str) -> None:
    with Path(MARKS).open("a") as f:
        f.write(line + "\n")
        f.flush()


@attrs.frozen
class Order:
    order: str


@job(
    input=Order,
    tenant="none",
    idempotency_key=lambda i: f"crashy:{i.order}",
    retry=Retry(attempts=3),
    name="crashy",
)
async def crashy(ctx: JobContext[Order]) -> str:
    def one() -> str:
        mark("one")
        return "first"

    await ctx.step.run("one", one)

    async def two() -> str:
        mark("two:start")
        if MODE == "hang":
            await trio.sleep_forever()
        mark("two:done")
        return "second"

    await ctx.step.run("two", two)
    mark("done")
    return "ok"


async def main() -> None:
    async with open_jobs(redis_driver(URL, prefix=PREFIX), jobs=[crashy]) as jobs:
        await crashy.enqueue(Order("o1"))
        worker = Worker(jobs, poll_interval="50ms", idle_poll_max="200ms", visibility_timeout="2s")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            while worker.stats().done < 1:  # noqa: ASYNC110 — poll the worker's own counter
                await trio.sleep(0.05)
            await worker.drain()


if __name__ == "__main__":
    trio.run(main)
