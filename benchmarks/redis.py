"""Redis benchmarks: trio-jobs' Redis driver beside arq, in the same run.

    python -m benchmarks redis [--url URL] [--runs 3] [--jobs 10000] [--only PART ...]
    python -m benchmarks redis --only unkept [--runs 4] [--jobs 10000]
    python -m benchmarks redis --profile [--runs 3] [--jobs 10000]

One invocation, one Redis server (``--url``, else ``$REDIS_URL``, else
``redis://127.0.0.1:6379/0``); the runs of the two systems are interleaved round
by round, so a noisy neighbour slows both alike. trio-jobs works under a fresh
key prefix per run, arq under a fresh queue name; both are deleted afterwards.

Parts (``--only``):

``throughput``
    End-to-end no-op jobs in one worker process: ``--jobs`` jobs enqueued (not
    timed; trio-jobs with ``enqueue_many``, arq with ``enqueue_job`` calls
    gathered 500 at a time), then one worker timed from its start until the
    last job settled. trio-jobs over a concurrency sweep; arq with burst mode
    at ``max_jobs`` 50 and 200 and ``poll_delay`` 0.01 s (at its defaults, 10
    jobs and 0.5 s, arq reads at most 10 jobs per poll: about 20 jobs/s). In
    the same rounds, trio-jobs' PostgreSQL driver runs the same no-op job on
    ``--pg-dsn`` (else ``$DATABASE_URL``; ``--pg-dsn ''`` leaves it out) at its
    best setting of ``python -m benchmarks postgres`` (concurrency 1024), so
    the Redis driver is compared with it in one run, and the memory driver (no
    server, no I/O: the worker's own per-job cost). The worker's CPU per job
    (``time.process_time``) is printed beside each trio-jobs rate, and the
    server's (Redis: ``INFO cpu`` over the timed window, every client of that
    server counted; PostgreSQL: its backends from ``/proc``): they do not move
    with a noisy neighbour as wall time does. A last line gives the rate those
    CPU figures allow on this box's cores. The Redis driver also runs once a
    round with ``done_retention=0`` (the ack deletes a done row) at
    concurrency 1024.
``unkept`` (only with ``--only unkept``)
    The Redis driver alone, no peers (arq is not installed): the no-op run at
    concurrency 1024 with the default retention and with ``done_retention=0``,
    alternated, the order swapped each round; each run's figures on stderr,
    then the medians and their ratio.
``pickup``
    An idle worker; a second client (its own connection pool, as another
    process has) enqueues one job at a time, 300 ms apart; latency is from just
    before the enqueue call to the body's start. trio-jobs at its defaults (the
    pub/sub wake, proven by its probe); arq at its defaults (it polls every
    ``poll_delay``, 0.5 s) and at ``poll_delay`` 0.01 s.

``--profile`` (instead of the parts)
    Where a no-op job's CPU goes, with no peer: ``--runs`` rounds of the Redis
    driver (concurrency 1024) and the memory driver, alternated, each printing
    the worker's CPU per job, the Redis server's (``INFO cpu``, over the timed
    window), and the worker's garbage collection (``gc.callbacks``) per job and
    per generation; then one Redis run under cProfile (the top 25 functions by
    own time).

arq is installed by this script only, into a venv under ``benchmarks/.work/``:
never a dependency of trio-jobs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from trio_jobs import JobContext, Worker, job, open_jobs, redis_driver

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
DEFAULT_URL = "redis://127.0.0.1:6379/0"
#: The peer, pinned so a rerun measures the same code (override with the env var).
ARQ_SPEC = os.environ.get("BENCH_ARQ", "arq==0.28.0")

TJ_CONCURRENCY = (256, 1024)
#: The PostgreSQL driver's concurrency (its best in `python -m benchmarks postgres`).
PG_CONCURRENCY = 1024
#: The memory driver's, in the same rounds (the worker's own ceiling).
MEM_CONCURRENCY = 1024
#: (max_jobs, poll_delay) for arq's throughput runs.
ARQ_THROUGHPUT = ((50, 0.01), (200, 0.01))
#: poll_delay for arq's pickup runs: its default, then a tight poll.
ARQ_PICKUP = (0.5, 0.01)
PICKUP_SAMPLES = 30
PICKUP_INTERVAL = 0.3
#: The Redis driver's concurrency for its done_retention=0 row (its best).
UNKEPT_CONCURRENCY = 1024
PARTS = ("throughput", "pickup", "unkept")
#: The parts run without ``--only`` (``unkept`` is ``throughput``'s A/B alone).
DEFAULT_PARTS = ("throughput", "pickup")


# --------------------------------------------------------------------------- trio-jobs


@job(input=int, idempotency_key=lambda i: f"noop:{i}", name="bench.redis.noop")
async def redis_noop(ctx: JobContext[int]) -> None:
    """Does nothing: the cost of the queue and the worker alone."""
    return None


_started: dict[int, float] = {}


@job(input=int, idempotency_key=lambda i: f"pickup:{i}", name="bench.redis.pickup")
async def redis_pickup(ctx: JobContext[int]) -> None:
    """Notes when its body started (the pickup-latency benchmark)."""
    _started[ctx.input] = time.perf_counter()


async def _delete_prefix(url: str, pattern: str) -> None:
    import coredis

    client: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
    async with client:
        batch: list[str] = []
        async for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                await client.delete(batch)
                batch = []
        if batch:
            await client.delete(batch)


async def _tj_throughput_once(
    url: str, n: int, concurrency: int, driver_name: str = "redis", unkept: bool = False
) -> tuple[float, float, float]:
    """One timed run: jobs/s, the worker's CPU µs per job, and the Redis
    server's (``INFO cpu`` over the timed window: every client of that server
    counts; 0 for the memory driver, which has no server). ``unkept``: the
    Redis driver with ``done_retention=0`` (the ack deletes a done row)."""
    from trio_jobs import memory_driver

    from .memory import _Settles as _MemorySettles
    from .postgres import _Settles

    prefix = f"tjbench-{uuid.uuid4().hex[:10]}"
    redis = driver_name == "redis"
    try:
        driver: Any = (
            redis_driver(url, prefix=prefix, done_retention=0 if unkept else "14d")
            if redis
            else memory_driver()
        )
        async with open_jobs(driver, jobs=[redis_noop]) as jobs:
            for start in range(0, n, 10_000):
                await redis_noop.enqueue_many(range(start, min(n, start + 10_000)))
            # (the memory driver's batched ack calls its `ack`: its own counter,
            # which wraps `ack` alone, counts each settle once)
            settles = _Settles(driver, n) if redis else _MemorySettles(driver, n)
            worker = Worker(jobs, concurrency=concurrency)
            server0 = await _server_cpu(url) if redis else 0.0
            async with trio.open_nursery() as nursery:
                cpu0 = time.process_time()
                started = time.perf_counter()
                await nursery.start(worker.run)
                with trio.fail_after(600):
                    await settles.done.wait()
                elapsed = settles.finished_at - started
                cpu = time.process_time() - cpu0
                server = (await _server_cpu(url) - server0) if redis else 0.0
                await worker.drain()
            done = sum(s.done for s in await jobs.stats())
            if unkept:  # no done row is kept: the counters count them
                rows = await driver.introspect.counters(redis_noop.name, 0.0)
                if done != 0 or sum(r.done for r in rows) != n:
                    raise RuntimeError(f"trio-jobs: {done} done rows kept, expected {n} counted")
            elif done != n:
                raise RuntimeError(f"trio-jobs: expected {n} done rows, found {done}")
    finally:
        if redis:
            await _delete_prefix(url, f"{prefix}:*")
    return n / elapsed, cpu / n * 1e6, server / n * 1e6


def _pg_throughput_once(dsn: str, n: int) -> tuple[float, float, float]:
    """The PostgreSQL driver's no-op run, as ``python -m benchmarks postgres``
    times it (its own database, dropped afterwards): jobs/s, the worker's CPU
    µs per job, and its backends' (``/proc``; 0 when the server is not local)."""
    from . import postgres

    server = postgres.Server(dsn)
    with server.database("redis_peer") as db:
        rate = postgres.tj_throughput(server, db, postgres.pg_noop, n, PG_CONCURRENCY)
    return (
        rate,
        float(postgres.LAST_CPU["worker"] or 0.0),
        float(postgres.LAST_CPU["server"] or 0.0),
    )


