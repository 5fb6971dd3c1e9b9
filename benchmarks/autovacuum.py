"""Autovacuum's effect on the claim and the ack: ``python -m benchmarks autovacuum``.

    python -m benchmarks autovacuum [--minutes 10] [--rate 500] [--settled 1000000]
                                    [--batch 10] [--json FILE]

The shared test server runs with ``autovacuum = off`` server-wide (a setting no
session may change for the others), so this benchmark starts two throwaway
clusters of its own (``initdb`` + ``pg_ctl``, the binaries on ``PATH``, as the
tests' ``Cluster`` does), identical but for ``autovacuum``: *on* (PostgreSQL's
defaults: a one-minute naptime, a scale factor of 0.2) and *off*. Each gets
``--settled`` done rows, then the same steady load for ``--minutes``, both in
the same minutes (one process each, an A/B on the same box):

* a producer enqueues ``--rate`` no-op jobs a second (``enqueue_many`` every
  100 ms);
* a claimer claims batches of ``--batch`` through the driver and acks every
  row, timing each claim statement and each ack statement.

Every minute each side reports its claim and ack p50/p99 of that minute, the
jobs it settled, the table's dead and live tuples, its size with its indexes,
and how many times autovacuum ran on it. Both clusters are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import trio

from trio_jobs import JobContext, job, open_jobs
from trio_jobs.drivers import AckOptions, ClaimOptions
from trio_jobs.drivers.postgres import postgres_driver

from .big_table import SETTLED_SQL

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "drivers" / "postgres"))


STATS_SQL = """
SELECT n_dead_tup, n_live_tup, autovacuum_count, pg_total_relation_size(relid)
FROM pg_stat_user_tables WHERE relname = 'trio_jobs_jobs'
"""


@job(name="bench.av.noop", input=int, idempotency_key=lambda i: f"av:{i}")
async def av_noop(ctx: JobContext[int]) -> None:
    return None


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def _stats(dsn: str) -> tuple[int, int, int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(STATS_SQL).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


async def _side(dsn: str, minutes: float, rate: int, settled: int, batch: int) -> None:
    """One cluster's run; a JSON line per minute on stdout."""
    driver = postgres_driver(dsn, pool_size=4)
    async with open_jobs(driver, jobs=[av_noop]):
        if settled:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(SETTLED_SQL, {"n": settled, "now": time.time()})
                conn.execute("VACUUM ANALYZE trio_jobs_jobs")
        claim_t: list[float] = []
        ack_t: list[float] = []
        done = 0
        end = trio.current_time() + minutes * 60
        wid = f"bench-av-{uuid.uuid4().hex[:8]}"

        async def produce() -> None:
            n = 0
            per = max(1, rate // 10)
            tick = trio.current_time()
            while trio.current_time() < end:
                await av_noop.enqueue_many(range(n, n + per))
                n += per
                tick += 0.1
                await trio.sleep_until(tick)

        async def ack(found: Any) -> None:
            nonlocal done
            t1 = time.perf_counter()
            await driver.ack(found.id, AckOptions(fence=found.fence, result=None))
            ack_t.append(time.perf_counter() - t1)
            done += 1

        async def consume() -> None:
            while trio.current_time() < end:
                t0 = time.perf_counter()
                got = await driver.claim(
                    ClaimOptions(worker_id=wid, queues={"default": batch}, visibility_timeout=60.0)
                )
                if not got.jobs:
                    await trio.sleep(0.01)
                    continue
                claim_t.append(time.perf_counter() - t0)
                async with trio.open_nursery() as nursery:
                    for found in got.jobs:
                        nursery.start_soon(ack, found)

        async def report() -> None:
            nonlocal done
            minute = 0
            while trio.current_time() < end:
                await trio.sleep(min(60.0, max(0.0, end - trio.current_time())))
                minute += 1
                dead, live, vacuums, size = await trio.to_thread.run_sync(_stats, dsn)
                line = {
                    "minute": minute,
                    "claim_p50": _pct(claim_t, 0.5),
                    "claim_p99": _pct(claim_t, 0.99),
                    "ack_p50": _pct(ack_t, 0.5),
                    "ack_p99": _pct(ack_t, 0.99),
                    "jobs": done,
                    "dead": dead,
                    "live": live,
                    "autovacuums": vacuums,
                    "mb": size / 1e6,
                }
                claim_t.clear()
                ack_t.clear()
                done = 0
                print(json.dumps(line), flush=True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            nursery.start_soon(consume)
            nursery.start_soon(report)


def _cell(r: dict[str, Any]) -> str:
    return (
        f"{r['claim_p50']:.2f} / {r['claim_p99']:.2f} | {r['ack_p50']:.2f} / {r['ack_p99']:.2f} "
        f"| {r['jobs'] / 60:,.0f} | {r['dead']:,} | {r['mb']:,.0f} | {r['autovacuums']}"
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks autovacuum")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--settled", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--json")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # a child's DSN
    opts = parser.parse_args(list(argv))
    if opts.side:
        trio.run(_side, opts.side, opts.minutes, opts.rate, opts.settled, opts.batch)
        return 0

    from cluster import Cluster, binaries_missing  # tests/drivers/postgres/cluster.py

    missing = binaries_missing()
    if missing:
        print(f"cannot start a throwaway cluster: {missing}", file=sys.stderr)
        return 2
    settings = {"shared_buffers": "128MB", "max_wal_size": "1GB", "track_counts": "on"}
    on = Cluster({**settings, "autovacuum": "on"})
    off = Cluster({**settings, "autovacuum": "off"})
    results: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    try:
        on.start()
        off.start()
        args = [
            "--minutes", str(opts.minutes), "--rate", str(opts.rate),
            "--settled", str(opts.settled), "--batch", str(opts.batch),
        ]  # fmt: skip
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-m", "benchmarks", "autovacuum", "--side", c.dsn(), *args],
                stdout=subprocess.PIPE,
                text=True,
                cwd=str(HERE.parent),
            )
            for name, c in (("on", on), ("off", off))
        }
        for name, proc in procs.items():
            out, _ = proc.communicate()
            if proc.returncode != 0:
                print(f"the autovacuum={name} side failed ({proc.returncode})", file=sys.stderr)
                return 1
            results[name] = [json.loads(line) for line in out.splitlines() if line.strip()]
    finally:
        on.close()
        off.close()
    print(
        f"\n{opts.minutes:g} minutes, {opts.rate} jobs/s offered, {opts.settled:,} settled rows "
        f"first, claims of {opts.batch}; cells: claim p50 / p99 ms | ack p50 / p99 ms | jobs/s "
        "| dead tuples | MB (table + indexes) | autovacuum runs\n"
    )
    print("| minute | autovacuum on | | | | | | autovacuum off | | | | | |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for a, b in zip(results["on"], results["off"], strict=False):
        print(f"| {a['minute']} | {_cell(a)} | {_cell(b)} |")
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=2))
    return 0
