"""Many worker processes on one PostgreSQL: ``python -m benchmarks fleet``.

    python -m benchmarks fleet [--jobs 10000] [--processes 1,2,4,8,16,32]
                               [--concurrency 4] [--pool-size auto] [--pgbouncer]

For each process count N: a throwaway schema, ``--jobs`` no-op jobs enqueued
on a paused queue, ``trio-jobs worker --processes N`` started on it, and the run
timed from the queue's resume until the counters say every job is done. Beside
jobs/s it reports:

* the claim statement's p50/p99, timed in every worker process (the job module
  ``benchmarks._fleet_jobs`` wraps ``PostgresDriver.claim`` in the children
  when ``TJ_FLEET_CLAIMS`` names a folder, and each child writes its samples
  there as it exits);
* the rows a claim asked for and got, the rows an ``ack_many`` carried, and
  the claim and ack statements a job cost (counted the same way);
* the pool size each worker process was given (``--pool-size``; ``auto``, the
  default: the largest up to 4 with processes x (pool + 1) within the server's
  ``max_connections``, so 32 processes fit a server of 100 at 2);
* lock waits: ``pg_stat_activity`` sampled every 100 ms, the largest number of
  backends of the database waiting on a lock (``wait_event_type = 'Lock'``) and
  the share of samples with any;
* server connections: the largest count of the database's backends seen;
* the server's CPU share: CPU seconds of every PostgreSQL process on this
  machine over the run, over the CPU seconds the whole machine spent (from
  ``/proc``; the box is shared, so other work is in both);
* the run's own backends' CPU per job: the same, over the backends whose
  ``application_name`` is the run's (read at the end of the run; a backend that
  exited before is lost);
* WAL bytes per job: ``pg_current_wal_lsn()`` before and after, over the jobs
  (server-wide: another database's writes on a shared server count too).

``TJ_FLEET_PREFETCH_MAX=N`` in the environment sets the default prefetch's
ceiling (``trio_jobs._worker.PREFETCH_MAX``) in every worker process: an
experiment's knob (``benchmarks._fleet_jobs``).

``--pgbouncer`` runs the workers' ``dsn`` through a PgBouncer in transaction
mode started for the run (``tests/drivers/postgres/pgbouncer.py``), with
``--listen-database-url`` direct.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg.conninfo import make_conninfo

from trio_jobs import open_jobs
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._driver import conninfo_with_schema

from ._fleet_jobs import fleet_noop
from .postgres import HERE, Server

ENQUEUE_BATCH = 5_000


def _cpu_ticks() -> tuple[dict[int, float], float]:
    """(CPU seconds of each postgres process, CPU seconds the machine was busy)."""
    tick = os.sysconf("SC_CLK_TCK")
    pg: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name not in ("postgres", "postmaster"):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        pg[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    with open("/proc/stat", encoding="ascii") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    busy = sum(parts) - parts[3] - parts[4]  # minus idle and iowait
    return pg, busy / tick


def _pg_cpu(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds postgres spent between two :func:`_cpu_ticks` (a process that
    exited in between is lost: the workers' backends live through the run)."""
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


class Sampler:
    """``pg_stat_activity`` every 100 ms on a thread of its own."""

    def __init__(self, dsn: str, app: str) -> None:
        self.dsn = dsn
        self.app = app
        self.samples: list[tuple[int, int, int]] = []  # (backends, active, lock waits)
        #: What the lock waiters waited on and ran: "wait_event: statement start".
        self.waits: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*), count(*) FILTER (WHERE state = 'active'), "
                    "count(*) FILTER (WHERE wait_event_type = 'Lock') "
                    "FROM pg_stat_activity WHERE application_name = %s",
                    (self.app,),
                ).fetchone()
                assert row is not None
                self.samples.append((int(row[0]), int(row[1]), int(row[2])))
                if row[2]:
                    # The table whose row the waiter queues for: a row lock's
                    # queue is a tuple lock (held by the first waiter, awaited
                    # by the rest) naming the relation.
                    for event, table, text in conn.execute(
                        "SELECT a.wait_event, coalesce((SELECT min(l.relation::regclass::text) "
                        "FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'tuple'), '?'), "
                        "left(regexp_replace(a.query, '\\s+', ' ', 'g'), 50) "
                        "FROM pg_stat_activity a WHERE a.application_name = %s "
                        "AND a.wait_event_type = 'Lock'",
                        (self.app,),
                    ):
                        table = table.rsplit(".", 1)[-1]
                        self.waits[f"{event} on a row of {table}: {text}"] += 1
                self._stop.wait(0.1)


