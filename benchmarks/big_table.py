"""The claim and the ack over a big jobs table: ``python -m benchmarks big-table``.

    python -m benchmarks big-table [--settled 10000000] [--ready 100000]
                                   [--rounds 6] [--claims 300] [--batch 10]
                                   [--purge 200000]

Two throwaway schemas on ``DATABASE_URL``'s server: *empty* holds only the
``--ready`` ready rows, *big* holds the same plus ``--settled`` done rows
(settled over the last 30 days, written by one ``INSERT ... SELECT
generate_series``, then ``VACUUM ANALYZE``). Rounds alternate between the two
(the box is shared: a same-run A/B), each claiming ``--claims`` batches of
``--batch`` rows through the driver and acking every row; the table gives the
claim and ack statement p50/p99 of each schema and their ratio. Then:

* ``EXPLAIN (ANALYZE, BUFFERS)`` of the claim statement on each (the driver's
  own text and parameters, captured from a real claim);
* HOT updates: ``n_tup_hot_upd / n_tup_upd`` of the jobs table over the rounds;
* the purge: ``--purge`` of the settled rows made expired, deleted by the
  retention purge in its batches while a claimer runs beside it; the claim p99
  during the purge and the most backends seen waiting on a lock;
* autovacuum: the table's ``last_autovacuum`` and dead tuples after the rounds.

Both schemas are dropped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import trio

from trio_jobs.drivers import AckOptions, ClaimOptions
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._driver import PostgresDriver
from trio_jobs.drivers.postgres._sql import query

SETTLED_SQL = """
INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, idempotency_key, max_attempts,
    state, attempts, run_at, created_at, updated_at, result, sensitive)
SELECT gen_random_uuid(), gen_random_uuid(), 'bench.big', 'default', to_json(g),
       'settled:' || g, 3, 'done', 1, t, t, t + 0.01, 'null'::json, false
FROM (SELECT g, %(now)s - 2592000.0 * random() AS t FROM generate_series(1, %(n)s) g) x
"""

READY_SQL = """
INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, idempotency_key, max_attempts,
    state, run_at, created_at, updated_at, sensitive)
SELECT gen_random_uuid(), gen_random_uuid(), 'bench.big', 'default', to_json(g),
       'ready:' || g, 3, 'ready', %(now)s - 1, %(now)s - 1, %(now)s - 1, false
