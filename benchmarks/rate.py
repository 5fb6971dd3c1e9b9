"""A fleet budget on PostgreSQL: many workers' slots against one ``rate_limiter``.

    python -m benchmarks rate [--dsn DSN] [--limit 60] [--per 6s] [--windows 5]
                              [--processes 2] [--workers 10] [--slots 8]

``--workers`` Worker instances of ``--slots`` slots each, split over
``--processes`` processes, serve a backlog of no-op jobs whose body's first line
is ``await vendor.acquire()`` on one shared budget of ``--limit`` per ``--per``.
A refused body is deferred to its retry-after, uncounted. The backlog is larger
than the windows measured can spend, so the budget is always the bottleneck.

The grants are read from the store itself: ``trio_jobs_rate_limits.hits`` holds
the instants (the database's clock) of the grants still in the window, and is
polled four times a window, so every grant is seen before the window drops it.
Reported: the grants in each fixed window from the first grant, the most in
any interval of length ``--per`` (the sliding-window bound, which must not
exceed the limit), how the runs ended, and the deferrals per grant (the
attempt logs' hand-backs; each run that did not fit the first window is
deferred at least once, so the floor is the runs deferred per grant).

The database is ``--dsn``, else ``$DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; the run works in a fresh schema
of it, dropped at the end.
"""

from __future__ import annotations

import argparse
import bisect
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trio_jobs import JobContext, RateLimiter, Retry, Worker, job, open_jobs, rate_limiter
from trio_jobs._time import parse_duration
from trio_jobs.drivers.postgres import migrate, postgres_driver

NAME = "bench.vendor"
_LIMITER: list[RateLimiter] = []


@attrs.frozen
class Tick:
    n: int


@job(
    input=Tick,
    tenant="none",
    idempotency_key=lambda t: f"tick:{t.n}",
    retry=Retry(attempts=1),
    name="bench.rate.tick",
)
async def tick(ctx: JobContext[Tick]) -> None:
    """A no-op behind the fleet's budget: one attempt, never spent by waiting."""
    await _LIMITER[0].acquire()


def _scoped(dsn: str, schema: str) -> str:
    params = conninfo_to_dict(dsn)
    options = str(params.get("options", ""))
    params["options"] = f"{options} -c search_path={schema}".strip()
    return make_conninfo("", **params)


# --------------------------------------------------------------------------- a worker process


async def _child(dsn: str, workers: int, slots: int) -> None:
    async with open_jobs(postgres_driver(dsn), jobs=[tick]) as jobs:
        fleet = [Worker(jobs, concurrency=slots) for _ in range(workers)]
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                for worker in fleet:
                    await nursery.start(worker.run)
                print("ready", flush=True)
                async for _ in signals:
                    break
                for worker in fleet:
                    nursery.start_soon(worker.drain)


# --------------------------------------------------------------------------- the run


def _max_in_window(hits: Sequence[float], per: float) -> int:
    """The most grants in any half-open interval ``(t - per, t]``."""
    most = 0
    for i, at in enumerate(hits):
        first = bisect.bisect_right(hits, at - per)
        most = max(most, i - first + 1)
    return most


