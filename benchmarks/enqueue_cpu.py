"""``python -m benchmarks enqueue-cpu``: what one ``enqueue`` costs the client, layer by layer.

    python -m benchmarks enqueue-cpu [--calls 3000] [--rounds 1] [--many 20] [--count 200] [--profile]

Wall-clock rates on the shared box move with the neighbours; the client's CPU per
call (``time.process_time``) moves far less. Each round, on one throwaway schema,
measures in turn (so every figure of a round shares its minutes):

``memory driver``
    the facade's share without a socket: 2,000 enqueues on the memory driver.
``enqueue``
    ``--calls`` sequential ``pg_noop.enqueue(i)`` outside a transaction (new keys);
    ``(counted)``: the Python calls and bytecodes of ``--count`` more (load-free).
``fetch_text``
    the floor under it: the same ``enqueue_one`` INSERT through the bridge's
    ``Database.fetch_text`` alone, its text parameters built before the loop.
``pq on Trio`` / ``pq blocking``
    the floors under the bridge: raw ``psycopg.pq`` calls (the prepared statement
    sent, one ``wait_readable``, the result read), then the same blocking.
``enqueue_many``
    ``--many`` calls of ``enqueue_many`` of 1,000 after 3 warm-ups, then its
    parts: staging the requests, the driver's parameters, the statement alone.
``pgbench`` / ``pgbench ours``
    ``pgbench -c 1 -M prepared`` for 2 s of the benchmark's plain INSERT (the
    yardstick of issue 13), then of ``enqueue_one`` itself (its parameters as SQL):
    what no client can beat with this statement.

Each line gives CPU and wall µs per call, the scheduler's passes (Trio run-loop
I/O waits) and task steps per call, and the load average. To compare two trees,
alternate them with ``PYTHONPATH`` (the tree's ``src`` first)::

    for r in 1 2 3; do for t in /tmp/old/src src; do
      PYTHONPATH=$t:. python -m benchmarks enqueue-cpu --rounds 1
    done; done
"""

from __future__ import annotations

import argparse
import cProfile
import math
import os
import pstats
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import trio
from psycopg import pq

import trio_jobs
from trio_jobs import open_jobs
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._sql import positional, qualify

from .postgres import PGBENCH_SCRIPT, pg_noop


class _Passes(trio.abc.Instrument):
    """Counts the run loop's I/O waits (one a scheduler pass) and task steps."""

    def __init__(self) -> None:
        self.io_waits = 0
        self.steps = 0

    def before_io_wait(self, timeout: float) -> None:
        self.io_waits += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


def _line(what: str, n: int, cpu: float, wall: float | None, passes: _Passes | None = None) -> str:
    text = f"  {what:<13} {cpu / n * 1e6:8.1f} µs CPU"
    if wall is not None:
        text += f"  {wall / n * 1e6:8.1f} µs wall"
    if passes is not None:
        text += f"  {passes.io_waits / n:4.2f} io waits  {passes.steps / n:4.2f} task steps"
    return text + " per call"


