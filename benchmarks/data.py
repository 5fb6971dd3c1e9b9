"""``python -m benchmarks data [--rows N]``: import_rows and export_rows against
PostgreSQL's own COPY, side by side in one run.

- import: a generated csv (``--rows``, 2,000,000 by default: about 200 MB, written
  once under ``benchmarks/.work/``, never committed) read by ``import_rows`` from
  an obstore ``LocalStore`` into a table; the handle writes each batch with
  psycopg's binary ``COPY ... FROM STDIN`` (``write_row``) in a worker thread,
  ``--batch`` rows a call (10,000 by default: more than a 1 MiB page of this file
  holds, ~8,200, so one ``COPY`` and one commit a page, as an app importing
  fast would ask; 5,000, the default before 2026-12-04, cut each page in two). Against:
  ``COPY people FROM STDIN`` of the same file through psycopg.
- export: the same rows paged by keyset (``where id > %s order by id limit``)
  into csv parts through ``export_rows``, with ``read_ahead=True`` (the source
  only reads) where the tree has it (``--no-read-ahead``: without). Against: ``COPY (select ...) TO
  STDOUT`` of the same query to a file.

Each phase runs in its own process, so its peak RSS growth (``ru_maxrss``
minus the RSS when the phase starts) is its own. The job runs on the memory
driver (the queue is not what is measured), with a real Worker.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time
from typing import Any

WORK = pathlib.Path(__file__).resolve().parent / ".work"
COLUMNS = ["id", "name", "email", "score", "active", "note"]
#: Every generated row's note: a fixed text the size of a short comment.
NOTE = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod"
TYPES = ["int8", "text", "text", "float8", "bool", "text"]
CREATE = (
    "create table {t} (id bigint primary key, name text not null, email text not null, "
    "score double precision, active boolean not null, note text not null)"
)


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of a process on this machine."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Meter:
    """Wall seconds, peak RSS growth, this process's CPU and the CPU of the
    PostgreSQL backend serving ``conn``: the CPU figures do not move with the
    machine's load, the wall figures do."""

    def __init__(self, conn: Any) -> None:
        self.backend = conn.info.backend_pid

    def start(self) -> None:
        self.rss, self.t0 = _rss_kb(), time.perf_counter()
        self.cpu, self.server = time.process_time(), _cpu_of(self.backend)

    def stop(self) -> dict[str, Any]:
        return {
            "seconds": time.perf_counter() - self.t0,
            "rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.rss) / 1024,
            "client_cpu": time.process_time() - self.cpu,
            "server_cpu": _cpu_of(self.backend) - self.server,
        }


def generate(rows: int) -> pathlib.Path:
    path = WORK / f"people-{rows}.csv"
    if path.exists():
        return path
    WORK.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(",".join(COLUMNS) + "\n")
        note = NOTE
        for start in range(1, rows + 1, 10_000):
            f.write(
                "".join(
                    f"{i},Person {i},person{i}@example.com,{i % 1000 / 10},"
                    f"{'true' if i % 2 else 'false'},{note}\n"
                    for i in range(start, min(start + 10_000, rows + 1))
                )
            )
    tmp.rename(path)
    return path


def _connect() -> Any:
    import psycopg

    return psycopg.connect(
        os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"), autocommit=True
    )


def _fresh(conn: Any, table: str) -> None:
    conn.execute(f"drop table if exists {table}")
    conn.execute(CREATE.format(t=table))


def settle() -> None:
    """Before the reads: vacuum the two tables the writes just loaded and take a
    checkpoint, so no autovacuum of their 2 million fresh rows (or the hint bits
    a first read sets on every page) lands on one reader and not the other."""
    conn = _connect()
    for table in ("bench_copy_in", "bench_import"):
        conn.execute(f"vacuum (analyze) {table}")
    conn.execute("checkpoint")
    conn.close()


def phase_copy_in(path: pathlib.Path) -> dict[str, Any]:
    conn = _connect()
    _fresh(conn, "bench_copy_in")
    meter = _Meter(conn)
    meter.start()
    with (
        conn.cursor() as cur,
        cur.copy("copy bench_copy_in from stdin (format csv, header true)") as cp,
        open(path, "rb") as f,
    ):
        while chunk := f.read(1 << 20):
            cp.write(chunk)
    return meter.stop()