async def _tj_pickup_once(url: str, samples: int, interval: float) -> list[float]:
    prefix = f"tjbench-{uuid.uuid4().hex[:10]}"
    _started.clear()
    sent: dict[int, float] = {}
    try:
        async with open_jobs(redis_driver(url, prefix=prefix), jobs=[redis_pickup]) as jobs:
            worker = Worker(jobs, concurrency=8)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                wake = jobs.driver.wake
                with trio.fail_after(10):
                    while wake is None or not wake.live:  # noqa: ASYNC110 — the probe
                        await trio.sleep(0.01)
                await trio.sleep(1.0)  # let the worker go idle
                other = redis_driver(url, prefix=prefix)  # the enqueuing client
                async with open_jobs(other, jobs=[redis_pickup]):
                    for i in range(samples):
                        sent[i] = time.perf_counter()
                        await redis_pickup.enqueue(i)
                        await trio.sleep(interval)
                with trio.fail_after(10):
                    while len(_started) < samples:  # noqa: ASYNC110 — the last body
                        await trio.sleep(0.01)
                await worker.drain()
    finally:
        await _delete_prefix(url, f"{prefix}:*")
    return [(_started[i] - sent[i]) * 1000.0 for i in sorted(sent)]


# --------------------------------------------------------------------------- arq

