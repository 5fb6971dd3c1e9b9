"""PostgreSQL benchmarks: trio-jobs beside procrastinate and graphile-worker.

    python -m benchmarks postgres [--dsn DSN] [--runs 3] [--only PART ...] [--profile]

Everything runs in one invocation against one server (``--dsn``, else
``$DATABASE_URL``, else ``postgresql://postgres@127.0.0.1:5432/test``), so the
figures share the machine's state; the runs of the three systems are
interleaved round by round, so a noisy neighbour slows all of them alike. Every
part works in its own fresh database (``tjbench_<part>_<pid>``), each run in a
fresh schema of it, and drops them at the end.

Parts (``--only``), issue 3 item 10:

``throughput``
    End-to-end no-op jobs in one worker process: 20,000 jobs enqueued with
    ``enqueue_many`` (not timed), the table ANALYZEd (as autovacuum would after a
    bulk insert; every system gets the same), then one worker timed from its
    start until the last job is settled. trio-jobs over a concurrency sweep;
    procrastinate (pip) and graphile-worker (npm) likewise, each at its own
    settings (graphile-worker also with its documented batching).
``steps``
    trio-jobs jobs of three ``step.run`` each; procrastinate's nearest natural
    shape, a chain of three tasks each deferring the next.
``enqueue``
    A sequential loop of single ``enqueue`` calls beside ``pgbench`` inserting
    one row per transaction into a copy of the jobs table (1 client, prepared),
    in alternating 1 s slices (the ratio is the median of the slices' pairs);
    and ``enqueue_many`` of 1,000 for all three systems.
``enqueue_many``
    The ``enqueue_many`` rows of ``enqueue`` alone (not part of a full run).
``pickup``
    An idle trio-jobs worker; another process enqueues one job at a time, 300 ms
    apart; latency is the enqueue's commit to the body's start.
``idle``
    Statements an idle trio-jobs worker issues, counted at the driver's bridge
    (every statement and every BEGIN/COMMIT), over a shortened window scaled to
    a minute (pg_stat_statements is not preloaded on the benchmark server).
``idle_tasks``
    The same, for an idle worker serving 50 scheduled tasks (none due in the
    window): its scheduler leads them, renewing their leases in one statement.

procrastinate and graphile-worker are installed by this script only, under
``benchmarks/.work/`` (a venv, an npm prefix): never dependencies of trio-jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import platform
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trio_jobs import JobContext, Occurrence, Worker, job, open_jobs, task
from trio_jobs.drivers.postgres import postgres_driver

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"

#: Peers, pinned so a rerun measures the same code (override with the env vars).
PROCRASTINATE_SPEC = os.environ.get("BENCH_PROCRASTINATE", "procrastinate==3.10.0")
GRAPHILE_SPEC = os.environ.get("BENCH_GRAPHILE", "graphile-worker@0.17.3")

NOOP_JOBS = 20_000
STEP_JOBS = 10_000
#: procrastinate settles a few hundred jobs a second here: 20,000 would take
#: ~45 s a run, so its runs are shorter (its rate does not depend on N once the
#: table is analyzed: 504/s at 4,000 against 468/s at 20,000, measured).
PROCRASTINATE_JOBS = 4_000
PROCRASTINATE_CHAINS = 1_000
ENQUEUE_BATCH = 10_000

TJ_CONCURRENCY = (512, 1024, 2048)
#: The concurrencies also run with done_retention=0 (the ack deletes a done row).
TJ_UNKEPT_CONCURRENCY = (1024,)
TJ_STEP_CONCURRENCY = (128, 256, 512)
PROCRASTINATE_CONCURRENCY = (4, 16)
#: (concurrency, batched): graphile-worker's defaults, then its batching
#: (localQueue.size = concurrency, completeJobBatchDelay = 0).
#: The batched sweep runs to 1,024: on 2026-12-08 its best was at 256 to 512 (28k to 31k
#: jobs/s here), well past the 64 this table stopped at before.
GRAPHILE_CONFIGS = (
    (8, False),
    (32, False),
    (32, True),
    (64, True),
    (128, True),
    (256, True),
    (512, True),
    (1024, True),
)

SINGLE_ENQUEUE_SECONDS = 1.0
SINGLE_ENQUEUE_SLICES = 4
PICKUP_SAMPLES = 60
#: The first enqueues of a fresh pair of processes also pay psycopg's first
#: executions of the claim (planned each time until it prepares it, after 5):
#: not an idle worker's steady state, so they are sent but not counted.
PICKUP_WARMUP = 5
PICKUP_INTERVAL = 0.3
IDLE_WARMUP = 10.0
IDLE_WINDOW = 30.0

#: The multi-process comparison: N worker processes a side, at each of these
#: concurrencies a process; each side's best is its figure (graphile-worker's
#: batched setting: 64 alone until 2026-12-08, when 512 ran 45k jobs/s here).
PROCESSES = 2
PROC_TJ_CONCURRENCY = (512, 1024, 2048)
PROC_GW_CONCURRENCY = (64, 256, 512, 1024)

PARTS = (
    "throughput",
    "processes",
    "steps",
    "enqueue",
    "enqueue_many",
    "pickup",
    "idle",
    "idle_tasks",
)
#: The scheduled tasks ``idle_tasks`` serves: none falls due in its window.
IDLE_TASKS = 50


# --------------------------------------------------------------------------- the jobs

#: What `trio-jobs worker benchmarks.postgres:PROC_JOBS` serves (the processes part).
PROC_JOBS: list[Any] = []


@job(input=int, idempotency_key=lambda i: f"noop:{i}", name="bench.pg.noop")
async def pg_noop(ctx: JobContext[int]) -> None:
    """Does nothing: the cost of the queue and the worker alone."""
    return None


def _const(value: int) -> Callable[[], int]:
    return lambda: value


STEP_NAMES = ("step-0", "step-1", "step-2")


@job(input=int, idempotency_key=lambda i: f"steps3:{i}", name="bench.pg.steps3")
async def pg_steps3(ctx: JobContext[int]) -> None:
    """Three memoized steps: three durable step records, group-committed."""
    for k, name in enumerate(STEP_NAMES):
        await ctx.step.run(name, _const(k))


_pickup_started: dict[int, float] = {}


@job(input=int, idempotency_key=lambda i: f"pickup:{i}", name="bench.pg.pickup")
async def pg_pickup(ctx: JobContext[int]) -> None:
    """Notes when its body started (the pickup-latency benchmark)."""
    _pickup_started[ctx.input] = time.perf_counter()


# --------------------------------------------------------------------------- the server


class Server:
    """Fresh databases and schemas on the benchmark's server, dropped afterwards."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.params = conninfo_to_dict(dsn)

    def dsn_for(self, dbname: str, schema: str | None = None) -> str:
        params = dict(self.params)
        params["dbname"] = dbname
        if schema is not None:
            options = str(params.get("options") or "")
            params["options"] = f"{options} -c search_path={schema}".strip()
        return make_conninfo("", **params)

    def uri_for(self, dbname: str) -> str:
        """A ``postgresql://`` URI (node's pg takes no libpq key=value string)."""
        from urllib.parse import quote

        p = self.params
        auth = quote(str(p.get("user") or ""), safe="")
        if p.get("password"):
            auth += ":" + quote(str(p["password"]), safe="")
        host = str(p.get("host") or "localhost")
        port = f":{p['port']}" if p.get("port") else ""
        return f"postgresql://{auth + '@' if auth else ''}{host}{port}/{quote(dbname, safe='')}"

    def admin(self, dbname: str | None = None) -> psycopg.Connection[Any]:
        target = self.dsn if dbname is None else self.dsn_for(dbname)
        return psycopg.connect(target, autocommit=True)

    @contextlib.contextmanager
    def database(self, part: str) -> Iterator[str]:
        name = f"tjbench_{part}_{os.getpid()}"
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name
        finally:
            with self.admin() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextlib.contextmanager
    def schema(self, dbname: str, prefix: str = "run") -> Iterator[str]:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with self.admin(dbname) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        try:
            yield name
        finally:
            with self.admin(dbname) as conn:
                conn.execute("SET client_min_messages = warning")
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    def execute(self, dbname: str, sql: str) -> list[tuple[Any, ...]]:
        with self.admin(dbname) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def describe(self) -> str:
        with self.admin() as conn:
            version = conn.execute("SHOW server_version").fetchone()
            rows = conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'wal_sync_method', 'shared_buffers', "
                "'max_connections') ORDER BY name"
            ).fetchall()
        settings = ", ".join(f"{k}={v}" for k, v in rows)
        host = self.params.get("host", "local socket")
        return f"PostgreSQL {version[0] if version else '?'} on {host} ({settings})"