def phase_import(path: pathlib.Path, batch: int, page_bytes: int) -> dict[str, Any]:
    import attrs
    import trio
    from obstore.store import LocalStore

    from trio_jobs import Worker, import_rows, memory_driver, open_jobs

    @attrs.frozen
    class Person:
        id: int
        name: str
        email: str
        score: float | None
        active: bool
        note: str

    conn = _connect()
    _fresh(conn, "bench_import")
    meter = _Meter(conn)
    store = LocalStore(str(path.parent))

    def copy_batch(rows: list[Person]) -> None:
        # Binary COPY with the column types set: psycopg's C dumpers, the cheapest
        # way for an app to hand PostgreSQL structured rows.
        with (
            conn.cursor() as cur,
            cur.copy(f"copy bench_import ({', '.join(COLUMNS)}) from stdin (format binary)") as cp,
        ):
            cp.set_types(TYPES)
            for r in rows:
                cp.write_row((r.id, r.name, r.email, r.score, r.active, r.note))

    async def handle(rows: list[Person], _input: Any) -> None:
        await trio.to_thread.run_sync(copy_batch, rows)

    job = import_rows(
        name="bench.import",
        idempotency_key=lambda _: "bench",
        source=lambda _: store,
        key=lambda _: path.name,
        columns=COLUMNS,
        schema=Person,
        handle=handle,
        batch=batch,
        page_bytes=page_bytes,
        max_row_errors=0,
    )
    result: dict[str, Any] = {}

    async def main() -> None:
        async with open_jobs(driver=memory_driver(), jobs=[job]) as jobs:
            await job.enqueue(None)
            meter.start()
            await Worker(jobs, concurrency=1).run_until_quiet()
            result.update(meter.stop())

    trio.run(main)
    result["rows"] = conn.execute("select count(*) from bench_import").fetchone()[0]
    return result


QUERY = "select id, name, email, score, active, note from bench_copy_in"


def phase_copy_out(rows: int) -> dict[str, Any]:
    conn = _connect()
    out = WORK / "copy-out.csv"
    meter = _Meter(conn)
    meter.start()
    with (
        conn.cursor() as cur,
        cur.copy(f"copy ({QUERY} order by id) to stdout (format csv, header true)") as cp,
        open(out, "wb") as f,
    ):
        for data in cp:
            f.write(data)
    return meter.stop()


def phase_export(page: int, read_ahead: bool = True, binary: bool = False) -> dict[str, Any]:
    import inspect

    import trio
    from obstore.store import LocalStore

    from trio_jobs import Worker, export_rows, memory_driver, open_jobs

    conn = _connect()
    meter = _Meter(conn)
    target = WORK / "export"
    target.mkdir(exist_ok=True)
    store = LocalStore(str(target))

    def fetch(after: int) -> tuple[list[Any], Any]:
        # binary: the source asks psycopg for binary results (the same Python
        # values, parsed without their text forms: ~0.6 against ~1.0 µs a row).
        found = (
            conn.cursor(binary=binary)
            .execute(f"{QUERY} where id > %s order by id limit %s", (after, page))
            .fetchall()
        )
        return found, (found[-1][0] if len(found) == page else None)

    async def source(_input: Any, cursor: Any) -> tuple[list[Any], Any]:
        return await trio.to_thread.run_sync(fetch, cursor or 0)

    # A tree without the option (an A/B against an older one) exports without it.
    ahead = read_ahead and "read_ahead" in inspect.signature(export_rows).parameters
    job = export_rows(
        **({"read_ahead": True} if ahead else {}),
        name="bench.export",
        idempotency_key=lambda _: "bench",
        source=source,
        sink=lambda _: store,
        prefix="people",
        columns=COLUMNS,
    )
    result: dict[str, Any] = {}

    async def main() -> None:
        async with open_jobs(driver=memory_driver(), jobs=[job]) as jobs:
            await job.enqueue(None)
            meter.start()
            await Worker(jobs, concurrency=1).run_until_quiet()
            result.update(meter.stop())

    trio.run(main)
    result["read_ahead"] = ahead
    return result