#: arq's side, run with the interpreter of the venv under benchmarks/.work/
#: (written there at run time). One invocation is one run; it prints one JSON
#: object on its last line.
ARQ_PEER = r"""
import asyncio, json, sys, time
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker

spec = json.loads(sys.argv[1])
STARTED = {}

async def noop(ctx, i):
    return None

async def pickup(ctx, i):
    STARTED[i] = time.perf_counter()

async def throughput():
    settings = RedisSettings.from_dsn(spec["url"])
    queue, n = spec["queue"], spec["jobs"]
    pool = await create_pool(settings, default_queue_name=queue)
    for start in range(0, n, 500):
        await asyncio.gather(*(pool.enqueue_job("noop", i, _queue_name=queue)
                               for i in range(start, min(n, start + 500))))
    worker = Worker(functions=[noop], redis_settings=settings, queue_name=queue, burst=True,
                    max_jobs=spec["max_jobs"], poll_delay=spec["poll_delay"], keep_result=0,
                    handle_signals=False, log_results=False)
    started = time.perf_counter()
    await worker.async_run()
    elapsed = time.perf_counter() - started
    done = worker.jobs_complete
    await worker.close()
    await pool.aclose()
    return {"rate": done / elapsed, "done": done}

async def pickup_run():
    settings = RedisSettings.from_dsn(spec["url"])
    queue, samples, interval = spec["queue"], spec["samples"], spec["interval"]
    worker = Worker(functions=[pickup], redis_settings=settings, queue_name=queue,
                    max_jobs=8, poll_delay=spec["poll_delay"], keep_result=0,
                    handle_signals=False, log_results=False)
    task = asyncio.create_task(worker.async_run())
    await asyncio.sleep(1.0)
    pool = await create_pool(settings, default_queue_name=queue)
    sent = {}
    for i in range(samples):
        sent[i] = time.perf_counter()
        await pool.enqueue_job("pickup", i, _queue_name=queue)
        await asyncio.sleep(interval)
    while len(STARTED) < samples:
        await asyncio.sleep(0.01)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await worker.close()
    await pool.aclose()
    return {"latencies": [(STARTED[i] - sent[i]) * 1000.0 for i in sorted(sent)]}

result = asyncio.run(throughput() if spec["workload"] == "throughput" else pickup_run())
print(json.dumps(result))
"""


