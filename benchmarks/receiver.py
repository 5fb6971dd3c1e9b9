"""Inbound webhooks on PostgreSQL: verified, enqueued, acknowledged requests per second.

    python -m benchmarks receiver [--dsn DSN] [--duration 10] [--connections 8,32]
                                  [--runs 3] [--load wrk|python]

A server process serves one ``webhook_receiver()`` with Hypercorn's Trio worker
on 127.0.0.1 (``mount_receivers`` in a bare Starlette app, one process, the
driver's default pool of 10). Its ``verify`` is what an app writes:
``verify_body_hmac`` (HMAC-SHA256, a ``sha256=`` hex header), ``orjson.loads``,
``Verified(event_id, payload)``. Every request is a distinct event, so every
200 is one durable insert (no dedupe); no worker runs meanwhile.

The load comes from another process: ``wrk`` (``apt-get install -y wrk``) with
keep-alive connections, each sending pre-signed requests from a file in turn
(``--load python``: a Trio raw-socket client, when wrk is not installed). The
figures: requests per second answered 200, the latency percentiles wrk
measured (p50, p99), and the rows counted in the table afterwards (which must
equal the 200s: an acknowledged event is a queued one).

The database is ``--dsn``, else ``$DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; each run works in a fresh schema,
dropped at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SECRET = b"bench-secret"
PATH = "/hooks/bench/acct"

_LUA = r"""
local counter = 0
function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
end
function init(args)
  local file, nthreads = args[1], tonumber(args[2])
  reqs = {}
  local i = 0
  for line in io.lines(file) do
    if i % nthreads == tid then
      local sig, body = line:match("^(%S+)\t(.*)$")
      reqs[#reqs + 1] = wrk.format("POST", "__PATH__",
        {["x-signature"] = sig, ["content-type"] = "application/json"}, body)
    end
    i = i + 1
  end
  idx = 0
end
function request()
  idx = idx + 1
  if idx > #reqs then idx = 1 end
  return reqs[idx]
end
function done(summary, latency, requests)
  io.write(string.format(
    "RESULT %d %d %d %d %d %d %d\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), latency.max,
    summary.errors.status, summary.errors.connect + summary.errors.read
      + summary.errors.write + summary.errors.timeout))
end
"""


def _scoped(dsn: str, schema: str) -> str:
    params = conninfo_to_dict(dsn)
    options = str(params.get("options", ""))
    params["options"] = f"{options} -c search_path={schema}".strip()
    return make_conninfo("", **params)


# --------------------------------------------------------------------------- the server


def _receiver() -> Any:
    from trio_jobs import ReceivedWebhook, Retry, Verified, verify_body_hmac, webhook_receiver

    def verify(inbound: Any) -> Verified:
        text = verify_body_hmac(
            inbound.body, secret=SECRET, given=inbound.headers.get("x-signature"), prefix="sha256="
        )
        event = orjson.loads(text)
        return Verified(event_id=event["id"], payload=event)

    async def handle(ctx: Any) -> None:
        assert isinstance(ctx.input, ReceivedWebhook)

    return webhook_receiver(
        name="bench.hooks",
        path="/hooks/bench/{account}",
        verify=verify,
        handle=handle,
        retry=Retry(attempts=1),
    )


async def _bare(scope: Any, receive: Any, send: Any) -> None:
    """The floor: an ASGI app that reads the body and answers a fixed 200 JSON,
    with no verify and no enqueue (what Hypercorn and the load cost alone)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    while (await receive()).get("more_body", False):
        pass
    body = b'{"ok":true,"event_id":"x","deduped":false}'
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _serve(dsn: str, bare: bool = False) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve
    from starlette.applications import Starlette

    from trio_jobs import open_jobs, postgres_driver
    from trio_jobs.web import mount_receivers

    hook = _receiver()
    async with open_jobs(postgres_driver(dsn), jobs=[hook]) as jobs:
        app: Any = Starlette()
        mount_receivers(app, jobs)
        if bare:
            app = _bare
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        config.errorlog = None
        config.keep_alive_timeout = 60
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                urls = await nursery.start(serve, app, config)
                print(f"ready {urls[0]}", flush=True)
                async for _ in signals:
                    break
                nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- load


def _signed(n: int, tag: str) -> tuple[str, bytes]:
    body = orjson.dumps(
        {"id": f"evt-{tag}-{n:08d}", "type": "invoice.paid", "invoice": f"in_{n}", "amount": 900}
    )
    return "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest(), body


def _requests_file(count: int, tag: str) -> str:
    handle, path = tempfile.mkstemp(prefix="tj-receiver-", suffix=".tsv")
    with os.fdopen(handle, "wb") as out:
        for n in range(count):
            sig, body = _signed(n, tag)
            out.write(sig.encode() + b"\t" + body + b"\n")
    return path