def _child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.data", "--phase", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks data")
    parser.add_argument(
        "--rows", type=int, default=2_000_000, help="rows in the csv (2,000,000: ~200 MB)"
    )
    parser.add_argument(
        "--batch", type=int, default=10_000, help="rows per handle call (a 1 MiB page's, ~8,200)"
    )
    parser.add_argument("--page", type=int, default=20_000, help="rows per export page")
    parser.add_argument(
        "--page-bytes", type=int, default=1 << 20, help="bytes per import page (the default)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternated rounds (median)")
    parser.add_argument(
        "--no-read-ahead", action="store_true", help="export without read_ahead=True"
    )
    parser.add_argument(
        "--binary-source",
        action="store_true",
        help=argparse.SUPPRESS,  # a phase's flag: the export's source reads binary results
    )
    parser.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.phase:
        name, *rest = opts.phase
        path = pathlib.Path(rest[0]) if rest else None
        found = {
            "copy-in": lambda: phase_copy_in(path),
            "import": lambda: phase_import(path, opts.batch, opts.page_bytes),
            "copy-out": lambda: phase_copy_out(opts.rows),
            "export": lambda: phase_export(
                opts.page, not opts.no_read_ahead, binary=opts.binary_source
            ),
        }[name]()
        print(json.dumps(found))
        return 0
    path = generate(opts.rows)
    size = path.stat().st_size / 1e6
    print(
        f"file: {path.name}, {opts.rows:,} rows, {size:.0f} MB; import batch {opts.batch}, page {opts.page_bytes} bytes; export page {opts.page}"
    )
    # Rounds alternate the peer and ours, so a load change hits both; the table
    # is each one's median round, the ratios each round's own.
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in ("cin", "imp", "cout", "exp", "expb")}
    for _ in range(opts.rounds):
        rounds["cin"].append(_child(["copy-in", str(path)]))
        rounds["imp"].append(
            _child(
                [
                    "import",
                    str(path),
                    "--batch",
                    str(opts.batch),
                    "--page-bytes",
                    str(opts.page_bytes),
                ]
            )
        )
        settle()
        rounds["cout"].append(_child(["copy-out", "--rows", str(opts.rows)]))
        export = ["export", "--page", str(opts.page)] + (
            ["--no-read-ahead"] if opts.no_read_ahead else []
        )
        rounds["exp"].append(_child(export))
        rounds["expb"].append(_child([*export, "--binary-source"]))
    print(
        "| benchmark | seconds | MB/s | rows/s | peak RSS growth (MB) | ratio to COPY "
        "| CPU µs a row (client + server) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")

    def median(kind: str) -> dict[str, Any]:
        return sorted(rounds[kind], key=lambda r: r["seconds"])[(opts.rounds - 1) // 2]

    for label, kind, base in (
        ("COPY FROM STDIN (psycopg)", "cin", "cin"),
        ("import_rows (binary COPY per batch)", "imp", "cin"),
        ("COPY TO STDOUT (psycopg)", "cout", "cout"),
        (
            "export_rows (csv parts, read ahead)"
            if rounds["exp"][0].get("read_ahead")
            else "export_rows (csv parts)",
            "exp",
            "cout",
        ),
        ("export_rows, its source reading binary results", "expb", "cout"),
    ):
        r = median(kind)
        ratios = ", ".join(
            f"{b['seconds'] / x['seconds']:.2f}x"
            for b, x in zip(rounds[base], rounds[kind], strict=True)
        )
        print(
            f"| {label} | {r['seconds']:.2f} | {size / r['seconds']:.0f} | "
            f"{opts.rows / r['seconds']:,.0f} | {r['rss_mb']:.1f} | {ratios} | "
            f"{r['client_cpu'] / opts.rows * 1e6:.1f} + {r['server_cpu'] / opts.rows * 1e6:.1f} |"
        )
    for r in rounds["imp"]:
        if r["rows"] != opts.rows:
            print(f"import wrote {r['rows']} rows, expected {opts.rows}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