class Arq:
    """arq in its own venv under ``benchmarks/.work/``."""

    def __init__(self) -> None:
        self.venv = WORK / "arq-venv"
        self.python = self.venv / "bin" / "python"
        self.script = WORK / "_peer_arq.py"
        self.version = "?"

    def install(self) -> None:
        marker = self.venv / ".installed"
        if not (marker.exists() and marker.read_text() == ARQ_SPEC):
            print(f"installing {ARQ_SPEC} into {self.venv} ...", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(self.venv)], check=True)
            subprocess.run([str(self.python), "-m", "pip", "install", "-q", ARQ_SPEC], check=True)
            marker.write_text(ARQ_SPEC)
        self.script.write_text(ARQ_PEER)
        self.version = subprocess.run(
            [str(self.python), "-c", "import importlib.metadata as m; print(m.version('arq'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    def run(self, url: str, **spec: Any) -> Any:
        queue = f"arq:bench:{uuid.uuid4().hex[:10]}"
        try:
            proc = subprocess.run(
                [
                    str(self.python),
                    str(self.script),
                    json.dumps({"url": url, "queue": queue, **spec}),
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
        finally:
            trio.run(_delete_prefix, url, f"{queue}*")
        if proc.returncode != 0:
            raise RuntimeError(f"arq failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


# --------------------------------------------------------------------------- the run


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _server_cpu(url: str) -> float:
    import coredis

    client: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
    async with client:
        info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])  # type: ignore[arg-type]


async def _profile_once(url: str, n: int, driver_name: str, profile: bool) -> dict[str, Any]:
    """One timed no-op run (concurrency 1024) on ``driver_name`` ('redis' or
    'memory'): CPU per job of the worker and of the Redis server, and the
    worker's garbage collection; under cProfile when ``profile``."""
    import cProfile
    import gc
    import pstats

    from trio_jobs import memory_driver

    from .postgres import _Settles

    gc_time = [0.0, 0.0, 0.0]
    gc_count = [0, 0, 0]
    began = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.process_time()
        else:
            gc_time[info["generation"]] += time.process_time() - began[0]
            gc_count[info["generation"]] += 1

    prefix = f"tjbench-{uuid.uuid4().hex[:10]}"
    out: dict[str, Any] = {}
    driver: Any = redis_driver(url, prefix=prefix) if driver_name == "redis" else memory_driver()
    try:
        async with open_jobs(driver, jobs=[redis_noop]) as jobs:
            for start in range(0, n, 10_000):
                await redis_noop.enqueue_many(range(start, min(n, start + 10_000)))
            settles = _Settles(driver, n)
            worker = Worker(jobs, concurrency=1024)
            profiler = cProfile.Profile() if profile else None
            async with trio.open_nursery() as nursery:
                server0 = await _server_cpu(url)
                gc.callbacks.append(on_gc)
                if profiler is not None:
                    profiler.enable()
                cpu0 = time.process_time()
                started = time.perf_counter()
                await nursery.start(worker.run)
                with trio.fail_after(600):
                    await settles.done.wait()
                elapsed = settles.finished_at - started
                cpu = time.process_time() - cpu0
                if profiler is not None:
                    profiler.disable()
                gc.callbacks.remove(on_gc)
                server = await _server_cpu(url) - server0
                await worker.drain()
        out = {
            "rate": n / elapsed,
            "worker": cpu / n * 1e6,
            "server": server / n * 1e6,
            "gc": sum(gc_time) / n * 1e6,
            "gc_gens": [round(t * 1e3) for t in gc_time],
            "gc_counts": gc_count,
        }
        if profiler is not None:
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    finally:
        if driver_name == "redis":
            await _delete_prefix(url, f"{prefix}:*")
    return out


def _profile(url: str, runs: int, n: int) -> None:
    print(
        "| run | driver | jobs/s | worker CPU µs/job | of it GC µs/job (ms gen 0/1/2; collections) | Redis server CPU µs/job |"
    )
    print("|---|---|---:|---:|---|---:|")
    for run in range(runs):
        for name in ("redis", "memory"):
            got = trio.run(_profile_once, url, n, name, False)
            print(
                f"| {run + 1} | {name} | {got['rate']:,.0f} | {got['worker']:.0f} | "
                f"{got['gc']:.0f} ({'/'.join(map(str, got['gc_gens']))}; "
                f"{'/'.join(map(str, got['gc_counts']))}) | {got['server']:.0f} |",
                flush=True,
            )
    print()
    print("cProfile of one Redis run:")
    trio.run(_profile_once, url, n, "redis", True)


async def _calls_once(url: str, n: int) -> dict[str, Any]:
    """The worker phase's Redis commands per job (``INFO commandstats``, the
    calls scripts make included; reset after the enqueue), and the server's CPU
    per job. Run it against a Redis of its own: the counts are the server's."""
    import coredis

    prefix = f"tjbench-{uuid.uuid4().hex[:10]}"
    client: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
    try:
        async with client:
            driver = redis_driver(url, prefix=prefix)
            async with open_jobs(driver, jobs=[redis_noop]) as jobs:
                for start in range(0, n, 10_000):
                    await redis_noop.enqueue_many(range(start, min(n, start + 10_000)))
                from .postgres import _Settles

                await client.config_resetstat()
                cpu0 = await _server_cpu(url)
                settles = _Settles(driver, n)
                worker = Worker(jobs, concurrency=1024)
                async with trio.open_nursery() as nursery:
                    await nursery.start(worker.run)
                    with trio.fail_after(600):
                        await settles.done.wait()
                    stats = await client.info("commandstats")
                    cpu = await _server_cpu(url) - cpu0
                    await worker.drain()
    finally:
        await _delete_prefix(url, f"{prefix}:*")
    calls = {
        k.removeprefix("cmdstat_"): int(v["calls"]) / n  # type: ignore[index,call-overload]
        for k, v in stats.items()
        if isinstance(v, dict) and k not in ("cmdstat_config|resetstat", "cmdstat_info")
    }
    return {"server": cpu / n * 1e6, "calls": calls}


def _calls(url: str, runs: int, n: int) -> None:
    for run in range(runs):
        got = trio.run(_calls_once, url, n)
        shown = ", ".join(
            f"{name} {per:.2f}" for name, per in sorted(got["calls"].items()) if per >= 0.005
        )
        print(f"run {run + 1}: Redis server CPU {got['server']:.1f} µs a job; calls a job: {shown}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks redis", description=__doc__)
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", DEFAULT_URL))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--only", action="append", choices=PARTS)
    parser.add_argument(
        "--pg-dsn",
        default=os.environ.get("DATABASE_URL", ""),
        help="the PostgreSQL server the PostgreSQL driver's same-run figure uses "
        "(default $DATABASE_URL; '' leaves it out)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="where a no-op job's CPU goes (worker, Redis server, GC; then cProfile), no peers",
    )
    parser.add_argument(
        "--calls",
        action="store_true",
        help="the Redis commands a no-op job costs the server (INFO commandstats), no peers; "
        "point --url at a Redis of its own",
    )
    args = parser.parse_args(argv)
    if args.calls:
        print(f"command: python -m benchmarks redis {' '.join(argv or sys.argv[2:])}".rstrip())
        _calls(args.url, args.runs, args.jobs)
        return 0
    if args.profile:
        print(f"command: python -m benchmarks redis {' '.join(argv or sys.argv[2:])}".rstrip())
        _profile(args.url, args.runs, args.jobs)
        return 0
    parts = args.only or list(DEFAULT_PARTS)
    arq = Arq()
    peers = "throughput" in parts or "pickup" in parts
    if peers:
        arq.install()

    import coredis

    from .__main__ import machine

    info = trio.run(_server_info, args.url)
    print(f"machine: {machine()}")
    print(f"redis: {info}; coredis {coredis.__version__}; arq {arq.version if peers else '-'}")
    print(f"command: python -m benchmarks redis {' '.join(argv or sys.argv[2:])}".rstrip())
    rows: list[str] = []
    ratios: list[str] = []
    if "throughput" in parts:
        # label -> (rates, worker CPU µs/job, server CPU µs/job) of each round
        tj: dict[str, tuple[list[float], list[float], list[float]]] = {}

        def note(label: str, got: tuple[float, float, float]) -> None:
            for into, value in zip(tj.setdefault(label, ([], [], [])), got, strict=True):
                into.append(value)

        peer: dict[tuple[int, float], list[float]] = {c: [] for c in ARQ_THROUGHPUT}
        for run in range(args.runs):
            print(f"throughput round {run + 1}/{args.runs} ...", file=sys.stderr, flush=True)
            for c in TJ_CONCURRENCY:
                note(
                    f"trio-jobs (Redis driver), concurrency {c}",
                    trio.run(_tj_throughput_once, args.url, args.jobs, c),
                )
            note(
                f"trio-jobs (Redis driver), done_retention=0, concurrency {UNKEPT_CONCURRENCY}",
                trio.run(
                    _tj_throughput_once, args.url, args.jobs, UNKEPT_CONCURRENCY, "redis", True
                ),
            )
            if args.pg_dsn:
                note(
                    f"trio-jobs (PostgreSQL driver), concurrency {PG_CONCURRENCY}",
                    _pg_throughput_once(args.pg_dsn, args.jobs),
                )
            # The memory driver: no server, no I/O; the worker's own per-job cost,
            # the ceiling of one worker process whatever the driver.
            note(
                f"trio-jobs (memory driver), concurrency {MEM_CONCURRENCY}",
                trio.run(_tj_throughput_once, args.url, args.jobs, MEM_CONCURRENCY, "memory"),
            )
            for max_jobs, poll in ARQ_THROUGHPUT:
                got = arq.run(
                    args.url,
                    workload="throughput",
                    jobs=args.jobs,
                    max_jobs=max_jobs,
                    poll_delay=poll,
                )
                if got["done"] != args.jobs:
                    raise RuntimeError(f"arq finished {got['done']} of {args.jobs} jobs")
                peer[(max_jobs, poll)].append(got["rate"])
        bounds: list[str] = []
        for label, (rates, worker, server) in tj.items():
            w, srv = _median(worker), _median(server)
            cpu = f"worker CPU {w:,.0f} µs a job" + (f", server CPU {srv:,.0f}" if srv else "")
            rows.append(
                f"| no-op jobs/s, {args.jobs:,} jobs | {label} | **{_median(rates):,.0f}** | "
                f"{min(rates):,.0f} to {max(rates):,.0f}; {cpu} |"
            )
            # What those CPU figures allow one worker and its server on this box's
            # cores: the worker's one thread, Redis's one thread (PostgreSQL's
            # backends are many), and the two together over the cores.
            cores = os.cpu_count() or 1
            one_thread = 1e6 / srv if srv and "Redis" in label else math.inf
            bound = min(1e6 / w, one_thread, cores * 1e6 / (w + srv))
            bounds.append(f"{label.removeprefix('trio-jobs ')}: {bound:,.0f}")
        for (max_jobs, poll), rates in peer.items():
            rows.append(
                f"| no-op jobs/s, {args.jobs:,} jobs | arq {arq.version}, max_jobs {max_jobs}, "
                f"poll_delay {poll} s | **{_median(rates):,.0f}** | "
                f"{min(rates):,.0f} to {max(rates):,.0f} |"
            )
        best = max(
            _median(r)
            for label, (r, _w, _s) in tj.items()
            if "Redis" in label and "done_retention=0" not in label
        )
        ratios.append(
            f"Redis driver's best / arq's best: **{best / max(_median(r) for r in peer.values()):.2f}x** (target 3x or more)"
        )
        pg = [r for label, (r, _w, _s) in tj.items() if "PostgreSQL" in label]
        if pg:
            ratios.append(
                f"Redis driver's best / PostgreSQL driver: **{best / _median(pg[0]):.2f}x** (target 1.5x or more)"
            )
        ratios.append(
            "jobs/s the CPU a job allows (medians; the least of 1/worker, 1/server for Redis's "
            "one thread, cores/(worker + server)): " + "; ".join(bounds)
        )
    if "unkept" in parts:
        # done_retention=0 against the default on the Redis driver alone, no
        # peers: the two alternated, the order swapped each round.
        ab: dict[str, tuple[list[float], list[float], list[float]]] = {}
        labels = {
            False: f"trio-jobs (Redis driver), default retention, concurrency {UNKEPT_CONCURRENCY}",
            True: f"trio-jobs (Redis driver), done_retention=0, concurrency {UNKEPT_CONCURRENCY}",
        }
        for run in range(args.runs):
            print(f"unkept round {run + 1}/{args.runs} ...", file=sys.stderr, flush=True)
            for unkept in (False, True) if run % 2 == 0 else (True, False):
                got = trio.run(
                    _tj_throughput_once, args.url, args.jobs, UNKEPT_CONCURRENCY, "redis", unkept
                )
                for into, value in zip(
                    ab.setdefault(labels[unkept], ([], [], [])), got, strict=True
                ):
                    into.append(value)
                print(
                    f"  {labels[unkept]}: {got[0]:,.0f} jobs/s, worker {got[1]:,.1f} µs,"
                    f" server {got[2]:,.1f} µs a job",
                    file=sys.stderr,
                    flush=True,
                )
        for label, (rates, worker, server) in ab.items():
            rows.append(
                f"| no-op jobs/s, {args.jobs:,} jobs | {label} | **{_median(rates):,.0f}** | "
                f"{', '.join(f'{r:,.0f}' for r in rates)}; worker CPU {_median(worker):,.1f} µs"
                f" a job, server CPU {_median(server):,.1f} |"
            )
        kept, unkept_ = (ab[labels[False]], ab[labels[True]])
        ratios.append(
            f"done_retention=0 / default: jobs/s **{_median(unkept_[0]) / _median(kept[0]):.2f}x**,"
            f" server CPU a job {_median(unkept_[2]) / _median(kept[2]):.2f}x"
        )
    if "pickup" in parts:
        tj_lat: list[float] = []
        peer_lat: dict[float, list[float]] = {p: [] for p in ARQ_PICKUP}
        for run in range(args.runs):
            print(f"pickup round {run + 1}/{args.runs} ...", file=sys.stderr, flush=True)
            tj_lat.extend(trio.run(_tj_pickup_once, args.url, PICKUP_SAMPLES, PICKUP_INTERVAL))
            for poll in ARQ_PICKUP:
                got = arq.run(
                    args.url,
                    workload="pickup",
                    samples=PICKUP_SAMPLES,
                    interval=PICKUP_INTERVAL,
                    poll_delay=poll,
                )
                peer_lat[poll].extend(got["latencies"])

        def lat_row(label: str, values: list[float]) -> str:
            return (
                f"| pickup latency, idle worker, ms ({len(values)} samples) | {label} | "
                f"**{_median(values):.1f}** median | p90 {_p(values, 0.9):.1f}, "
                f"max {max(values):.1f} |"
            )

        rows.append(lat_row("trio-jobs (Redis driver), pub/sub wake", tj_lat))
        for poll, values in peer_lat.items():
            rows.append(lat_row(f"arq {arq.version}, poll_delay {poll} s", values))
    print()
    print(f"| measure | system, settings | median ({args.runs} runs) | spread |")
    print("|---|---|---:|---|")
    for row in rows:
        print(row)
    print()
    for line in ratios:
        print(f"- {line}")
    return 0


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def _server_info(url: str) -> str:
    import coredis

    client: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
    async with client:
        server = await client.info("server")
        persistence = await client.info("persistence")
        save = await client.config_get(["save", "appendfsync"])
    return (
        f"Redis {server.get('redis_version')!s} on loopback, "
        f"appendonly={'yes' if persistence.get('aof_enabled') else 'no'}, "
        f"appendfsync={_text(save.get('appendfsync'))}, save={save.get('save')!r}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
