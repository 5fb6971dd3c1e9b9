"""``python -m benchmarks check-gate``: ``trio-jobs check`` over an app of 10 jobs
of 3 steps, 20 drawn examples and 100 seeds each, on the memory driver.

Prints the wall time, the CPU time of the process, and the counts the report
gives. The issue's bound: under 60 s on the 2-core box."""

from __future__ import annotations

import logging
import os
import sys
import time
import types
from collections.abc import Sequence

import attrs
import trio

from trio_jobs import JobContext, Retry, job
from trio_jobs.testing import check_jobs


@attrs.frozen
class Item:
    id: int
    qty: int


def app(jobs: int = 10) -> types.ModuleType:
    """A module of ``jobs`` jobs, each three steps with an idempotent effect."""
    module = types.ModuleType("bench_app")
    effects: dict[str, int] = {}
    for n in range(jobs):

        def make(n: int) -> object:
            @job(
                name=f"job{n}",
                input=Item,
                idempotency_key=lambda i, n=n: f"job{n}:{i.id}",
                retry=Retry(attempts=5),
            )
            async def body(ctx: JobContext[Item]) -> int:
                key = f"job{n}:{ctx.input.id}"
                a = await ctx.step.run("reserve", lambda: effects.setdefault(key, ctx.input.qty))
                b = await ctx.step.run("price", lambda: int(a) * 3)
                await ctx.step.run("record", lambda: effects.setdefault(key + ":done", int(b)))
                return int(b)

            return body

        setattr(module, f"job{n}", make(n))
    module.trio_jobs_observe = lambda: dict(sorted(effects.items()))  # type: ignore[attr-defined]
    module.trio_jobs_reset = effects.clear  # type: ignore[attr-defined]
    return module


def main(argv: Sequence[str] = ()) -> int:
    logging.getLogger("trio_jobs").setLevel(logging.CRITICAL)
    jobs = int(argv[0]) if argv else 10
    module = app(jobs)
    wall, cpu = time.perf_counter(), time.process_time()
    report = trio.run(lambda: check_jobs(module, examples=20, seeds=100))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    runs = sum(j.examples + j.boundaries for j in report.jobs)
    print(f"ok={report.ok} jobs={len(report.jobs)} crash runs={runs} "
          f"seeds={sum(j.seeds for j in report.jobs)}")  # fmt: skip
    print(f"wall {wall:.1f} s, CPU {cpu:.1f} s, load average {os.getloadavg()[0]:.2f}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
