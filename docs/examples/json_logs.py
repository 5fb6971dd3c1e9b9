"""The code of docs/how-to/read-the-logs.md, whole and runnable.

``python docs/examples/json_logs.py`` prints the JSON lines of a job whose
attempts fail; ``tests/docs/test_observability_examples.py`` parses them.
"""

from __future__ import annotations

import logging
import sys
from typing import IO

import attrs
import trio

import trio_jobs.logging
from trio_jobs import JobContext, Retry, job
from trio_jobs.testing import open_harness


@attrs.frozen
class Refund:
    charge_id: str


@job(input=Refund, idempotency_key=lambda i: f"refund:{i.charge_id}", retry=Retry(attempts=2))
async def refund(ctx: JobContext[Refund]) -> None:
    def settle() -> None:
        raise RuntimeError("the gateway hung up")

    await ctx.step.run("settle", settle)


def json_logs(stream: IO[str] = sys.stderr) -> None:
    trio_jobs.logging.configure(json=True, stream=stream, level=logging.INFO)


async def main() -> None:
    json_logs(sys.stdout)
    async with open_harness(jobs=[refund]) as h:
        trace = await h.run(refund, Refund("ch_1"))
        h.clock.advance("1m")
        trace = await h.drain()
    print(trace.state if trace else None)


if __name__ == "__main__":
    trio.run(main)
