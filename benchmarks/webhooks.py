"""Outbound webhooks: deliveries per second from one worker process, beside a
plain httpx loop sending the same deliveries in the same run.

    python -m benchmarks webhooks [--deliveries 1000] [--concurrency 1,4,16] [--runs 3]
                                  [--driver memory|postgres] [--dsn DSN]

The receiver is a raw Trio HTTP/1.1 server (keep-alive, ``204`` to every POST)
in a process of its own on 127.0.0.1, so it does not share the measured
process's interpreter. Per run, in this order:

- **plain httpx**: one ``httpx.AsyncClient`` (Trio; keep-alive pool of 256,
  as webhook()'s), ``--concurrency`` tasks (each level of the list in turn)
  POSTing the deliveries, each body serialized per delivery (orjson) and signed
  as ``webhook()`` signs it (the HMAC header, the id and topic headers): the
  floor a hand-written loop reaches, with none of the queue's bookkeeping.
- **webhook()**: the same deliveries enqueued (``enqueue_many``) as
  ``WebhookDelivery`` inputs of one ``webhook()`` job, then one ``Worker`` of
  ``--concurrency`` slots delivers them (``run_until_quiet``): claim, endpoint
  and event reads, the disabled check, the signed POST (keep-alive, one client
  per Trio run, made before the clock starts as the plain loop's is), the
  ledger row, the ack. Timed from the worker's start until it is quiet.

Both are timed in wall-clock and in the measured process's CPU seconds
(``time.process_time``: a figure a loaded box moves less). Rounds alternate
which goes first; "paired ratio" is the median of each round's own ratio.

The driver and its ledger are the memory ones by default (the library's own
cost), or ``--driver postgres`` (``postgres_driver`` + ``postgres_webhook_ledger``:
two ledger statements per delivery beside the queue's), in a fresh schema of
``--dsn`` / ``$DATABASE_URL`` dropped at the end. The target is webhook() at
0.7x the plain loop or better.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence

import trio

RESPONSE = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"


# --------------------------------------------------------------------------- the receiver


async def _serve_one(stream: trio.SocketStream) -> None:
    buf = b""
    try:
        while True:
            while b"\r\n\r\n" not in buf:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
            head, _, rest = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            while len(rest) < length:
                data = await stream.receive_some(65536)
                if not data:
                    return
                rest += data
            buf = rest[length:]
            await stream.send_all(RESPONSE)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return


async def _serve(port: int) -> None:
    await trio.serve_tcp(_serve_one, port, host="127.0.0.1")


def _start_receiver() -> tuple[subprocess.Popen[bytes], int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.webhooks", "--serve", str(port)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the receiver did not start")


# --------------------------------------------------------------------------- the two senders

SECRET = "whsec_benchmark_0123456789"
BODY = {"order": 42, "total": "9.00", "currency": "EUR", "items": [1, 2, 3]}


async def plain_loop(url: str, n: int, concurrency: int) -> tuple[float, float]:
    """Deliveries per second of a hand-written httpx loop, and its CPU seconds
    per delivery."""
    import httpx
    import orjson

    from trio_jobs._webhook_signature import signature_header

    events = {f"ev{i}": ("orders.paid", BODY) for i in range(n)}
    todo = iter(range(n))
    async with httpx.AsyncClient(
        timeout=None, limits=httpx.Limits(max_connections=None, max_keepalive_connections=256)
    ) as client:

        async def sender() -> None:
            for i in todo:
                event_id = f"ev{i}"
                topic, payload = events[event_id]
                body = orjson.dumps(payload)  # each event's own body, as webhook() sends it
                headers = {
                    "content-type": "application/json",
                    "x-webhook-id": event_id,
                    "x-webhook-topic": topic,
                    "x-webhook-signature": signature_header(
                        SECRET, int(time.time()), event_id, topic, body
                    ),
                }
                answer = await client.post(url, content=body, headers=headers)
                assert answer.status_code == 204

        start, cpu = time.perf_counter(), time.process_time()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(sender)
        return n / (time.perf_counter() - start), (time.process_time() - cpu) / n


async def through_webhook(
    url: str, n: int, concurrency: int, dsn: str | None
) -> tuple[float, float]:
    """Deliveries per second of ``webhook()`` run by one worker, and its CPU
    seconds per delivery (the worker process's: the receiver is elsewhere)."""
    from trio_jobs import (
        Endpoint,
        Retry,
        WebhookDelivery,
        WebhookEvent,
        Worker,
        memory_driver,
        memory_webhook_ledger,
        open_jobs,
        postgres_driver,
        postgres_webhook_ledger,
        webhook,
    )
    from trio_jobs._webhook_guard import client_for

    endpoint = Endpoint("e1", url, SECRET)
    events = {f"ev{i}": WebhookEvent(f"ev{i}", "orders.paid", BODY) for i in range(n)}
    deliver = webhook(
        name="bench.webhooks",
        tenant="none",
        endpoint=lambda d: endpoint,
        event=lambda d: events[d.event_id],
        ledger=postgres_webhook_ledger() if dsn else memory_webhook_ledger(),
        allow_private=True,  # the receiver is on 127.0.0.1
        retry=Retry(attempts=1),
    )
    driver = postgres_driver(dsn) if dsn else memory_driver()
    async with open_jobs(driver, jobs=[deliver]) as jobs:
        deliveries = [WebhookDelivery("e1", f"ev{i}") for i in range(n)]
        for start in range(0, n, 5_000):
            await deliver.enqueue_many(deliveries[start : start + 5_000])
        # The process's one client exists before the clock starts, as the plain
        # loop's does (its TLS context costs ~0.1 s to build, once).
        client_for(guard=False)
        worker = Worker(jobs, concurrency=concurrency, poll_interval="10ms")
        begin, cpu = time.perf_counter(), time.process_time()
        await worker.run_until_quiet()
        elapsed, spent = time.perf_counter() - begin, time.process_time() - cpu
        attempts = await deliver.ledger.attempts(limit=1000)
        failed = [a for a in attempts if a.code is not None]
        assert not failed, f"{len(failed)} deliveries failed: {failed[:3]}"
        assert len(attempts) == min(n, 1000)
    return n / elapsed, spent / n


# --------------------------------------------------------------------------- the run


def _schema_dsn(base: str) -> tuple[str, str]:
    from trio_jobs.drivers.postgres._driver import conninfo_with_schema

    schema = f"bench_hooks_{uuid.uuid4().hex[:8]}"
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return conninfo_with_schema(base, schema), schema


def _drop(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _levels(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of whole numbers") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("concurrency values are whole numbers, 1 or more")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks webhooks")
    parser.add_argument("--deliveries", type=int, default=1_000)
    parser.add_argument("--concurrency", type=_levels, default=[1, 4, 16])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--driver", choices=("memory", "postgres"), default="memory")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        trio.run(_serve, args.serve)
        return 0
    base = args.dsn or os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test"
    proc, port = _start_receiver()
    url = f"http://127.0.0.1:{port}/hook"
    lines = [
        f"| concurrency | plain httpx loop, median of {args.runs} (best, worst) | webhook(), "
        f"{args.driver} driver and ledger, median of {args.runs} (best, worst) | ratio | "
        "paired ratio (median of the rounds') | CPU µs a delivery, plain / webhook() |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    loads = [os.getloadavg()[0]]
    try:
        for level in args.concurrency:
            plain: list[tuple[float, float]] = []
            ours: list[tuple[float, float]] = []
            for run in range(args.runs):
                # Alternate which goes first: a loaded machine drifts within a run.
                order = ("plain", "ours") if run % 2 == 0 else ("ours", "plain")
                for which in order:
                    if which == "plain":
                        plain.append(trio.run(plain_loop, url, args.deliveries, level))
                        continue
                    dsn = schema = None
                    if args.driver == "postgres":
                        dsn, schema = _schema_dsn(base)
                    try:
                        ours.append(trio.run(through_webhook, url, args.deliveries, level, dsn))
                    finally:
                        if schema is not None:
                            _drop(base, schema)
                loads.append(os.getloadavg()[0])
            rates_p, rates_o = [r for r, _ in plain], [r for r, _ in ours]
            p, o = statistics.median(rates_p), statistics.median(rates_o)
            paired = statistics.median(b[0] / a[0] for a, b in zip(plain, ours, strict=True))
            cpu_p = statistics.median(c for _, c in plain) * 1e6
            cpu_o = statistics.median(c for _, c in ours) * 1e6
            lines.append(
                f"| {level} | **{p:,.0f} /s** ({max(rates_p):,.0f}, {min(rates_p):,.0f}) | "
                f"**{o:,.0f} /s** ({max(rates_o):,.0f}, {min(rates_o):,.0f}) | **{o / p:.2f}x** | "
                f"{paired:.2f}x | {cpu_p:,.0f} / {cpu_o:,.0f} |"
            )
            print(lines[-1], file=sys.stderr)
    finally:
        proc.kill()
        proc.wait()
    print(
        f"{args.deliveries} deliveries per run against a raw Trio receiver on 127.0.0.1 "
        "(a process of its own); target webhook() >= 0.7x the plain loop. 1-minute load "
        f"average during the run: {min(loads):.2f} to {max(loads):.2f} on "
        f"{os.cpu_count()} cores.\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
