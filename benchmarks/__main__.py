"""``python -m benchmarks [--only NAME] [--runs N]``: run the benchmarks, print a table.

``python -m benchmarks SUITE [options]`` runs a suite with its own command line
instead (see ``SUITES``), e.g. ``python -m benchmarks postgres``.

``--profile`` runs each selected benchmark once under cProfile instead and
prints where the time goes (the hot spots named in ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import sys
from collections.abc import Sequence

import trio

from .memory import BENCHMARKS, DEFAULT_CONCURRENCY, DEFAULT_JOBS, Result, profiling

#: Suites with their own command line: ``python -m benchmarks NAME [options]``
#: calls ``main(options)`` of the module (imported only when asked for).
SUITES: dict[str, str] = {
    "postgres": "benchmarks.postgres",
    "cpu": "benchmarks.cpu",
    "rate": "benchmarks.rate",
    "receiver": "benchmarks.receiver",
    "redis": "benchmarks.redis",
    "trio-primitives": "benchmarks.trio_primitives",
    "check-gate": "benchmarks.check_gate",
    "children": "benchmarks.children",
    "data": "benchmarks.data",
    "subjects": "benchmarks.subjects",
    "webhooks": "benchmarks.webhooks",
    "fleet": "benchmarks.fleet",
    "big-table": "benchmarks.big_table",
    "autovacuum": "benchmarks.autovacuum",
    "prepared": "benchmarks.prepared",
    "statements": "benchmarks.statements",
    "enqueue-cpu": "benchmarks.enqueue_cpu",
}


def machine() -> str:
    """One line naming the machine the figures come from."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"CPython {platform.python_version()}, trio {trio.__version__}"
    )


def _fmt(value: float, unit: str) -> str:
    return f"{value:,.2f}" if unit == "ms" else f"{value:,.0f}"


def table(results: Sequence[Result], runs: int) -> str:
    """The results as a Markdown table: median first, then the spread."""
    lines = [
        f"| benchmark | configuration | median ({runs} runs) | best | worst | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.config} | **{_fmt(r.median, r.unit)} {r.unit}** | "
            f"{_fmt(r.best, r.unit)} | {_fmt(r.worst, r.unit)} | {r.note} |"
        )
    return "\n".join(lines)


def _parse_concurrency(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of whole numbers") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("concurrency values are whole numbers, 1 or more")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0] in SUITES:
        import importlib

        suite_main = importlib.import_module(SUITES[given[0]]).main
        return int(suite_main(given[1:]))
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per configuration (default 5)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=DEFAULT_JOBS,
        help=f"jobs per throughput run (default {DEFAULT_JOBS:,})",
    )
    parser.add_argument(
        "--concurrency",
        type=_parse_concurrency,
        default=DEFAULT_CONCURRENCY,
        help="worker concurrencies to sweep, comma-separated (default "
        + ",".join(map(str, DEFAULT_CONCURRENCY))
        + ")",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run each selected benchmark once under cProfile and print the hot spots",
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.jobs < 1:
        parser.error("--runs and --jobs take whole numbers, 1 or more")
    names = args.only or list(BENCHMARKS)
    print(f"machine: {machine()}")
    print(
        f"command: python -m benchmarks {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip()
    )
    if args.profile:
        for name in names:
            _profile(name, args.jobs, args.concurrency[0])
        return 0
    results: list[Result] = []
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results.extend(
            BENCHMARKS[name](runs=args.runs, jobs=args.jobs, concurrency=args.concurrency)
        )
    print()
    print(table(results, args.runs))
    return 0


def _profile(name: str, jobs: int, concurrency: int) -> None:
    """One run of ``name`` with cProfile on for its timed part only (for
    ``replay1000``: the replay attempt): the top functions by own time, then by
    cumulative time within trio_jobs. cProfile slows the run several times over,
    so read the shares, not the absolute figures."""
    profiler = cProfile.Profile()
    with profiling(profiler):
        BENCHMARKS[name](runs=1, jobs=jobs, concurrency=(concurrency,))
    print(f"\n=== {name} (1 run, concurrency {concurrency}) — by own time ===")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.strip_dirs().sort_stats("tottime").print_stats(25)
    print(f"=== {name} — trio_jobs functions by cumulative time ===")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("cumtime").print_stats(r"trio_jobs", 25)


if __name__ == "__main__":
    raise SystemExit(main())