def _own_backends(conn: psycopg.Connection[Any], app: str) -> list[int]:
    """The pids of the run's own backends (its workers' application_name): their
    CPU alone is the run's, where the whole server's counts the neighbours' too.
    Asked on the run's open connection: a fleet sized to ``max_connections``
    leaves no room for another."""
    return [
        int(r[0])
        for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
        )
    ]


async def _prepare(dsn: str, n: int) -> None:
    async with open_jobs(postgres_driver(dsn, pool_size=2), jobs=[fleet_noop]) as jobs:
        await jobs.pause_queue("default")
        for start in range(0, n, ENQUEUE_BATCH):
            await fleet_noop.enqueue_many(range(start, min(n, start + ENQUEUE_BATCH)))
        await jobs.driver.db.fetch("ANALYZE trio_jobs_jobs")  # type: ignore[attr-defined]


async def _resume(dsn: str) -> None:
    async with open_jobs(postgres_driver(dsn, pool_size=1), jobs=[fleet_noop]) as jobs:
        await jobs.resume_queue("default")


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def pool_size_for(processes: int, max_connections: int, ceiling: int = 4) -> int:
    """The pool size a fleet of ``processes`` workers fits the server with: the
    largest up to ``ceiling`` with processes x (pool + 1) <= max_connections
    (docs/explanation/scaling.md's formula), at least 1."""
    return max(1, min(ceiling, max_connections // processes - 1))


def run_one(
    server: Server,
    dbname: str,
    n: int,
    processes: int,
    concurrency: int,
    bouncer: Any,
    pool_size: int,
) -> dict[str, Any]:
    with server.schema(dbname, "fleet") as schema:
        direct = conninfo_with_schema(server.dsn_for(dbname), schema)
        trio.run(_prepare, direct, n)
        # The workers' backends are told apart from the shared server's others
        # by their application_name (through PgBouncer too: it passes it on).
        app = f"tj-fleet-{schema}"[-60:]
        worker_dsn = make_conninfo(
            conninfo_with_schema(bouncer.dsn(), schema) if bouncer else direct,
            application_name=app,
        )
        listen_dsn = make_conninfo(direct, application_name=app)
        claims = Path(tempfile.mkdtemp(prefix="tj-fleet-claims-"))
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
            TJ_FLEET_CLAIMS=str(claims),
            TJ_FLEET_POOL_SIZE=str(pool_size),
        )
        env.pop("DATABASE_URL", None)
        log = claims / "worker.log"
        command = [
            sys.executable,
            "-m",
            "trio_jobs.cli",
            "worker",
            "benchmarks._fleet_jobs:JOBS",
            "--database-url",
            worker_dsn,
            "--processes",
            str(processes),
            "--concurrency",
            str(concurrency),
            "--no-purge",
        ]
        if bouncer:
            command += ["--listen-database-url", listen_dsn]
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                command, cwd=HERE.parent, env=env, stdout=subprocess.DEVNULL, stderr=err
            )
        try:
            deadline = time.monotonic() + 300
            while log.read_text("utf-8", "replace").count("jobs.worker.ready") < processes:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"workers did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)
            with Sampler(server.dsn_for(dbname), app) as sampler:
                pg0, box0 = _cpu_ticks()
                started = time.perf_counter()
                trio.run(_resume, direct)
                with psycopg.connect(direct, autocommit=True) as conn:
                    lsn0 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
                    while True:
                        row = conn.execute("SELECT sum(done) FROM trio_jobs_counters").fetchone()
                        if row and row[0] is not None and int(row[0]) >= n:
                            break
                        if time.perf_counter() - started > 900:
                            raise RuntimeError("the run did not finish in 15 min")
                        time.sleep(0.02)
                    finished = time.perf_counter()
                    wal = conn.execute(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn0[0],)
                    ).fetchone()
                    pg1, box1 = _cpu_ticks()
                    own = _own_backends(conn, app)
        finally:
            proc.terminate()
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        samples: list[float] = []
        pools: list[int] = []
        counts = [0, 0, 0, 0]  # claim rows asked, got; ack statements, rows
        for path in claims.glob("claims-*.json"):
            body = json.loads(path.read_text())
            samples += body["claims"]
            pools.append(int(body["pool"]))
            counts = [a + b for a, b in zip(counts, body["counts"], strict=True)]
        shutil.rmtree(claims, ignore_errors=True)
        rows = sampler.samples
        return {
            "processes": processes,
            "jobs_per_s": n / (finished - started),
            "claim_p50_ms": _pct(samples, 0.5) * 1e3,
            "claim_p99_ms": _pct(samples, 0.99) * 1e3,
            "claims": len(samples),
            "pool_size": pool_size,
            "claim_asked": counts[0] / max(1, len(samples)),
            "claim_rows": counts[1] / max(1, len(samples)),
            "ack_rows": counts[3] / max(1, counts[2]),
            "statements_per_job": (len(samples) + counts[2]) / n,
            "pool_max": max(pools, default=0),
            "lock_waits_max": max((r[2] for r in rows), default=0),
            "lock_wait_samples": sum(1 for r in rows if r[2]) / max(1, len(rows)),
            "connections_max": max((r[0] for r in rows), default=0),
            "active_median": statistics.median([r[1] for r in rows]) if rows else 0,
            "server_cpu_share": _pg_cpu(pg0, pg1) / max(1e-9, box1 - box0),
            "server_cpu_us_per_job": _pg_cpu(pg0, pg1) / n * 1e6,
            "own_cpu_us_per_job": sum(pg1.get(pid, 0.0) - pg0.get(pid, 0.0) for pid in own)
            / n
            * 1e6,
            "waits": sampler.waits.most_common(3),
            "wal_bytes_per_job": float(wal[0]) / n if wal else float("nan"),
        }


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks fleet")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--processes", default="1,2,4,8,16,32")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--pool-size",
        default="auto",
        help="each worker process's pool_size (auto: the largest up to 4 that fits "
        "processes x (pool + 1) within the server's max_connections)",
    )
    parser.add_argument("--pgbouncer", action="store_true")
    opts = parser.parse_args(list(argv))
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        print("set DATABASE_URL to the server to measure", file=sys.stderr)
        return 2
    server = Server(dsn)
    dbname = str(server.params.get("dbname") or "postgres")
    bouncer = None
    if opts.pgbouncer:
        sys.path.insert(0, str(HERE.parent / "tests" / "drivers" / "postgres"))
        from pgbouncer import Bouncer  # type: ignore[import-not-found]

        bouncer = Bouncer(dsn, settings={"default_pool_size": "20", "max_client_conn": "2000"})
        bouncer.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW max_connections").fetchone()
    max_connections = int(row[0]) if row else 100
    print(
        f"load before: {os.getloadavg()}; {opts.jobs} no-op jobs, concurrency "
        f"{opts.concurrency}; max_connections {max_connections}"
    )
    print(
        "| processes | pool size | jobs/s | claim p50 ms | claim p99 ms | rows/claim (asked) "
        "| rows/ack | statements/job | lock waits max (share) | connections max "
        "| pool max/process | server CPU share | server CPU us/job "
        "| own backends' CPU us/job | WAL bytes/job |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    waits: list[tuple[int, list[tuple[str, int]]]] = []
    try:
        for p in [int(x) for x in opts.processes.split(",")]:
            pool = (
                pool_size_for(p, max_connections)
                if opts.pool_size == "auto"
                else int(opts.pool_size)
            )
            r = run_one(server, dbname, opts.jobs, p, opts.concurrency, bouncer, pool)
            print(
                f"| {p} | {pool} | {r['jobs_per_s']:,.0f} | {r['claim_p50_ms']:.2f} | "
                f"{r['claim_p99_ms']:.2f} | {r['claim_rows']:.1f} ({r['claim_asked']:.1f}) | "
                f"{r['ack_rows']:.1f} | {r['statements_per_job']:.3f} | "
                f"{r['lock_waits_max']} ({r['lock_wait_samples']:.0%}) "
                f"| {r['connections_max']} | {r['pool_max']} | {r['server_cpu_share']:.0%} | "
                f"{r['server_cpu_us_per_job']:,.0f} | {r['own_cpu_us_per_job']:,.0f} | "
                f"{r['wal_bytes_per_job']:,.0f} |",
                flush=True,
            )
            waits.append((p, r["waits"]))
    finally:
        if bouncer is not None:
            bouncer.close()
    print(f"load after: {os.getloadavg()}")
    print("What the lock waiters waited on (samples):")
    for p, top in waits:
        for what, count in top:
            print(f"  {p} processes: {count} x {what}")
    return 0