FROM generate_series(1, %(n)s) g
"""


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _sql(dsn: str, schema: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


async def _open(dsn: str, schema: str) -> PostgresDriver:
    driver = postgres_driver(dsn, schema=schema, pool_size=4)
    await driver.open()
    return driver


async def _round(
    driver: PostgresDriver, claims: int, batch: int
) -> tuple[list[float], list[float]]:
    """``claims`` claims of ``batch`` rows, each claimed row acked: the latencies."""
    claim_t: list[float] = []
    ack_t: list[float] = []
    wid = f"bench-{uuid.uuid4().hex[:8]}"
    for _ in range(claims):
        t0 = time.perf_counter()
        got = await driver.claim(
            ClaimOptions(worker_id=wid, queues={"default": batch}, visibility_timeout=60.0)
        )
        claim_t.append(time.perf_counter() - t0)

        async def ack(job: Any) -> None:
            t1 = time.perf_counter()
            await driver.ack(job.id, AckOptions(fence=job.fence, result=None))
            ack_t.append(time.perf_counter() - t1)

        async with trio.open_nursery() as nursery:
            for job in got.jobs:
                nursery.start_soon(ack, job)
    return claim_t, ack_t


async def _explain_claim(driver: PostgresDriver, dsn: str, schema: str) -> str:
    """The claim statement's plan, with the driver's own text and parameters."""
    captured: dict[str, Any] = {}
    inner = driver.db.fetch

    async def fetch(sql: str, params: Any = None) -> Any:
        if "sql" not in captured and sql in (query("claim_ready"), query("claim")):
            captured.update(sql=sql, params=params)
        return await inner(sql, params)

    driver.db.fetch = fetch  # type: ignore[method-assign]
    try:
        await driver.claim(
            ClaimOptions(worker_id="bench-explain", queues={"default": 10}, visibility_timeout=60.0)
        )
    finally:
        driver.db.fetch = inner  # type: ignore[method-assign]
    rows = _sql(
        dsn,
        schema,
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + captured["sql"],
        captured["params"],
    )
    return "\n".join(r[0] for r in rows)


class LockWatch:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LockWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                ).fetchone()
                self.most = max(self.most, int(row[0]) if row else 0)
                self._stop.wait(0.05)


async def _purge_beside_claims(
    driver: PostgresDriver, dsn: str, purge_n: int, batch: int
) -> dict[str, Any]:
    """Make ``purge_n`` settled rows expired, purge them in the retention's batches
    while a claimer runs: the claim latencies during the purge."""
    from trio_jobs._retention import purge_expired

    now = driver.now()
    _sql(
        dsn,
        driver.schema,
        "UPDATE trio_jobs_jobs SET updated_at = %s WHERE id IN (SELECT id FROM trio_jobs_jobs "
        "WHERE state = 'done' LIMIT %s)",
        (now - 100 * 86400.0, purge_n),
    )
    claim_t: list[float] = []
    purged: list[int] = []
    purge_done = trio.Event()

    async def claimer() -> None:
        while not purge_done.is_set():
            c, _a = await _round(driver, 1, batch)
            claim_t.extend(c)

    async def purger() -> None:
        t0 = time.perf_counter()
        purged.append((await purge_expired(driver, now=now)).removed)
        purged.append(int((time.perf_counter() - t0) * 1000))
        purge_done.set()

    with LockWatch(dsn) as watch:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claimer)
            nursery.start_soon(purger)
    return {
        "purged": purged[0],
        "purge_ms": purged[1],
        "claims": len(claim_t),
        "claim_p50_ms": _pct(claim_t, 0.5) * 1e3,
        "claim_p99_ms": _pct(claim_t, 0.99) * 1e3,
        "lock_waiters_max": watch.most,
    }


async def _main(opts: argparse.Namespace, dsn: str) -> None:
    tag = uuid.uuid4().hex[:8]
    schemas = {"empty": f"bench_big_empty_{tag}", "big": f"bench_big_{tag}"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in schemas.values():
            conn.execute(f'CREATE SCHEMA "{s}"')
    drivers: dict[str, PostgresDriver] = {}
    try:
        for key, s in schemas.items():
            drivers[key] = await _open(dsn, s)
        now = drivers["big"].now()
        print(f"load before: {os.getloadavg()}", flush=True)
        t0 = time.perf_counter()
        # Enough ready rows for every round's claims, on both sides.
        ready = max(opts.ready, opts.rounds * opts.claims * opts.batch + 10_000)
        for s in schemas.values():
            _sql(dsn, s, READY_SQL, {"n": ready, "now": now})
        done_so_far = 0
        chunk = 1_000_000
        while done_so_far < opts.settled:
            n = min(chunk, opts.settled - done_so_far)
            _sql(dsn, schemas["big"], SETTLED_SQL, {"n": n, "now": now})
            done_so_far += n
            print(f"  settled rows: {done_so_far:,}", flush=True)
        for s in schemas.values():
            _sql(dsn, s, "VACUUM ANALYZE trio_jobs_jobs")
        size = _sql(
            dsn,
            schemas["big"],
            "SELECT pg_size_pretty(pg_total_relation_size('trio_jobs_jobs'))",
        )[0][0]
        print(f"generated in {time.perf_counter() - t0:.0f} s; big table {size}", flush=True)
        stats0 = {
            k: _sql(
                dsn,
                s,
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relid = 'trio_jobs_jobs'::regclass",
            )[0]
            for k, s in schemas.items()
        }
        # Warm both, then alternate rounds.
        for key in ("empty", "big"):
            await _round(drivers[key], 20, opts.batch)
        lat: dict[str, tuple[list[float], list[float]]] = {"empty": ([], []), "big": ([], [])}
        for i in range(opts.rounds):
            for key in ("empty", "big") if i % 2 == 0 else ("big", "empty"):
                c, a = await _round(drivers[key], opts.claims, opts.batch)
                lat[key][0].extend(c)
                lat[key][1].extend(a)
        print(f"load after rounds: {os.getloadavg()}")
        print()
        print("| table | claim p50 ms | claim p99 ms | ack p50 ms | ack p99 ms | HOT updates |")
        print("|---|---|---|---|---|---|")
        figures: dict[str, list[float]] = {}
        for key, s in schemas.items():
            c, a = lat[key]
            upd, hot = _sql(
                dsn,
                s,
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relid = 'trio_jobs_jobs'::regclass",
            )[0]
            d_upd, d_hot = upd - stats0[key][0], hot - stats0[key][1]
            figures[key] = [_pct(c, 0.5), _pct(c, 0.99), _pct(a, 0.5), _pct(a, 0.99)]
            label = "ready only" if key == "empty" else f"+ {opts.settled:,} settled"
            print(
                f"| {label} | "
                + " | ".join(f"{x * 1e3:.2f}" for x in figures[key])
                + f" | {d_hot}/{d_upd} ({d_hot / max(1, d_upd):.0%}) |"
            )
        ratio = [b / e for b, e in zip(figures["big"], figures["empty"], strict=True)]
        print("| big / empty | " + " | ".join(f"{r:.2f}x" for r in ratio) + " | |")
        print()
        for key, s in schemas.items():
            print(f"EXPLAIN (ANALYZE, BUFFERS) of the claim, {key}:")
            print(await _explain_claim(drivers[key], dsn, s))
            print()
        vac = _sql(
            dsn,
            schemas["big"],
            "SELECT n_live_tup, n_dead_tup, last_autovacuum, autovacuum_count, "
            "last_autoanalyze FROM pg_stat_user_tables WHERE relid = 'trio_jobs_jobs'::regclass",
        )[0]
        print(f"autovacuum on the big table after the rounds: {vac}")
        if opts.purge:
            got = await _purge_beside_claims(drivers["big"], dsn, opts.purge, opts.batch)
            print(f"purge beside a claimer: {got}")
        print(f"load at the end: {os.getloadavg()}")
    finally:
        for d in drivers.values():
            await d.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for s in schemas.values():
                conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks big-table")
    parser.add_argument("--settled", type=int, default=10_000_000)
    parser.add_argument("--ready", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--purge", type=int, default=200_000)
    opts = parser.parse_args(list(argv))
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        print("set DATABASE_URL to the server to measure", file=sys.stderr)
        return 2
    trio.run(_main, opts, dsn)
    return 0