def _wrk(url: str, connections: int, duration: int, file: str) -> dict[str, float]:
    threads = 1 if connections < 4 else 2
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_LUA.replace("__PATH__", PATH))
    try:
        done = subprocess.run(
            [
                "wrk",
                f"-t{threads}",
                f"-c{connections}",
                f"-d{duration}s",
                "--timeout",
                "10s",
                "-s",
                script.name,
                url,
                "--",
                file,
                str(threads),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        os.unlink(script.name)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    requests, duration_us, p50, p99, most, status_errors, socket_errors = map(int, line.split()[1:])
    return {
        "requests": requests,
        "seconds": duration_us / 1e6,
        "p50_ms": p50 / 1000,
        "p99_ms": p99 / 1000,
        "max_ms": most / 1000,
        "non2xx": status_errors,
        "socket_errors": socket_errors,
    }


async def _python_load(url: str, connections: int, duration: int, tag: str) -> dict[str, float]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    latencies: list[float] = []
    bad = 0
    counter = iter(range(10**9))
    deadline = trio.current_time() + duration

    async def one_connection() -> None:
        nonlocal bad
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            while trio.current_time() < deadline:
                sig, body = _signed(next(counter), tag)
                head = (
                    f"POST {PATH} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                    f"x-signature: {sig}\r\ncontent-length: {len(body)}\r\n\r\n"
                ).encode()
                started = time.perf_counter()
                await stream.send_all(head + body)
                answer = b""
                while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                    answer += await stream.receive_some(65536)
                latencies.append(time.perf_counter() - started)
                if not answer.startswith(b"HTTP/1.1 200"):
                    bad += 1

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(one_connection)
    took = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "seconds": took,
        "p50_ms": ordered[len(ordered) // 2] * 1000,
        "p99_ms": ordered[int(len(ordered) * 0.99)] * 1000,
        "max_ms": ordered[-1] * 1000,
        "non2xx": bad,
        "socket_errors": 0,
    }


def _python_load_process(url: str, connections: int, duration: int, tag: str) -> dict[str, float]:
    code = (
        "import sys, orjson, trio; from benchmarks.receiver import _python_load; "
        "print(orjson.dumps(trio.run(_python_load, sys.argv[1], int(sys.argv[2]), "
        "int(sys.argv[3]), sys.argv[4])).decode())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, url, str(connections), str(duration), tag],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return result


# --------------------------------------------------------------------------- one run


def _cpu_seconds(pid: int) -> float:
    """The user + system CPU time a process has used (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(
    base_dsn: str,
    connections: int,
    duration: int,
    load: str,
    file: str | None,
    *,
    bare: bool = False,
) -> dict[str, float]:
    schema = f"tjbench_hook_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(base_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    dsn = _scoped(base_dsn, schema)
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.receiver", "serve", dsn, *(["bare"] if bare else [])],
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().decode().split()
        if not line or line[0] != "ready":
            raise RuntimeError("the receiver's server did not start")
        url = line[1]
        cpu_before = _cpu_seconds(server.pid)
        if load == "wrk":
            assert file is not None
            result = _wrk(url, connections, duration, file)
        else:
            result = _python_load_process(url, connections, duration, uuid.uuid4().hex[:6])
        server_cpu = _cpu_seconds(server.pid) - cpu_before
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM trio_jobs_jobs").fetchone()
        result["rows"] = float(row[0] if row else 0)
        result["acked"] = result["requests"] - result["non2xx"]
        result["per_second"] = result["acked"] / result["seconds"]
        result["cpu_us"] = server_cpu / max(1.0, result["acked"]) * 1e6
        result["connections"] = connections
        return result
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        with psycopg.connect(base_dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "serve":
        trio.run(_serve, argv[1], argv[2:] == ["bare"])
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks receiver")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--duration", type=int, default=10, help="Seconds per run (default 10).")
    parser.add_argument(
        "--connections",
        default="8,32",
        help="Keep-alive connections to sweep, comma-separated (default 8,32).",
    )
    parser.add_argument("--runs", type=int, default=3, help="Runs per configuration (default 3).")
    parser.add_argument(
        "--load",
        choices=["wrk", "python"],
        default="wrk" if shutil.which("wrk") else "python",
        help="The load generator (default: wrk when installed).",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=200_000,
        help="Pre-signed distinct events for wrk (default 200,000; more than a run sends).",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="Also run the floor: a bare ASGI app reading the body and answering 200 "
        "(no verify, no enqueue), on the same server and load.",
    )
    args = parser.parse_args(list(argv))
    sweep = [int(c) for c in args.connections.split(",") if c.strip()]
    from . import __main__ as bench_main

    print(f"machine: {bench_main.machine()}")
    print(f"command: python -m benchmarks receiver {' '.join(argv)}".rstrip())
    print(f"load: {args.load}, {args.duration} s per run, {args.runs} runs per configuration")
    file = _requests_file(args.requests, uuid.uuid4().hex[:6]) if args.load == "wrk" else None
    try:
        print()
        print(
            "| server | connections | acked/s (median) | best | worst | p50 ms | p99 ms | max ms "
            "| server CPU µs/ack | every ack a row |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        configurations = [(c, False) for c in sweep]
        if args.floor:
            configurations += [(c, True) for c in sweep]
        for connections, bare in configurations:
            results = []
            for _ in range(args.runs):
                print(f"running {connections} connections ...", file=sys.stderr, flush=True)
                results.append(
                    run_once(args.dsn, connections, args.duration, args.load, file, bare=bare)
                )
            rates = [r["per_second"] for r in results]
            middle = sorted(results, key=lambda r: r["per_second"])[len(results) // 2]
            # A row per 200, plus at most one per connection still in flight
            # when the load stopped (queued, its answer not counted).
            consistent = all(r["acked"] <= r["rows"] <= r["acked"] + connections for r in results)
            verdict = "yes" if consistent else "NO"
            if bare:  # the floor queues nothing
                verdict = "n/a" if all(r["rows"] == 0 for r in results) else "NO"
            print(
                f"| {'floor (bare ASGI)' if bare else 'receiver'} | {connections} | "
                f"**{statistics.median(rates):,.0f}** | {max(rates):,.0f} | "
                f"{min(rates):,.0f} | {middle['p50_ms']:.1f} | {middle['p99_ms']:.1f} | "
                f"{middle['max_ms']:.1f} | {middle['cpu_us']:,.0f} | "
                f"{verdict} "
                f"({int(sum(r['rows'] for r in results)):,} rows, "
                f"{int(sum(r['non2xx'] for r in results))} non-200) |"
            )
    finally:
        if file is not None:
            os.unlink(file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