async def _measure(dsn: str, schema: str, opts: argparse.Namespace, base: int) -> list[str]:
    lines: list[str] = []
    driver = postgres_driver(dsn, schema=schema)
    passes = _Passes()
    async with open_jobs(driver, jobs=[pg_noop]):
        for i in range(50):  # the pool, the session's prepared statement, caches
            await pg_noop.enqueue(base + i)
        n = opts.calls
        profiler = cProfile.Profile() if opts.profile else None
        trio.lowlevel.add_instrument(passes)
        if profiler is not None:
            profiler.enable()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for i in range(n):
            await pg_noop.enqueue(base + 100 + i)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if profiler is not None:
            profiler.disable()
        trio.lowlevel.remove_instrument(passes)
        lines.append(_line("enqueue", n, cpu, wall, passes))
        if opts.count:
            lines.append(await _count(base + 100 + n, opts.count))

        # The bridge alone: the same statement, its parameters ready-made.
        sql, names = positional("enqueue_one")
        fixed = {
            "name": pg_noop.name,
            "queue": pg_noop.queue,
            "payload": "1",
            "max_attempts": str(pg_noop.max_attempts),
            "priority": "0",
            "sensitive": "f",
            "channel": driver.channel,
            "notify": "f",
        }
        params: list[list[str | None]] = []
        for i in range(n):
            row = dict(fixed, id=str(uuid.uuid4()), run_id=str(uuid.uuid4()), key=f"ft:{base}:{i}")
            params.append([row.get(k) for k in names])
        db = driver.db
        passes = _Passes()
        trio.lowlevel.add_instrument(passes)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for p in params:
            await db.fetch_text(sql, p)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        trio.lowlevel.remove_instrument(passes)
        lines.append(_line("fetch_text", n, cpu, wall, passes))

        # Below the bridge: raw libpq calls on one connection, one wait each.
        qualified = qualify(sql, schema)
        pgconn = pq.PGconn.connect(driver._conninfo.encode())
        pgconn.nonblocking = 1
        name = b"bench_pq_enqueue"
        res = pgconn.prepare(name, qualified.encode())
        assert res.status == pq.ExecStatus.COMMAND_OK, res.error_message
        raw = [[None if v is None else v.encode() for v in p] for p in params]
        for p in raw:  # new keys for this loop
            p[names.index("key")] = p[names.index("key")] + b":pq"
            p[names.index("id")] = str(uuid.uuid4()).encode()
        fd = pgconn.socket
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for p in raw:
            pgconn.send_query_prepared(name, p)
            while pgconn.flush():
                await trio.lowlevel.wait_writable(fd)
            while True:
                pgconn.consume_input()
                if pgconn.is_busy():
                    await trio.lowlevel.wait_readable(fd)
                    continue
                r = pgconn.get_result()
                if r is None:
                    break
                assert r.status == pq.ExecStatus.TUPLES_OK, r.error_message
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        lines.append(_line("pq on Trio", n, cpu, wall))
        # The same, blocking (no Trio: libpq's own wait in poll()).
        pgconn.nonblocking = 0
        for p in raw:
            p[names.index("key")] = p[names.index("key")] + b":b"
            p[names.index("id")] = str(uuid.uuid4()).encode()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for p in raw:
            r = pgconn.exec_prepared(name, p)
            assert r.status == pq.ExecStatus.TUPLES_OK, r.error_message
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        pgconn.finish()
        lines.append(_line("pq blocking", n, cpu, wall))

        if opts.many:
            passes = _Passes()
            for k in range(3):
                await pg_noop.enqueue_many(
                    range(base + 10**6 * (k + 1), base + 10**6 * (k + 1) + 1000)
                )
            trio.lowlevel.add_instrument(passes)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for k in range(opts.many):
                start = base + 10**6 * (k + 4)
                await pg_noop.enqueue_many(range(start, start + 1000))
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            trio.lowlevel.remove_instrument(passes)
            lines.append(_line("enqueue_many", opts.many, cpu, wall, passes))
            # Its parts: staging the 1,000 requests (the facade), the driver's
            # parameters, and the statement alone through the bridge.
            from trio_jobs import _ambient
            from trio_jobs._enqueue import _MISSING, stage_requests

            facade = _ambient.facade_var.get()
            assert facade is not None
            batches = []
            cpu0 = time.process_time()
            for k in range(opts.many):
                start = base + 10**6 * (k + 40)
                batches.append(
                    stage_requests(
                        facade,
                        pg_noop,
                        range(start, start + 1000),
                        run_ids=[None] * 1000,
                        delay=None,
                        run_at=None,
                        tenant_id=None,
                        priority=0,
                        actor=_MISSING,
                    )
                )
            lines.append(_line("  staging", opts.many, time.process_time() - cpu0, None))
            cpu0 = time.process_time()
            params = [driver._enqueue_params(b, range(len(b))) for b in batches]
            lines.append(_line("  parameters", opts.many, time.process_time() - cpu0, None))
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for p in params:
                await driver._fetch("enqueue_many", p)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            lines.append(_line("  statement", opts.many, cpu, wall))
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)
        print(f"(Python calls per enqueue: {stats.total_calls / opts.calls:.0f})")  # type: ignore[attr-defined]
    return lines


def _ours_for_pgbench(channel: str) -> str:
    """enqueue_one as pgbench can send it: its parameters as SQL (new ids and key
    each run from ``gen_random_uuid()``, no notify)."""
    sql, names = positional("enqueue_one")
    values = {
        "id": "gen_random_uuid()",
        "run_id": "gen_random_uuid()",
        "name": f"'{pg_noop.name}'",
        "queue": f"'{pg_noop.queue}'",
        "payload": "'1'",
        "key": "gen_random_uuid()::text",
        "max_attempts": str(pg_noop.max_attempts),
        "priority": "0",
        "sensitive": "false",
        "notify": "false",
        "channel": f"'{channel}'",
    }
    for number in range(len(names), 0, -1):
        sql = sql.replace(f"${number}", f"({values.get(names[number - 1], 'NULL')})")
    return sql + ";\n"


