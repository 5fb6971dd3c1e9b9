"""``python -m benchmarks cpu``: the worker's CPU per job, for A/B rounds of two trees.

Wall-clock rates on a shared box move with the neighbours; the CPU a worker
process spends per job moves far less. This runs one configuration N times and
prints, per run, the worker's CPU per job (``time.process_time`` over the timed
part, the same window as the ``memory`` and ``postgres`` suites) and, on
PostgreSQL, the server backends' (from ``/proc``). To compare two trees, alternate
them with ``PYTHONPATH`` (the tree's ``src`` first)::

    for r in 1 2 3; do
      for t in /tmp/old/src src; do
        PYTHONPATH=$t python -m benchmarks cpu --driver postgres --job noop
      done
    done

Each line names the tree it ran (``trio_jobs.__file__``) and the load average.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Sequence

import trio

import trio_jobs
from trio_jobs import Worker, memory_driver, open_jobs

from . import memory as mem


async def _memory_once(handle: object, n: int, concurrency: int) -> tuple[float, float]:
    driver = memory_driver()
    async with open_jobs(driver, jobs=[handle]) as jobs:  # type: ignore[list-item]
        await mem._enqueue_all(handle, n)
        settles = mem._Settles(driver, n)
        worker = Worker(jobs, concurrency=concurrency)
        gc.collect()
        async with trio.open_nursery() as nursery:
            cpu0 = time.process_time()
            started = time.perf_counter()
            await nursery.start(worker.run)
            await settles.done.wait()
            cpu = time.process_time() - cpu0
            elapsed = settles.finished_at - started
            await worker.drain()
    return cpu / n * 1e6, n / elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks cpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--driver", choices=("memory", "postgres"), default="memory")
    parser.add_argument(
        "--job",
        choices=("noop", "steps"),
        default="noop",
        help="steps: 5 on memory, 3 on PostgreSQL",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="jobs a run (20,000 no-op, 10,000 step jobs)"
    )
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args(argv)
    tree = os.path.dirname(os.path.dirname(trio_jobs.__file__))
    if args.driver == "memory":
        handle = mem.noop if args.job == "noop" else mem.steps5
        n = args.jobs or (20_000 if args.job == "noop" else 10_000)
        conc = args.concurrency or (64 if args.job == "noop" else 128)
        for _ in range(args.runs):
            cpu, rate = trio.run(_memory_once, handle, n, conc)
            print(
                f"{tree} memory {args.job} c{conc}: worker {cpu:.1f} µs CPU/job, "
                f"{rate:,.0f} jobs/s, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        return 0
    from . import postgres as pg

    server = pg.Server(args.dsn or os.environ.get("DATABASE_URL") or pg.DEFAULT_DSN)
    handle = pg.pg_noop if args.job == "noop" else pg.pg_steps3
    n = args.jobs or (pg.NOOP_JOBS if args.job == "noop" else pg.STEP_JOBS)
    conc = args.concurrency or (1024 if args.job == "noop" else 256)
    with server.database("cpu") as db:
        for _ in range(args.runs):
            rate = pg.tj_throughput(server, db, handle, n, conc)
            w, srv = pg.LAST_CPU["worker"], pg.LAST_CPU["server"]
            print(
                f"{tree} postgres {args.job} c{conc}: worker {w:.1f} µs CPU/job, PostgreSQL "
                f"{srv if srv is not None else float('nan'):.1f} µs, {rate:,.0f} jobs/s, "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