# --------------------------------------------------------------------------- results


@attrs.frozen
class Sample:
    """One system, one configuration: its runs' figures."""

    system: str
    measure: str
    config: str
    unit: str
    values: Sequence[float]
    higher_is_better: bool = True
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values)


def _best(samples: Sequence[Sample]) -> Sample | None:
    if not samples:
        return None
    if samples[0].higher_is_better:
        return max(samples, key=lambda s: s.median)
    return min(samples, key=lambda s: s.median)


def _fmt(value: float, unit: str) -> str:
    if unit in ("ms", "x"):
        return f"{value:,.2f}"
    return f"{value:,.0f}"


# --------------------------------------------------------------------------- trio-jobs


class _Settles:
    """Counts landed acks on one driver instance; notes when the N-th landed."""

    def __init__(self, driver: Any, target: int) -> None:
        self.target = target
        self.acked = 0
        self.done = trio.Event()
        self.finished_at = 0.0
        inner = driver.ack

        async def ack(job_id: str, options: Any) -> bool:
            landed: bool = await inner(job_id, options)
            if landed:
                self.acked += 1
                if self.acked == self.target:  # (one ack a call)
                    self.finished_at = time.perf_counter()
                    self.done.set()
            return landed

        driver.ack = ack
        batches = getattr(driver, "acks", None)  # (an older tree A/B: none)
        if batches is not None:  # the worker's ack pipeline: a batch per call
            inner_many = batches.ack_many

            async def ack_many(acks: Any) -> list[bool]:
                answers: list[bool] = await inner_many(acks)
                landed = sum(answers)
                if landed:
                    before = self.acked
                    self.acked += landed
                    if before < self.target <= self.acked:
                        self.finished_at = time.perf_counter()
                        self.done.set()
                return answers

            batches.ack_many = ack_many


async def _enqueue_all(handle: Any, n: int) -> None:
    for start in range(0, n, ENQUEUE_BATCH):
        await handle.enqueue_many(range(start, min(n, start + ENQUEUE_BATCH)))


#: CPU per job of the last trio-jobs throughput run (µs): the worker process and
#: the PostgreSQL backends serving its database (read from /proc when the
#: server runs on this machine; None otherwise).
LAST_CPU: dict[str, float | None] = {"worker": None, "server": None}
#: The same for the last graphile-worker processes run (``gw_processes``): the
#: PostgreSQL backends serving its pools, from the go until no job row is left.
LAST_GW_CPU: dict[str, float | None] = {"server": None}


def _backend_cpu(server: Server, dbname: str) -> dict[int, float] | None:
    """CPU seconds so far of each backend connected to ``dbname`` (local server only)."""
    if str(server.params.get("host", "")) not in ("127.0.0.1", "localhost", "::1", ""):
        return None
    with server.admin() as conn:
        pids = [
            r[0]
            for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (dbname,))
        ]
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None  # not this machine's process table
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


async def _tj_throughput_once(
    server: Server,
    dbname: str,
    schema: str,
    handle: Any,
    n: int,
    concurrency: int,
    profiler: cProfile.Profile | None = None,
    unkept: bool = False,
) -> float:
    # unkept: done_retention=0, the ack deletes a done row (graphile-worker's own way)
    driver = postgres_driver(
        server.dsn_for(dbname), schema=schema, done_retention=0 if unkept else None
    )
    async with open_jobs(driver, jobs=[handle]) as jobs:
        await _enqueue_all(handle, n)
        await driver.db.fetch("ANALYZE trio_jobs_jobs")
        settles = _Settles(driver, n)
        worker = Worker(jobs, concurrency=concurrency)
        gc.collect()
        if profiler is not None:
            profiler.enable()  # the worker's run only, not the enqueue before it
        before = await trio.to_thread.run_sync(_backend_cpu, server, dbname)
        async with trio.open_nursery() as nursery:
            cpu0 = time.process_time()
            started = time.perf_counter()
            await nursery.start(worker.run)
            with trio.fail_after(600):
                await settles.done.wait()
            elapsed = settles.finished_at - started
            cpu = time.process_time() - cpu0
            if profiler is not None:
                profiler.disable()
            after = await trio.to_thread.run_sync(_backend_cpu, server, dbname)
            await worker.drain()
        LAST_CPU["worker"] = cpu / n * 1e6
        LAST_CPU["server"] = (
            sum(v - before.get(pid, 0.0) for pid, v in after.items()) / n * 1e6
            if before is not None and after is not None
            else None
        )
        if unkept:
            left = (await driver.db.fetch("SELECT count(*) FROM trio_jobs_jobs"))[0][0]
            done = sum(r.done for r in await jobs.driver.introspect.counters(None, 0.0))
            if left or done != n:
                raise RuntimeError(f"trio-jobs: {left} rows left, {done} of {n} counted done")
        else:
            done = sum(s.done for s in await jobs.stats())
            if done != n:
                raise RuntimeError(f"trio-jobs: expected {n} done rows, found {done}")
    return n / elapsed


PROC_JOBS.append(pg_noop)


