"""The server's CPU per claim and ack statement: ``python -m benchmarks statements``.

    python -m benchmarks statements [--sizes 1,4,64,500] [--statements 200] [--rounds 1]

One driver (``pool_size=1``, so every statement runs on one backend; prepared
where the connection proves direct, as in production) on a throwaway schema of
ready no-op rows. For each batch size: ``--statements`` claims of that many rows,
each followed by one ``ack_many`` of the rows it got (warm-ups first, not
counted). The backend's CPU (``/proc/<pid>/schedstat``, nanoseconds) is read
around every statement, so a figure is the server's own work for that statement
(parse/plan/execute/commit), not the client's. Prints µs a statement and µs a
row, medians, and the load average. To compare two trees, alternate them with
``PYTHONPATH`` (the tree's ``src`` first) in the same minutes.

``--peer R`` instead runs R alternated rounds of the no-op throughput run of
one trio-jobs worker process (concurrency 1,024; then again with
``done_retention=0``, done rows not kept, graphile-worker's own behaviour) and one graphile-worker
process (batched, concurrency 64) on the same server, printing each side's
PostgreSQL CPU per job (the backends serving it, from ``/proc``).

``--done-retention 0`` measures the ack of a driver that keeps no done rows
(``ack_many_unkept``: the ack deletes the row).

``--explain`` also prints ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of one claim and
one ack of the first size, the driver's own statement text and parameters.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import trio

import trio_jobs
from trio_jobs.drivers import AckOptions, ClaimOptions
from trio_jobs.drivers.postgres import postgres_driver

from .big_table import READY_SQL, _sql


def _which(text: str) -> str:
    """The driver's statement a prepared statement's text is (by a CTE only it has)."""
    marks = {"AS due": "claim_ready", "reoffered AS": "claim", "hit AS": "ack_many"}
    if "gone AS" in text:
        return "ack_many_unkept"
    return next((name for mark, name in marks.items() if mark in text), "other")


def _cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def _measure(driver: Any, pid: int, size: int, statements: int, wid: str) -> dict[str, Any]:
    claim_ns: list[int] = []
    ack_ns: list[int] = []
    rows = 0
    opts = ClaimOptions(worker_id=wid, queues={"default": size}, visibility_timeout=60.0)
    for _ in range(statements):
        c0 = _cpu_ns(pid)
        got = await driver.claim(opts)
        c1 = _cpu_ns(pid)
        acks = [(j.id, AckOptions(fence=j.fence, result=None, duration=0.001)) for j in got.jobs]
        if not acks:
            raise RuntimeError("ran out of ready rows: raise the table's size")
        landed = await driver._ack_many(acks)
        c2 = _cpu_ns(pid)
        if not all(landed):
            raise RuntimeError("an ack did not land")
        claim_ns.append(c1 - c0)
        ack_ns.append(c2 - c1)
        rows += len(acks)
    per = rows / statements
    claim = statistics.median(claim_ns) / 1e3
    ack = statistics.median(ack_ns) / 1e3
    return {"size": size, "rows": per, "claim": claim, "ack": ack}


async def _explain(dsn: str, schema: str, driver: Any, size: int, wid: str) -> None:
    from trio_jobs.drivers.postgres._sql import query

    got = await driver.claim(
        ClaimOptions(worker_id=wid, queues={"default": size}, visibility_timeout=60.0)
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        claim_params = {
            "now": None,
            "queues": ["default"],
            "takes": [size],
            "worker_id": wid,
            "visibility": 60.0,
            "drop_names": [],
            "lapse_message": "lapsed %s of %s",
            "lapsed_line": "lapsed",
            "registry_ttl": None,
        }
        for name, params in (("claim_ready", claim_params), ("claim", claim_params)):
            cur = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, WAL, VERBOSE OFF) " + query(name), params
            )
            print(f"--- {name} ({size} rows)")
            print("\n".join(r[0] for r in cur.fetchall()))
        claimed = conn.execute(
            "SELECT id::text, worker_id, claim FROM trio_jobs_jobs WHERE state = 'running' "
            "AND worker_id = %s",
            (wid,),
        ).fetchall()
        import json

        rows = [
            {"ord": i, "id": r[0], "worker_id": r[1], "claim": r[2], "duration": 0.001}
            for i, r in enumerate(claimed, start=1)
        ]
        cur = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, WAL) " + query(driver._ack_query),
            {"now": None, "rows": json.dumps(rows)},
        )
        print(f"--- {driver._ack_query} ({len(rows)} rows)")
        print("\n".join(r[0] for r in cur.fetchall()))
    del got


async def _main(opts: argparse.Namespace, dsn: str) -> None:
    schema = f"bench_stmt_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    driver = postgres_driver(dsn, schema=schema, pool_size=1, done_retention=opts.done_retention)
    try:
        await driver.open()
        sizes = [int(s) for s in opts.sizes.split(",")]
        warm = 10
        need = sum((opts.statements + warm) * s for s in sizes) * opts.rounds + 2000
        _sql(dsn, schema, READY_SQL, {"n": need, "now": driver.now()})
        _sql(dsn, schema, "VACUUM ANALYZE trio_jobs_jobs")
        pid = (await driver.db.fetch("SELECT pg_backend_pid()"))[0][0]
        wid = f"bench-{uuid.uuid4().hex[:8]}"
        tree = os.path.dirname(os.path.dirname(trio_jobs.__file__))
        print(
            f"tree {tree}; backend {pid}; prepared {driver.prepared_statements};"
            f" done_retention {opts.done_retention}; load {os.getloadavg()}",
            flush=True,
        )
        if opts.explain:
            await _explain(dsn, schema, driver, sizes[0], wid)
        print(
            "| rows a statement | claim µs a statement | ack µs a statement "
            "| claim µs a row | ack µs a row | load |"
        )
        print("|---:|---:|---:|---:|---:|---|")
        for _ in range(opts.rounds):
            for size in sizes:
                await _measure(driver, pid, size, warm, wid)
                r = await _measure(driver, pid, size, opts.statements, wid)
                if (await driver.db.fetch("SELECT pg_backend_pid()"))[0][0] != pid:
                    raise RuntimeError("the pool's connection changed: figures void")
                print(
                    f"| {r['rows']:.0f} | {r['claim']:.0f} | {r['ack']:.0f} "
                    f"| {r['claim'] / r['rows']:.1f} | {r['ack'] / r['rows']:.1f} "
                    f"| {os.getloadavg()[0]:.1f} |",
                    flush=True,
                )
        plans = await driver.db.fetch(
            "SELECT generic_plans, custom_plans, statement FROM pg_prepared_statements"
            " ORDER BY 2 DESC"
        )
        for g, c, text in plans:
            name = _which(text)
            print(f"prepared {name}: generic plans {g}, custom plans {c}")
        floor: list[int] = []
        for _ in range(opts.statements):
            c0 = _cpu_ns(pid)
            await driver.db.fetch("SELECT 1")
            floor.append(_cpu_ns(pid) - c0)
        print(
            f"floor: SELECT 1 through the same connection, {statistics.median(floor) / 1e3:.0f} µs"
        )
    finally:
        await driver.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _peer(rounds: int, dsn: str) -> None:
    from . import postgres as pg

    server = pg.Server(dsn)
    graphile = pg.Graphile()
    graphile.install()
    with server.database("peercpu") as db:
        for r in range(rounds):
            for unkept in (False, True):
                rate = pg.tj_throughput(server, db, pg.pg_noop, pg.NOOP_JOBS, 1024, unkept=unkept)
                how = " done_retention=0" if unkept else ""
                print(
                    f"round {r + 1}: trio-jobs{how} c1024 {rate:,.0f} jobs/s, PostgreSQL "
                    f"{pg.LAST_CPU['server']:.1f} µs CPU/job (worker {pg.LAST_CPU['worker']:.1f}), "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            rate = pg.gw_processes(graphile, server, db, pg.NOOP_JOBS, 1, 64)
            print(
                f"round {r + 1}: graphile-worker c64 batched {rate:,.0f} jobs/s, PostgreSQL "
                f"{pg.LAST_GW_CPU['server']:.1f} µs CPU/job, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks statements")
    parser.add_argument("--sizes", default="1,4,64,500")
    parser.add_argument("--statements", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--peer", type=int, default=0, metavar="ROUNDS")
    parser.add_argument(
        "--done-retention",
        type=float,
        default=None,
        help="0: the driver keeps no done rows (ack deletes)",
    )
    opts = parser.parse_args(list(argv))
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        print("set DATABASE_URL to the server to measure", file=sys.stderr)
        return 2
    if opts.peer:
        _peer(opts.peer, dsn)
        return 0
    trio.run(_main, opts, dsn)
    return 0
