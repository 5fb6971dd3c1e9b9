"""``python -m benchmarks.data_cpu``: the client CPU a row of the import's page
parse and the export's page render, with the cyclic collector paused around
the synchronous loops (``paused_gc``) against without, alternated pass by pass
(``time.process_time``: CPU moves less with the box's load than wall time).

The import: ``_csv_page`` over the benchmark's csv rows (1 MiB pages, batches of
5,000, each batch held until the next two are made, as a handle's COPY holds
it). The ndjson import: ``_ndjson_page`` over the same rows as JSON objects,
the same way (its batch loop paused since the fourth session; run this file
with ``PYTHONPATH`` at an older ``src`` for the per-row ``await`` it had). The export: ``render`` of 20,000 rows as the database driver answers them
(paused here by the benchmark itself: the library's export does not pause).
No database: only the library's per-row work is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any

import attrs
import orjson
import trio

from trio_jobs import _export_rows, _import_rows
from trio_jobs._gc_pause import paused_gc

from .data import COLUMNS, NOTE


@attrs.frozen
class Person:
    id: int
    name: str
    email: str
    score: float | None
    active: bool
    note: str


def _lines(start: int, count: int) -> list[str]:
    return [
        f"{i},Person {i},person{i}@example.com,{i % 1000 / 10},"
        f"{'true' if i % 2 else 'false'},{NOTE}"
        for i in range(start, start + count)
    ]


async def _import_pass(pages: list[list[str | None]], batch: int) -> float:
    spec: Any = type("Spec", (), {"columns": COLUMNS, "batch": batch, "max_row_errors": 0})()
    fns = _import_rows._RowFns(Person)
    send, recv = trio.open_memory_channel[Any](2)
    held: list[Any] = []

    async def drain() -> None:
        async for rows in recv:
            held.append(rows)
            del held[:-2]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        start = time.process_time()
        header: list[str] | None = list(COLUMNS)
        for records in pages:
            work = _import_rows._Parse(spec, 0, fns, send)
            header = await _import_rows._csv_page(
                spec, work, (records, None, True, False), False, 1, header
            )
            await work.flush()
        await send.aclose()
        return time.process_time() - start


async def _ndjson_pass(pages: list[list[bytes]], batch: int) -> float:
    spec: Any = type(
        "Spec", (), {"columns": COLUMNS, "batch": batch, "max_row_errors": 0, "schema": Person}
    )()
    fns = _import_rows._RowFns(Person)
    send, recv = trio.open_memory_channel[Any](2)
    held: list[Any] = []

    async def drain() -> None:
        async for rows in recv:
            held.append(rows)
            del held[:-2]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        start = time.process_time()
        for records in pages:
            work = _import_rows._Parse(spec, 0, fns, send)
            await _import_rows._ndjson_page(work, records, None, 1)
            await work.flush()
        await send.aclose()
        return time.process_time() - start


def _export_pass(pages: list[list[tuple[Any, ...]]], paused: bool) -> float:
    # The library's export does not pause (this measures whether it should).
    guard: Any = paused_gc if paused else contextlib.nullcontext
    start = time.process_time()
    for rows in pages:
        with guard():
            _export_rows.render("csv", COLUMNS, rows, "bench")
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_cpu")
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--passes", type=int, default=6)
    args = parser.parse_args()
    per_page = 20_000
    texts = [_lines(s, per_page) for s in range(1, args.rows + 1, per_page)]
    pages: list[list[str | None]] = [list(t) for t in texts]
    rows = [
        [
            (i, f"Person {i}", f"p{i}@example.com", i % 1000 / 10, bool(i % 2), NOTE)
            for i in range(s, s + per_page)
        ]
        for s in range(1, args.rows + 1, per_page)
    ]
    objects = [
        [
            orjson.dumps(
                {
                    "id": i,
                    "name": f"Person {i}",
                    "email": f"person{i}@example.com",
                    "score": i % 1000 / 10,
                    "active": bool(i % 2),
                    "note": NOTE,
                }
            )
            for i in range(s, s + per_page)
        ]
        for s in range(1, args.rows + 1, per_page)
    ]
    n = len(pages) * per_page
    real = _import_rows.paused_gc
    out: dict[str, dict[str, list[float]]] = {"import": {}, "ndjson": {}, "export": {}}
    for k in range(args.passes * 2):
        paused = k % 2 == (k // 2) % 2  # ABBA: on, off, off, on, ...
        label = "paused" if paused else "collector on"
        _import_rows.paused_gc = real if paused else contextlib.nullcontext  # type: ignore[assignment]
        out["import"].setdefault(label, []).append(trio.run(_import_pass, pages, 5_000) / n * 1e6)
        out["ndjson"].setdefault(label, []).append(trio.run(_ndjson_pass, objects, 5_000) / n * 1e6)
        out["export"].setdefault(label, []).append(_export_pass(rows, paused) / n * 1e6)
    _import_rows.paused_gc = real  # type: ignore[misc]
    for phase, runs in out.items():
        for label, us in runs.items():
            print(
                f"{phase:6} {label:12} CPU µs a row: median {statistics.median(us):.2f}, "
                f"min {min(us):.2f}, max {max(us):.2f} ({len(us)} passes)"
            )


if __name__ == "__main__":
    main()