async def _facade_only(n: int) -> str:
    """The facade's share without a socket: ``n`` enqueues on the memory driver
    (the same driver in every tree), best of 5 rounds."""
    from trio_jobs import memory_driver

    best = math.inf
    async with open_jobs(memory_driver(), jobs=[pg_noop]):
        for r in range(6):
            cpu0 = time.process_time()
            for i in range(n):
                await pg_noop.enqueue(r * n + i)
            if r:  # the first round warms up
                best = min(best, time.process_time() - cpu0)
    return f"  {'memory driver':<13} {best / n * 1e6:8.1f} µs CPU per call (best of 5 rounds)"


async def _count(base: int, n: int) -> str:
    """What the load of the box cannot move: the Python function calls (C ones
    included) and bytecode instructions one ``enqueue`` executes, Trio's run loop
    included, over ``n`` calls."""
    calls = 0
    opcodes = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal opcodes
        frame.f_trace_opcodes = True
        if event == "opcode":
            opcodes += 1
        return trace

    for tracer in ("profile", "trace"):
        if tracer == "profile":
            sys.setprofile(profile)
        else:
            sys.settrace(trace)
        try:
            for i in range(n):
                await pg_noop.enqueue(base + i)
        finally:
            sys.setprofile(None)
            sys.settrace(None)
        base += n
    return (
        f"  {'(counted)':<13} {calls / n:8.1f} Python calls  {opcodes / n:8.1f} bytecodes per call"
    )


def _pgbench(dsn: str, schema: str, seconds: int, script_text: str, what: str) -> str:
    exe = shutil.which("pgbench")
    if exe is None:
        return "  pgbench       missing"
    script = f"/tmp/enqueue_cpu_{os.getpid()}.sql"
    with open(script, "w", encoding="utf-8") as f:
        f.write(script_text)
    env = dict(os.environ, PGOPTIONS=f"-c search_path={schema}")
    cmd = [exe, "-n", "-c", "1", "-M", "prepared", "-T", str(seconds), "-f", script, dsn]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    os.unlink(script)
    match = re.search(r"tps = ([0-9.]+)", out)
    tps = float(match.group(1)) if match else float("nan")
    return (
        f"  {what:<13}                  {1e6 / tps:8.1f} µs wall per transaction ({tps:,.0f} tps)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks enqueue-cpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--many", type=int, default=20, help="enqueue_many calls (0: none)")
    parser.add_argument("--profile", action="store_true", help="cProfile the enqueue loop")
    parser.add_argument("--no-pgbench", action="store_true")
    parser.add_argument(
        "--count", type=int, default=200, help="enqueues traced for calls and bytecodes (0: none)"
    )
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL"))
    opts = parser.parse_args(argv)
    if not opts.dsn:
        parser.error("--dsn or DATABASE_URL is required")
    tree = os.path.dirname(os.path.dirname(trio_jobs.__file__))
    for r in range(opts.rounds):
        schema = f"bench_enq_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(opts.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            trio.run(_migrate, opts.dsn, schema)
            with psycopg.connect(opts.dsn, autocommit=True) as conn:
                conn.execute(
                    f'CREATE TABLE "{schema}".pgbench_jobs '
                    f'(LIKE "{schema}".trio_jobs_jobs INCLUDING ALL)'
                )
            print(f"{tree} round {r + 1}: load {os.getloadavg()[0]:.1f}")
            print(trio.run(_facade_only, 2000), flush=True)
            for line in trio.run(_measure, opts.dsn, schema, opts, r * 10**8):
                print(line, flush=True)
            if not opts.no_pgbench:
                print(_pgbench(opts.dsn, schema, 2, PGBENCH_SCRIPT, "pgbench"), flush=True)
                ours = _ours_for_pgbench(f"trio_jobs_{schema}")
                print(_pgbench(opts.dsn, schema, 2, ours, "pgbench ours"), flush=True)
        finally:
            with psycopg.connect(opts.dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return 0


async def _migrate(dsn: str, schema: str) -> None:
    async with open_jobs(postgres_driver(dsn, schema=schema)):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