async def _tj_prepare_paused(dsn: str, n: int) -> None:
    """Migrate, pause the queue, enqueue ``n`` no-op jobs, ANALYZE: the workers
    start on a paused queue and the run is timed from its resume."""
    driver = postgres_driver(dsn)
    async with open_jobs(driver, jobs=[pg_noop]) as jobs:
        await jobs.pause_queue("default")
        await _enqueue_all(pg_noop, n)
        await driver.db.fetch("ANALYZE trio_jobs_jobs")


async def _tj_resume(dsn: str) -> None:
    async with open_jobs(postgres_driver(dsn), jobs=[pg_noop]) as jobs:
        await jobs.resume_queue("default")


def _poll(
    dsn: str,
    sql: str,
    done: Callable[[int], bool],
    timeout: float = 600,
    *,
    at_end: Callable[[int], None] | None = None,
) -> float:
    """Run ``sql`` (one count) every 5 ms until ``done(count)``; answer when (perf_counter).
    ``at_end(pid)``, when given, is called once done, with the poll's own backend pid
    (a CPU reading taken there can leave the poll out)."""
    deadline = time.perf_counter() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(sql).fetchone()
            now = time.perf_counter()
            if done(int(row[0] if row and row[0] is not None else 0)):
                if at_end is not None:
                    at_end(conn.info.backend_pid)
                return now
            if now > deadline:
                raise RuntimeError(f"timed out polling {sql!r}")
            time.sleep(0.005)


def tj_processes(server: Server, dbname: str, n: int, processes: int, concurrency: int) -> float:
    """``trio-jobs worker --processes N`` over ``n`` no-op jobs: the supervisor and
    its children start on a paused queue; timed from the resume until the
    counters say ``n`` done."""
    from trio_jobs.drivers.postgres._driver import conninfo_with_schema

    with server.schema(dbname, "tjp") as schema:
        dsn = conninfo_with_schema(server.dsn_for(dbname), schema)
        trio.run(_tj_prepare_paused, dsn, n)
        log = WORK / f"tj-processes-{schema}.log"
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
        )
        env.pop("DATABASE_URL", None)
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trio_jobs.cli",
                    "worker",
                    "benchmarks.postgres:PROC_JOBS",
                    "--database-url",
                    dsn,
                    "--processes",
                    str(processes),
                    "--concurrency",
                    str(concurrency),
                    "--no-purge",
                ],
                cwd=HERE.parent,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            deadline = time.monotonic() + 120
            while log.read_text("utf-8", "replace").count("jobs.worker.ready") < processes:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"trio-jobs workers did not start:\n{log.read_text()}")
                time.sleep(0.05)
            started = time.perf_counter()
            trio.run(_tj_resume, dsn)
            finished = _poll(
                dsn, "SELECT sum(done) FROM trio_jobs_counters", lambda done: done >= n
            )
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.unlink(missing_ok=True)
        return n / (finished - started)


def _cpu_summary(runs: Sequence[dict[str, float | None]]) -> str:
    """The CPU per job of a configuration's runs (medians), for its row."""
    workers = [r["worker"] for r in runs if r["worker"] is not None]
    servers = [r["server"] for r in runs if r["server"] is not None]
    if not workers:
        return ""
    text = f"; CPU per job: worker {statistics.median(workers):.0f} µs"
    if servers:
        text += f", PostgreSQL {statistics.median(servers):.0f} µs"
    return text


def _cpu_note() -> str:
    w, srv = LAST_CPU["worker"], LAST_CPU["server"]
    if w is None:
        return ""
    text = f" (worker {w:.0f} µs CPU/job"
    if srv is not None:
        text += f", PostgreSQL {srv:.0f} µs CPU/job: one core of it serves {1e6 / srv:,.0f} jobs/s"
    return text + ")"


def tj_throughput(
    server: Server,
    dbname: str,
    handle: Any,
    n: int,
    concurrency: int,
    *,
    profile: bool = False,
    unkept: bool = False,
) -> float:
    with server.schema(dbname, "tj") as schema:
        if not profile:
            return trio.run(
                _tj_throughput_once, server, dbname, schema, handle, n, concurrency, None, unkept
            )
        profiler = cProfile.Profile()
        try:
            return trio.run(
                _tj_throughput_once, server, dbname, schema, handle, n, concurrency, profiler
            )
        finally:
            _print_profile(profiler, f"{handle.name}, {n:,} jobs, concurrency {concurrency}")


async def _tj_migrate(dsn: str, schema: str) -> None:
    async with open_jobs(postgres_driver(dsn, schema=schema)):
        pass


async def _tj_single_enqueue_once(dsn: str, schema: str, seconds: float, base: int) -> float:
    """Sequential ``enqueue`` calls for ``seconds``; inputs from ``base`` up, so every
    call inserts a row (a slice reusing another's keys would measure dedupes)."""
    async with open_jobs(postgres_driver(dsn, schema=schema), jobs=[pg_noop]):
        for i in range(20):  # warm the pool and psycopg's prepared statement
            await pg_noop.enqueue(base + i)
        count = 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            await pg_noop.enqueue(base + 20 + count)
            count += 1
        return count / (time.perf_counter() - started)


async def _tj_enqueue_many_once(dsn: str, schema: str, samples: int) -> list[float]:
    out: list[float] = []
    async with open_jobs(postgres_driver(dsn, schema=schema), jobs=[pg_noop]):
        for k in range(samples + 3):
            inputs = range(k * 1000, (k + 1) * 1000)
            started = time.perf_counter()
            await pg_noop.enqueue_many(inputs)
            out.append((time.perf_counter() - started) * 1000.0)
    return out[3:]


async def _tj_pickup_once(dsn: str, schema: str, samples: int, interval: float) -> list[float]:
    _pickup_started.clear()
    driver = postgres_driver(dsn, schema=schema)
    async with open_jobs(driver, jobs=[pg_pickup]) as jobs:
        worker = Worker(jobs, concurrency=8)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            wake = driver.wake
            with trio.fail_after(10):
                while wake is None or not wake.live:  # noqa: ASYNC110 — the probe's round trip
                    await trio.sleep(0.01)
            proc = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "benchmarks._pg_enqueuer",
                    dsn,
                    schema,
                    str(PICKUP_WARMUP + samples),
                    str(interval),
                ],
                capture_stdout=True,
                cwd=str(HERE.parent),
            )
            committed = {
                int(i): float(t)
                for i, t in (line.split() for line in proc.stdout.decode().split("\n") if line)
            }
            with trio.fail_after(10):
                while len(_pickup_started) < PICKUP_WARMUP + samples:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            await worker.drain()
    counted = sorted(committed)[PICKUP_WARMUP:]
    return [(_pickup_started[i] - committed[i]) * 1000.0 for i in counted]


