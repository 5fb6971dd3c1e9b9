"""What server-side preparation buys on a direct connection: ``python -m benchmarks prepared``.

    python -m benchmarks prepared [--rounds 6] [--claims 400] [--batch 10]

The driver prepares nothing by default (behind a transaction-mode pooler a
prepared statement breaks the worker; see docs/explanation/design-choices.md).
Two drivers on one throwaway schema of ready rows, one with
``prepared_statements=True``; alternated rounds (the box is shared) of
``--claims`` claims of ``--batch`` rows, every row acked. Prints the claim and
the ack p50/p99 of each and the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Sequence

import psycopg
import trio

from trio_jobs.drivers.postgres import postgres_driver

from .big_table import READY_SQL, _pct, _round, _sql


async def _main(opts: argparse.Namespace, dsn: str) -> None:
    schema = f"bench_prep_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    drivers = {
        "unprepared": postgres_driver(dsn, schema=schema, pool_size=4),
        "prepared": postgres_driver(dsn, schema=schema, pool_size=4, prepared_statements=True),
    }
    try:
        for d in drivers.values():
            await d.open()
        n = (opts.rounds * opts.claims * opts.batch + 1000) * 2
        _sql(dsn, schema, READY_SQL, {"n": n, "now": drivers["prepared"].now()})
        _sql(dsn, schema, "VACUUM ANALYZE trio_jobs_jobs")
        print(f"load before: {os.getloadavg()}")
        for d in drivers.values():
            await _round(d, 20, opts.batch)  # warm: psycopg prepares after 5 runs
        lat: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in drivers}
        for i in range(opts.rounds):
            order = list(drivers) if i % 2 == 0 else list(reversed(drivers))
            for key in order:
                c, a = await _round(drivers[key], opts.claims, opts.batch)
                lat[key][0].extend(c)
                lat[key][1].extend(a)
        print(f"load after: {os.getloadavg()}")
        print("| driver | claim p50 ms | claim p99 ms | ack p50 ms | ack p99 ms |")
        print("|---|---|---|---|---|")
        figures = {}
        for key, (c, a) in lat.items():
            figures[key] = [_pct(c, 0.5), _pct(c, 0.99), _pct(a, 0.5), _pct(a, 0.99)]
            print(f"| {key} | " + " | ".join(f"{x * 1e3:.2f}" for x in figures[key]) + " |")
        ratio = [u / p for u, p in zip(figures["unprepared"], figures["prepared"], strict=True)]
        print("| unprepared / prepared | " + " | ".join(f"{r:.2f}x" for r in ratio) + " |")
    finally:
        for d in drivers.values():
            await d.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks prepared")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--batch", type=int, default=10)
    opts = parser.parse_args(list(argv))
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        print("set DATABASE_URL to the server to measure", file=sys.stderr)
        return 2
    trio.run(_main, opts, dsn)
    return 0