def run(args: argparse.Namespace) -> dict[str, Any]:
    limit, per = args.limit, parse_duration(args.per, field="--per")
    schema = f"tjbench_rate_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    dsn = _scoped(args.dsn, schema)
    trio.run(migrate, dsn)
    children: list[subprocess.Popen[bytes]] = []
    try:
        split = [args.workers // args.processes] * args.processes
        for i in range(args.workers % args.processes):
            split[i] += 1
        env = {**os.environ, "BENCH_RATE": f"{limit}/{args.per}"}
        for n in split:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.rate", "child", dsn, str(n), str(args.slots)],
                env=env,
                stdout=subprocess.PIPE,
            )
            children.append(proc)
        for proc in children:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError("a worker process did not start")
        backlog = limit * (args.windows + 2) + args.workers * args.slots

        async def enqueue() -> None:
            async with open_jobs(postgres_driver(dsn), jobs=[tick]):
                for start in range(0, backlog, 1000):
                    await tick.enqueue_many(
                        [Tick(n) for n in range(start, min(backlog, start + 1000))]
                    )

        trio.run(enqueue)
        seen: set[float] = set()
        first: float | None = None
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                rows = conn.execute(
                    "SELECT hits FROM trio_jobs_rate_limits WHERE name = %s", (NAME,)
                ).fetchall()
                for (hits,) in rows:
                    seen.update(hits)
                if seen and first is None:
                    first = min(seen)
                if first is not None and max(seen) >= first + per * args.windows:
                    break
                time.sleep(per / 4)
            states = conn.execute(
                "SELECT state, attempts, count(*) FROM trio_jobs_jobs GROUP BY 1, 2 ORDER BY 1, 2"
            ).fetchall()
            # Deferrals, from the attempt logs (each keeps a job's newest 20 claims).
            handed_back, capped = conn.execute(
                "SELECT count(*) FILTER (WHERE e ->> 'outcome' = 'handed-back'), "
                "count(DISTINCT id) FILTER (WHERE jsonb_array_length(attempt_log) >= 20) "
                "FROM trio_jobs_jobs, jsonb_array_elements(attempt_log) e"
            ).fetchone() or (0, 0)
            # Runs deferred at least once, and more than once.
            deferred_runs, again = conn.execute(
                "SELECT count(*) FILTER (WHERE n > 0), count(*) FILTER (WHERE n > 1) FROM ("
                " SELECT (SELECT count(*) FROM jsonb_array_elements(attempt_log) e"
                "         WHERE e ->> 'outcome' = 'handed-back') AS n FROM trio_jobs_jobs) c"
            ).fetchone() or (0, 0)
    finally:
        for proc in children:
            proc.send_signal(signal.SIGTERM)
        for proc in children:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert first is not None
    hits = sorted(seen)
    windows = [
        sum(1 for h in hits if first + k * per <= h < first + (k + 1) * per)
        for k in range(args.windows)
    ]
    return {
        "windows": windows,
        "max_sliding": _max_in_window(hits, per),
        "states": states,
        "handed_back": handed_back,
        "deferred_runs": deferred_runs,
        "deferred_again": again,
        "capped": capped,
        "grants": len(hits),
        "backlog": backlog,
        "per": per,
    }


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "child":
        dsn, workers, slots = argv[1], int(argv[2]), int(argv[3])
        limit, per = os.environ["BENCH_RATE"].split("/", 1)
        _LIMITER.append(rate_limiter(NAME, limit=int(limit), per=per))
        trio.run(_child, dsn, workers, slots)
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks rate")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--limit", type=int, default=60, help="Grants per window (default 60).")
    parser.add_argument("--per", default="6s", help="The window (default 6s).")
    parser.add_argument("--windows", type=int, default=5, help="Windows measured (default 5).")
    parser.add_argument("--processes", type=int, default=2, help="Worker processes (default 2).")
    parser.add_argument("--workers", type=int, default=10, help="Workers in all (default 10).")
    parser.add_argument("--slots", type=int, default=8, help="Slots per worker (default 8).")
    args = parser.parse_args(list(argv))
    started = time.monotonic()
    result = run(args)
    took = time.monotonic() - started
    slots = args.workers * args.slots
    print(
        f"{args.workers} workers x {args.slots} slots = {slots} slots in {args.processes} "
        f"processes, budget {args.limit} per {args.per}, backlog {result['backlog']} "
        f"({took:.0f} s)"
    )
    print()
    print("| window | grants (starts) |")
    print("|---:|---:|")
    for k, count in enumerate(result["windows"], 1):
        print(f"| {k} | {count} |")
    print()
    print(f"most grants in any {args.per} interval: {result['max_sliding']} (limit {args.limit})")
    print("rows by state and attempts:", ", ".join(f"{s}/{a}: {n}" for s, a, n in result["states"]))
    print(
        f"deferrals: {result['handed_back']} for {result['grants']} grants "
        f"({result['handed_back'] / max(1, result['grants']):.1f} per grant; jobs whose "
        f"attempt log is full, so undercounted: {result['capped']})"
    )
    print(
        f"runs deferred: {result['deferred_runs']}, of them more than once: "
        f"{result['deferred_again']} (the floor is one deferral per run that did not fit "
        f"the first window: {result['deferred_runs'] / max(1, result['grants']):.2f} per grant)"
    )
    ok = result["max_sliding"] <= args.limit and all(c == args.limit for c in result["windows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