class _StatementCounter:
    """Counts what crosses the bridge: every statement (``_run``, and ``_run_text``
    for the statements sent straight through libpq) and every connection-level
    ``execute`` (BEGIN, COMMIT, LISTEN)."""

    def __init__(self) -> None:
        self.statements = 0
        self.active = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from trio_jobs.drivers.postgres import _bridge

        run, run_text = _bridge._run, _bridge._run_text
        conn_execute = _bridge.TrioConnection.execute

        async def counted_run(conn: Any, sql: str, params: Any) -> Any:
            if self.active:
                self.statements += 1
            return await run(conn, sql, params)

        async def counted_run_text(conn: Any, sql: str, params: Any, *, prepare: bool) -> Any:
            if self.active:
                self.statements += 1
            return await run_text(conn, sql, params, prepare=prepare)

        async def counted_execute(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.statements += 1
            return await conn_execute(conn, *args, **kwargs)

        bridge: Any = _bridge
        bridge._run = counted_run
        bridge._run_text = counted_run_text
        bridge.TrioConnection.execute = counted_execute
        try:
            yield
        finally:
            bridge._run = run
            bridge._run_text = run_text
            bridge.TrioConnection.execute = conn_execute


def _idle_tasks(n: int) -> list[Any]:
    """``n`` tasks due at noon on the first of January, UTC: idle in any window."""

    async def body(ctx: JobContext[Occurrence]) -> None:
        return None

    return [task(cron=f"{i % 60} 12 1 1 *", name=f"bench.idle.{i}")(body) for i in range(n)]


async def _tj_idle_once(
    server: Server, dbname: str, schema: str, warmup: float, window: float, tasks: int = 0
) -> tuple[float, dict[str, float]]:
    """Answers the statements per minute, and the named queries among them.

    (The server's own counter, ``pg_stat_database.xact_commit``, is no check here:
    it counts autovacuum's transactions and publishes a backend's counts up to
    10 s late.)"""
    counter = _StatementCounter()
    named: dict[str, int] = {}
    with counter.installed():
        driver = postgres_driver(server.dsn_for(dbname), schema=schema)
        async with open_jobs(driver, jobs=[pg_noop, *_idle_tasks(tasks)]) as jobs:
            inner_fetch = driver._fetch

            async def fetch(name: str, params: Any) -> Any:
                if counter.active:
                    named[name] = named.get(name, 0) + 1
                return await inner_fetch(name, params)

            driver._fetch = fetch  # type: ignore[method-assign]
            worker = Worker(jobs)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await trio.sleep(warmup)  # the poll backs off to its ceiling
                counter.active = True
                await trio.sleep(window)
                counter.active = False
                await worker.drain()
    scale = 60.0 / window
    return counter.statements * scale, {k: v * scale for k, v in sorted(named.items())}


# --------------------------------------------------------------------------- pgbench


PGBENCH_SCRIPT = """\
INSERT INTO pgbench_jobs (id, run_id, name, queue, payload, idempotency_key, max_attempts,
    state, run_at, created_at, updated_at)
VALUES (gen_random_uuid(), gen_random_uuid(), 'bench.pg.noop', 'default', '1',
    gen_random_uuid()::text, 3, 'ready', extract(epoch FROM clock_timestamp()),
    extract(epoch FROM clock_timestamp()), extract(epoch FROM clock_timestamp()));
"""


def pgbench_version() -> str:
    exe = shutil.which("pgbench")
    if exe is None:
        return "missing"
    return subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()


def pgbench_insert(server: Server, dbname: str, schema: str, seconds: float) -> float:
    """pgbench, 1 client, prepared protocol: one single-row INSERT per transaction
    into ``pgbench_jobs``, a copy of trio-jobs' jobs table with all its indexes."""
    exe = shutil.which("pgbench")
    if exe is None:
        raise RuntimeError("pgbench is missing: apt-get install postgresql-client")
    script = WORK / "pgbench_insert.sql"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(PGBENCH_SCRIPT)
    p = server.params
    env = dict(os.environ, PGOPTIONS=f"-c search_path={schema}")
    if p.get("password"):
        env["PGPASSWORD"] = str(p["password"])
    cmd = [exe, "-n", "-c", "1", "-M", "prepared", "-T", str(int(seconds)), "-f", str(script)]
    for flag, key in (("-h", "host"), ("-p", "port"), ("-U", "user")):
        if p.get(key):
            cmd += [flag, str(p[key])]
    cmd.append(dbname)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    match = re.search(r"tps = ([0-9.]+)", out)
    if match is None:
        raise RuntimeError(f"could not read pgbench's tps from: {out}")
    return float(match.group(1))


# --------------------------------------------------------------------------- the peers


def _run_json(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 300
) -> Any:
    proc = subprocess.run(
        list(cmd), capture_output=True, text=True, env=env, timeout=timeout, cwd=str(HERE)
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(
            f"{cmd[0]} printed no result: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
        )
    return json.loads(lines[-1])


class Procrastinate:
    """procrastinate in its own venv under ``benchmarks/.work/``."""

    def __init__(self) -> None:
        self.venv = WORK / "procrastinate-venv"
        self.python = self.venv / "bin" / "python"
        self.version = "?"

    def install(self) -> None:
        marker = self.venv / ".installed"
        if not (marker.exists() and marker.read_text() == PROCRASTINATE_SPEC):
            print(f"installing {PROCRASTINATE_SPEC} into {self.venv} ...", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(self.venv)], check=True)
            subprocess.run(
                [str(self.python), "-m", "pip", "install", "-q", PROCRASTINATE_SPEC], check=True
            )
            marker.write_text(PROCRASTINATE_SPEC)
        self.version = subprocess.run(
            [
                str(self.python),
                "-c",
                "import importlib.metadata as m; print(m.version('procrastinate'))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    def run(self, server: Server, dbname: str, schema: str, **spec: Any) -> Any:
        spec = {"dsn": server.dsn_for(dbname), "schema": schema, **spec}
        return _run_json([str(self.python), str(HERE / "_peer_procrastinate.py"), json.dumps(spec)])


class Graphile:
    """graphile-worker in an npm prefix under ``benchmarks/.work/``."""

    def __init__(self) -> None:
        self.prefix = WORK / "graphile"
        self.version = "?"

    def install(self) -> None:
        marker = self.prefix / ".installed"
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            raise RuntimeError("node and npm are needed for the graphile-worker benchmark")
        if not (marker.exists() and marker.read_text() == GRAPHILE_SPEC):
            print(f"installing {GRAPHILE_SPEC} into {self.prefix} ...", file=sys.stderr)
            self.prefix.mkdir(parents=True, exist_ok=True)
            (self.prefix / "package.json").write_text('{"private": true}\n')
            subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--silent", GRAPHILE_SPEC],
                cwd=self.prefix,
                check=True,
            )
            marker.write_text(GRAPHILE_SPEC)
        package = self.prefix / "node_modules" / "graphile-worker" / "package.json"
        self.version = json.loads(package.read_text())["version"]

    def run(self, server: Server, dbname: str, schema: str, **spec: Any) -> Any:
        spec = {"dsn": server.uri_for(dbname), "schema": schema, **spec}
        env = dict(os.environ, NODE_PATH=str(self.prefix / "node_modules"))
        env.pop("GRAPHILE_LOGGER_DEBUG", None)
        node = shutil.which("node") or "node"
        return _run_json([node, str(HERE / "_peer_graphile.cjs"), json.dumps(spec)], env=env)


def gw_processes(
    graphile: Graphile, server: Server, dbname: str, n: int, processes: int, concurrency: int
) -> float:
    """N graphile-worker processes (batched, its best setting) over ``n`` no-op
    jobs: each connects, then waits for a go on stdin; timed from the go until
    no job row is left (graphile-worker deletes a row when it completes)."""
    with server.schema(dbname, "gwp") as schema:
        graphile.run(server, dbname, schema, workload="prepare", jobs=n)
        spec = {
            "dsn": server.uri_for(dbname),
            "schema": schema,
            "workload": "serve",
            "concurrency": concurrency,
            "batched": True,
        }
        env = dict(os.environ, NODE_PATH=str(graphile.prefix / "node_modules"))
        node = shutil.which("node") or "node"
        procs = [
            subprocess.Popen(
                [node, str(HERE / "_peer_graphile.cjs"), json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            for _ in range(processes)
        ]
        try:
            for p in procs:
                assert p.stdout is not None
                line = p.stdout.readline()
                if b"ready" not in line:
                    raise RuntimeError(f"graphile-worker did not start: {line!r}")
            before = _backend_cpu(server, dbname)
            after: dict[int, float] | None = None
            poller: list[int] = []

            def at_end(pid: int) -> None:
                nonlocal after
                poller.append(pid)
                after = _backend_cpu(server, dbname)

            started = time.perf_counter()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(b"go\n")
                p.stdin.flush()
            finished = _poll(
                server.dsn_for(dbname),
                f'SELECT count(*) FROM "{schema}"._private_jobs',
                lambda left: left == 0,
                at_end=at_end,
            )
            # graphile-worker's backends, the poll's own left out
            LAST_GW_CPU["server"] = (
                sum(v - before.get(pid, 0.0) for pid, v in after.items() if pid not in poller)
                / n
                * 1e6
                if before is not None and after is not None
                else None
            )
        finally:
            for p in procs:
                p.kill()
                p.wait()
        return n / (finished - started)


def node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "missing"
    return subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()


# --------------------------------------------------------------------------- the parts


class Bench:
    def __init__(self, server: Server, runs: int, systems: set[str]) -> None:
        self.server = server
        self.runs = runs
        self.systems = systems
        self.samples: list[Sample] = []
        self.procrastinate = Procrastinate()
        self.graphile = Graphile()

    def log(self, text: str) -> None:
        print(f"  {text}", file=sys.stderr, flush=True)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        vals = ", ".join(_fmt(v, sample.unit) for v in sample.values)
        self.log(f"{sample.system} {sample.measure} [{sample.config}]: {vals} {sample.unit}")

    # -- throughput

    def throughput(self) -> None:
        tj: dict[int, list[float]] = {c: [] for c in TJ_CONCURRENCY}
        cpu: dict[int, list[dict[str, float | None]]] = {c: [] for c in TJ_CONCURRENCY}
        unkept: dict[int, list[float]] = {c: [] for c in TJ_UNKEPT_CONCURRENCY}
        unkept_cpu: dict[int, list[dict[str, float | None]]] = {
            c: [] for c in TJ_UNKEPT_CONCURRENCY
        }
        gw: dict[tuple[int, bool], list[float]] = {c: [] for c in GRAPHILE_CONFIGS}
        pq: dict[int, list[float]] = {c: [] for c in PROCRASTINATE_CONCURRENCY}
        with self.server.database("noop") as db:
            for r in range(self.runs):
                self.log(f"no-op round {r + 1}/{self.runs}")
                if "trio-jobs" in self.systems:
                    for c in TJ_CONCURRENCY:
                        tj[c].append(tj_throughput(self.server, db, pg_noop, NOOP_JOBS, c))
                        cpu[c].append(dict(LAST_CPU))
                        self.log(f"trio-jobs concurrency {c}: {tj[c][-1]:,.0f} jobs/s{_cpu_note()}")
                    for c in TJ_UNKEPT_CONCURRENCY:
                        rate = tj_throughput(self.server, db, pg_noop, NOOP_JOBS, c, unkept=True)
                        unkept[c].append(rate)
                        unkept_cpu[c].append(dict(LAST_CPU))
                        self.log(
                            f"trio-jobs done_retention=0 concurrency {c}: {rate:,.0f} jobs/s"
                            f"{_cpu_note()}"
                        )
                if "graphile-worker" in self.systems:
                    for conc, batched in GRAPHILE_CONFIGS:
                        with self.server.schema(db, "gw") as schema:
                            out = self.graphile.run(
                                self.server,
                                db,
                                schema,
                                workload="noop",
                                jobs=NOOP_JOBS,
                                concurrency=conc,
                                batched=batched,
                            )
                        gw[(conc, batched)].append(float(out["rate"]))
                        self.log(
                            f"graphile-worker {conc} batched={batched}: {out['rate']:,.0f} jobs/s"
                        )
                if "procrastinate" in self.systems:
                    for c in PROCRASTINATE_CONCURRENCY:
                        with self.server.schema(db, "pq") as schema:
                            out = self.procrastinate.run(
                                self.server,
                                db,
                                schema,
                                workload="noop",
                                jobs=PROCRASTINATE_JOBS,
                                concurrency=c,
                            )
                        pq[c].append(float(out["rate"]))
                        self.log(f"procrastinate concurrency {c}: {out['rate']:,.0f} jobs/s")
        for c, values in tj.items():
            if values:
                self.add(
                    Sample(
                        "trio-jobs",
                        "noop",
                        f"concurrency {c} (max_in_flight unset), pool 10, {NOOP_JOBS:,} jobs"
                        + _cpu_summary(cpu[c]),
                        "jobs/s",
                        values,
                    )
                )
        for c, values in unkept.items():
            if values:
                self.add(
                    Sample(
                        "trio-jobs",
                        "noop-unkept",
                        f"done_retention=0 (done rows not kept: graphile-worker's own behaviour),"
                        f" concurrency {c}, pool 10, {NOOP_JOBS:,} jobs"
                        + _cpu_summary(unkept_cpu[c]),
                        "jobs/s",
                        values,
                        note="done rows not kept",
                    )
                )
        for (c, batched), values in gw.items():
            if values:
                how = (
                    f"localQueue {c}, completeJobBatchDelay 0"
                    if batched
                    else "no batching (default)"
                )
                self.add(
                    Sample(
                        "graphile-worker",
                        "noop",
                        f"concurrency {c}, {how}, {NOOP_JOBS:,} jobs",
                        "jobs/s",
                        values,
                        note="batched" if batched else "default",
                    )
                )
        for c, values in pq.items():
            if values:
                self.add(
                    Sample(
                        "procrastinate",
                        "noop",
                        f"concurrency {c}, {PROCRASTINATE_JOBS:,} jobs",
                        "jobs/s",
                        values,
                    )
                )

    # -- processes

    def processes(self) -> None:
        tj: dict[int, list[float]] = {c: [] for c in PROC_TJ_CONCURRENCY}
        gw: dict[int, list[float]] = {c: [] for c in PROC_GW_CONCURRENCY}
        with self.server.database("procs") as db:
            for r in range(self.runs):
                self.log(f"{PROCESSES}-process round {r + 1}/{self.runs}")
                if "trio-jobs" in self.systems:
                    for c in PROC_TJ_CONCURRENCY:
                        tj[c].append(tj_processes(self.server, db, NOOP_JOBS, PROCESSES, c))
                        self.log(
                            f"trio-jobs --processes {PROCESSES} --concurrency {c}: "
                            f"{tj[c][-1]:,.0f} jobs/s"
                        )
                if "graphile-worker" in self.systems:
                    for c in PROC_GW_CONCURRENCY:
                        gw[c].append(
                            gw_processes(self.graphile, self.server, db, NOOP_JOBS, PROCESSES, c)
                        )
                        gcpu = LAST_GW_CPU["server"]
                        note = f" (PostgreSQL {gcpu:.0f} µs CPU/job)" if gcpu is not None else ""
                        self.log(
                            f"graphile-worker x{PROCESSES} concurrency {c}: "
                            f"{gw[c][-1]:,.0f} jobs/s{note}"
                        )
        for c, values in tj.items():
            if values:
                self.add(
                    Sample(
                        "trio-jobs",
                        "noop-processes",
                        f"`trio-jobs worker --processes {PROCESSES} --concurrency "
                        f"{c}`, {NOOP_JOBS:,} jobs, from the queue's resume",
                        "jobs/s",
                        values,
                    )
                )
        for c, values in gw.items():
            if values:
                self.add(
                    Sample(
                        "graphile-worker",
                        "noop-processes",
                        f"{PROCESSES} processes, concurrency {c}, localQueue "
                        f"{c}, completeJobBatchDelay 0, {NOOP_JOBS:,} jobs, from the go",
                        "jobs/s",
                        values,
                    )
                )

    # -- steps

    def steps(self) -> None:
        tj: dict[int, list[float]] = {c: [] for c in TJ_STEP_CONCURRENCY}
        cpu: dict[int, list[dict[str, float | None]]] = {c: [] for c in TJ_STEP_CONCURRENCY}
        pq: list[float] = []
        with self.server.database("steps") as db:
            for r in range(self.runs):
                self.log(f"3-step round {r + 1}/{self.runs}")
                if "trio-jobs" in self.systems:
                    for c in TJ_STEP_CONCURRENCY:
                        tj[c].append(tj_throughput(self.server, db, pg_steps3, STEP_JOBS, c))
                        cpu[c].append(dict(LAST_CPU))
                        self.log(
                            f"trio-jobs 3-step concurrency {c}: {tj[c][-1]:,.0f} jobs/s{_cpu_note()}"
                        )
                if "procrastinate" in self.systems:
                    with self.server.schema(db, "pq") as schema:
                        out = self.procrastinate.run(
                            self.server,
                            db,
                            schema,
                            workload="chain3",
                            jobs=PROCRASTINATE_CHAINS,
                            concurrency=16,
                        )
                    pq.append(float(out["rate"]))
                    self.log(f"procrastinate chain3: {out['rate']:,.0f} workflows/s")
        for c, values in tj.items():
            if values:
                self.add(
                    Sample(
                        "trio-jobs",
                        "steps3",
                        f"concurrency {c}, {STEP_JOBS:,} jobs of 3 steps" + _cpu_summary(cpu[c]),
                        "jobs/s",
                        values,
                    )
                )
        if pq:
            self.add(
                Sample(
                    "procrastinate",
                    "steps3",
                    f"chain of 3 tasks, concurrency 16, {PROCRASTINATE_CHAINS:,} chains",
                    "chains/s",
                    pq,
                    note="no durable steps: a chain of three deferred tasks",
                )
            )

    # -- enqueue

    def enqueue(self) -> None:
        tj: list[float] = []
        bench: list[float] = []
        with self.server.database("enqueue") as db:
            for r in range(self.runs):
                self.log(f"single-enqueue round {r + 1}/{self.runs}")
                with self.server.schema(db, "tj") as schema:
                    trio.run(_tj_migrate, self.server.dsn_for(db), schema)
                    # pgbench's table: trio-jobs' jobs table, its indexes included.
                    self.server.execute(
                        db,
                        f'CREATE TABLE "{schema}".pgbench_jobs '
                        f'(LIKE "{schema}".trio_jobs_jobs INCLUDING ALL)',
                    )
                    for k in range(SINGLE_ENQUEUE_SLICES):
                        tj.append(
                            trio.run(
                                _tj_single_enqueue_once,
                                self.server.dsn_for(db),
                                schema,
                                SINGLE_ENQUEUE_SECONDS,
                                k * 10_000_000,
                            )
                        )
                        bench.append(
                            pgbench_insert(self.server, db, schema, SINGLE_ENQUEUE_SECONDS)
                        )
                        self.log(f"trio-jobs enqueue {tj[-1]:,.0f}/s, pgbench {bench[-1]:,.0f} tps")
            ratios = [a / b for a, b in zip(tj, bench, strict=True)]
            self.add(
                Sample(
                    "trio-jobs",
                    "enqueue-ratio",
                    "each slice's enqueues/s over the next slice's pgbench tps",
                    "x",
                    ratios,
                )
            )
            self.add(
                Sample(
                    "trio-jobs",
                    "enqueue",
                    f"sequential `enqueue`, {SINGLE_ENQUEUE_SECONDS:.0f} s slices",
                    "enqueues/s",
                    tj,
                )
            )
            self.add(
                Sample(
                    "pgbench",
                    "enqueue",
                    "1 client, -M prepared, one INSERT per transaction into a copy of the "
                    f"jobs table, {SINGLE_ENQUEUE_SECONDS:.0f} s slices",
                    "tps",
                    bench,
                )
            )
            self._enqueue_many(db)

    def enqueue_many(self) -> None:
        """The ``enqueue_many`` rows of ``enqueue`` alone (no single-enqueue slices)."""
        with self.server.database("enqueue") as db:
            self._enqueue_many(db)

    def _enqueue_many(self, db: str) -> None:
        with self.server.schema(db, "tj") as schema:
            many = trio.run(_tj_enqueue_many_once, self.server.dsn_for(db), schema, 20)
        self.add(
            Sample(
                "trio-jobs",
                "enqueue_many",
                "`enqueue_many` of 1,000 inputs (20 calls after 3 warm-ups)",
                "ms",
                many,
                higher_is_better=False,
            )
        )
        if "procrastinate" in self.systems:
            with self.server.schema(db, "pq") as schema:
                out = self.procrastinate.run(
                    self.server, db, schema, workload="enqueue_many", jobs=0, samples=20
                )
            self.add(
                Sample(
                    "procrastinate",
                    "enqueue_many",
                    "`batch_defer_async` of 1,000",
                    "ms",
                    out["samples_ms"],
                    higher_is_better=False,
                )
            )
        if "graphile-worker" in self.systems:
            with self.server.schema(db, "gw") as schema:
                out = self.graphile.run(
                    self.server, db, schema, workload="enqueue_many", jobs=0, samples=20
                )
            self.add(
                Sample(
                    "graphile-worker",
                    "enqueue_many",
                    "`addJobs` of 1,000",
                    "ms",
                    out["samples_ms"],
                    higher_is_better=False,
                )
            )

    # -- pickup

    def pickup(self) -> None:
        with self.server.database("pickup") as db, self.server.schema(db, "tj") as schema:
            latencies = trio.run(
                _tj_pickup_once, self.server.dsn_for(db), schema, PICKUP_SAMPLES, PICKUP_INTERVAL
            )
        self.add(
            Sample(
                "trio-jobs",
                "pickup",
                f"{len(latencies)} samples after {PICKUP_WARMUP} warm-ups, another process "
                f"enqueues every {PICKUP_INTERVAL * 1000:.0f} ms",
                "ms",
                latencies,
                higher_is_better=False,
            )
        )

    # -- idle

    def idle(self) -> None:
        with self.server.database("idle") as db, self.server.schema(db, "tj") as schema:
            statements, named = trio.run(
                _tj_idle_once, self.server, db, schema, IDLE_WARMUP, IDLE_WINDOW
            )
        window = f"{IDLE_WINDOW:.0f} s window after {IDLE_WARMUP:.0f} s idle, x{60 / IDLE_WINDOW:g}"
        by_name = ", ".join(f"{k} {v:.0f}" for k, v in named.items()) or "none"
        self.add(
            Sample(
                "trio-jobs",
                "idle",
                f"statements at the bridge, {window}",
                "/min",
                [statements],
                note=by_name,
            )
        )

    def idle_tasks(self) -> None:
        with self.server.database("idle") as db, self.server.schema(db, "tj") as schema:
            statements, named = trio.run(
                _tj_idle_once, self.server, db, schema, IDLE_WARMUP, IDLE_WINDOW, IDLE_TASKS
            )
        window = f"{IDLE_WINDOW:.0f} s window after {IDLE_WARMUP:.0f} s idle, x{60 / IDLE_WINDOW:g}"
        by_name = ", ".join(f"{k} {v:.0f}" for k, v in named.items()) or "none"
        self.add(
            Sample(
                "trio-jobs",
                "idle_tasks",
                f"statements at the bridge, {IDLE_TASKS} tasks, {window}",
                "/min",
                [statements],
                note=by_name,
            )
        )


# --------------------------------------------------------------------------- the report


def _pick(samples: Sequence[Sample], system: str, measure: str) -> Sample | None:
    return _best([s for s in samples if s.system == system and s.measure == measure])


def _cell(sample: Sample | None, *, spread: bool = False) -> str:
    if sample is None:
        return "—"
    text = f"{_fmt(sample.median, sample.unit)} {sample.unit}"
    if spread and len(sample.values) > 1:
        text += f" (max {_fmt(max(sample.values), sample.unit)})"
    return text


def _verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**missed**")


def report(bench: Bench) -> str:
    s = bench.samples
    tj_noop = _pick(s, "trio-jobs", "noop")
    gw_noop = _pick(s, "graphile-worker", "noop")
    gw_default = _best(
        [
            x
            for x in s
            if x.system == "graphile-worker" and x.measure == "noop" and x.note == "default"
        ]
    )
    pq_noop = _pick(s, "procrastinate", "noop")
    tj_steps = _pick(s, "trio-jobs", "steps3")
    pq_steps = _pick(s, "procrastinate", "steps3")
    tj_enq = _pick(s, "trio-jobs", "enqueue")
    pgb = _pick(s, "pgbench", "enqueue")
    tj_many = _pick(s, "trio-jobs", "enqueue_many")
    pq_many = _pick(s, "procrastinate", "enqueue_many")
    gw_many = _pick(s, "graphile-worker", "enqueue_many")
    pickup = _pick(s, "trio-jobs", "pickup")
    idle = _pick(s, "trio-jobs", "idle")
    idle_tasks = _pick(s, "trio-jobs", "idle_tasks")

    enq_ratio = _pick(s, "trio-jobs", "enqueue-ratio")

    def ratio(a: Sample | None, b: Sample | None) -> str:
        return f"{a.median / b.median:.2f}x" if a and b and b.median else "—"

    rows = [
        "| measure | trio-jobs | procrastinate | graphile-worker | target | ratio | verdict |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    if tj_noop or gw_noop or pq_noop:
        ok = None
        if tj_noop and gw_noop:
            ok = tj_noop.median >= 1.2 * gw_noop.median
        rows.append(
            f"| no-op jobs, one worker process | {_cell(tj_noop)} | {_cell(pq_noop)} | "
            f"{_cell(gw_noop)} (default settings: {_cell(gw_default)}) | ≥ 1.2x "
            f"graphile-worker's best | {ratio(tj_noop, gw_noop)} graphile-worker best, "
            f"{ratio(tj_noop, gw_default)} its default, {ratio(tj_noop, pq_noop)} procrastinate "
            f"| {_verdict(ok)} |"
        )
    tj_unkept = _pick(s, "trio-jobs", "noop-unkept")
    if tj_unkept and gw_noop:  # beside the default configuration's row, not instead of it
        rows.append(
            f"| no-op jobs, one worker process, done rows not kept (`done_retention=0`,"
            f" graphile-worker's own behaviour) | {_cell(tj_unkept)} | — | {_cell(gw_noop)} | — "
            f"| {ratio(tj_unkept, gw_noop)} graphile-worker best | — |"
        )
    tj_procs = _pick(s, "trio-jobs", "noop-processes")
    gw_procs = _pick(s, "graphile-worker", "noop-processes")
    if tj_procs or gw_procs:
        ok = tj_procs.median >= 1.2 * gw_procs.median if tj_procs and gw_procs else None
        rows.append(
            f"| no-op jobs, {PROCESSES} worker processes | {_cell(tj_procs)} | — | "
            f"{_cell(gw_procs)} | ≥ 1.2x graphile-worker | {ratio(tj_procs, gw_procs)} "
            f"graphile-worker | {_verdict(ok)} |"
        )
    if tj_steps or pq_steps:
        ok = tj_steps.median >= 1500 if tj_steps else None
        rows.append(
            f"| 3-step jobs | {_cell(tj_steps)} | {_cell(pq_steps)} (3-task chain) | — | "
            f"≥ 1,500/s | {ratio(tj_steps, pq_steps)} procrastinate | {_verdict(ok)} |"
        )
    if tj_enq or pgb:
        ok = enq_ratio.median >= 0.8 if enq_ratio else None
        paired = f"{enq_ratio.median:.2f}x" if enq_ratio else "—"
        rows.append(
            f"| single `enqueue`, sequential | {_cell(tj_enq)} | — | — | ≥ 0.8x pgbench "
            f"({_cell(pgb)}) | {paired} pgbench (median of paired slices) | {_verdict(ok)} |"
        )
    if tj_many:
        ok = tj_many.median <= 15.0 or (gw_many is not None and tj_many.median <= gw_many.median)
        rows.append(
            f"| `enqueue_many` of 1,000 | {_cell(tj_many, spread=True)} | {_cell(pq_many)} | "
            f"{_cell(gw_many)} | ≤ 15 ms or ≤ 1.0x graphile-worker `addJobs` | "
            f"{ratio(tj_many, gw_many)} graphile-worker | {_verdict(ok)} |"
        )
    if pickup:
        ok = pickup.median <= 3.0 and max(pickup.values) <= 10.0
        rows.append(
            f"| pickup latency, idle worker (median / max) | {pickup.median:.2f} / "
            f"{max(pickup.values):.2f} ms | — | — | ≤ 3 ms / ≤ 10 ms | — | {_verdict(ok)} |"
        )
    if idle:
        ok = idle.median <= 12
        extra = f" ({idle.note})" if idle.note else ""
        rows.append(
            f"| statements an idle worker issues | {idle.median:.0f} /min{extra} | — | — | "
            f"≤ 12 /min | — | {_verdict(ok)} |"
        )
    if idle_tasks:
        ok = idle_tasks.median <= 12 + 6
        extra = f" ({idle_tasks.note})" if idle_tasks.note else ""
        rows.append(
            f"| statements an idle worker serving {IDLE_TASKS} tasks issues | "
            f"{idle_tasks.median:.0f} /min{extra} | — | — | ≤ 12 + 6 /min | — | {_verdict(ok)} |"
        )
    detail = [
        "| system | measure | configuration | median | runs |",
        "|---|---|---|---:|---|",
    ]
    for x in s:
        detail.append(
            f"| {x.system} | {x.measure} | {x.config} | {_fmt(x.median, x.unit)} {x.unit} | "
            + ", ".join(_fmt(v, x.unit) for v in x.values)
            + " |"
        )
    return "\n".join(rows) + "\n\nEvery configuration:\n\n" + "\n".join(detail)


def machine(server: Server, bench: Bench) -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import trio_jobs

    return "\n".join(
        [
            f"- machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
            f"- server: {server.describe()}",
            f"- trio-jobs {trio_jobs.__version__}, CPython {platform.python_version()}, "
            f"trio {trio.__version__}, psycopg {psycopg.__version__}",
            f"- procrastinate {bench.procrastinate.version} (CPython {platform.python_version()}, "
            f"its own venv); graphile-worker {bench.graphile.version} (node {node_version()}); "
            f"{pgbench_version()}",
        ]
    )


# --------------------------------------------------------------------------- profile


def _print_profile(profiler: cProfile.Profile, title: str) -> None:
    stats = pstats.Stats(profiler)
    total = 0.0
    areas: dict[str, float] = {}
    for (filename, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += tottime
        if "epoll" in func or "select.poll" in func:
            area = "waiting in epoll (idle: the database or the network)"
        elif "/opentelemetry/" in filename or filename.endswith("/trio_jobs/_tracing.py"):
            area = "OpenTelemetry spans (trio_jobs._tracing, opentelemetry-api)"
        elif filename == "<frozen os>":
            area = "os.environ lookups (opentelemetry's get_tracer, per job)"
        elif filename.endswith("contextlib.py"):
            area = "contextlib (@contextmanager: spans, scopes)"
        elif "/trio_jobs/drivers/postgres/" in filename:
            area = "trio_jobs.drivers.postgres"
        elif "/trio_jobs/" in filename:
            area = "trio_jobs." + Path(filename).stem
        elif "/trio/" in filename:
            area = "trio (scheduler, cancel scopes, events)"
        elif "/psycopg" in filename:
            area = "psycopg (protocol, adaptation)"
        elif "/attr" in filename or "/cattrs/" in filename:
            area = "attrs / cattrs"
        elif filename.startswith("~") or filename == "<string>":
            area = f"builtins ({func.split(' ')[0][:40]})" if func.startswith("<") else "builtins"
        else:
            area = Path(filename).name
        areas[area] = areas.get(area, 0.0) + tottime
    print(f"\n=== profile: {title} — own time by area (cProfile; read shares, not seconds) ===")
    for area, seconds in sorted(areas.items(), key=lambda kv: -kv[1])[:16]:
        print(f"  {seconds / total * 100:5.1f}%  {area}")
    print(f"=== {title}: top functions by own time ===")
    stats.sort_stats("tottime").print_stats(25)
    print(f"=== {title}: trio_jobs functions by cumulative time ===")
    stats.sort_stats("cumtime").print_stats(r"trio_jobs", 20)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    global NOOP_JOBS
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks postgres", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL") or DEFAULT_DSN)
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration (default 3)")
    parser.add_argument("--only", action="append", choices=PARTS, metavar="PART", help=f"{PARTS}")
    parser.add_argument(
        "--systems",
        default="trio-jobs,procrastinate,graphile-worker",
        help="comma-separated subset of trio-jobs,procrastinate,graphile-worker",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile one trio-jobs no-op run and one 3-step run under cProfile, then exit",
    )
    parser.add_argument(
        "--noop-jobs",
        type=int,
        default=NOOP_JOBS,
        help=f"jobs a no-op run, every system alike (default {NOOP_JOBS:,}: about a second "
        "a run here; more makes each run longer and its spread narrower)",
    )
    parser.add_argument("--json", type=Path, default=WORK / "postgres-results.json")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs takes a whole number, 1 or more")
    if args.noop_jobs < 1:
        parser.error("--noop-jobs takes a whole number, 1 or more")
    NOOP_JOBS = args.noop_jobs
    server = Server(args.dsn)
    systems = {x.strip() for x in args.systems.split(",") if x.strip()}
    bench = Bench(server, args.runs, systems)
    WORK.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.profile:
        with server.database("profile") as db:
            tj_throughput(server, db, pg_noop, NOOP_JOBS, 1024, profile=True)
            tj_throughput(server, db, pg_steps3, STEP_JOBS, 256, profile=True)
        return 0
    if "procrastinate" in systems:
        bench.procrastinate.install()
    if "graphile-worker" in systems:
        bench.graphile.install()
    parts = args.only or [p for p in PARTS if p != "enqueue_many"]  # in enqueue
    for part in parts:
        print(f"running {part} ...", file=sys.stderr, flush=True)
        getattr(bench, part)()
    text = (
        f"command: python -m benchmarks postgres {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip()
        + f"\n\n{machine(server, bench)}\n- wall time: {time.perf_counter() - started:,.0f} s, "
        f"{args.runs} runs per configuration, medians\n\n{report(bench)}\n"
    )
    print()
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps([attrs.asdict(x) for x in bench.samples], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
