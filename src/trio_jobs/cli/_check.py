"""``trio-jobs check MODULE``: the crash-proof CI gate (``testing/_check.py``),
with a progress line per job while it runs and a summary table at the end."""

from __future__ import annotations

import importlib
import logging
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import orjson
import trio

from ..errors import ErrorCode, JobsError
from ..testing._check import CheckReport, JobCheck, Progress, check_jobs
from ._args import check_target
from ._common import _jobs_error, refuse
from ._usage import EXIT_USAGE

__all__ = ["check", "import_module", "reproduce_command"]

#: A job failed the gate.
EXIT_FAILED = 1


def _usage(message: str) -> JobsError:
    return JobsError(ErrorCode.X_CONFIG_INVALID, message)


def import_module(name: str) -> ModuleType:
    """The module ``trio-jobs check`` was pointed at (the current folder is importable)."""
    module_name, attr = check_target(name)
    if attr:
        raise _usage("check takes a MODULE (every job at its top level), not MODULE:ATTR")
    here = str(Path.cwd())
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise _usage(
            f"could not import {module_name!r} ({type(exc).__name__}: {exc.name or exc}); run "
            "from the folder that holds it, or put it on PYTHONPATH"
        ) from None
    except Exception as exc:
        raise _usage(
            f"importing {module_name!r} raised {type(exc).__name__}; run "
            f'`python -c "import {module_name}"` to see the traceback'
        ) from None


def reproduce_command(
    module: str,
    examples: int,
    seeds: int,
    as_json: bool,
    job: str,
    k: int | None,
    s: int | None,
    database_url: str | None = None,
) -> str:
    """The ``trio-jobs check`` line that runs one failure again on its own: the
    run's own options, plus ``--job``, ``--example`` and ``--seed``. A password
    in ``database_url`` is left out of it (libpq reads ``PGPASSWORD`` or
    ``~/.pgpass``): a CI log must not show it."""
    words = ["trio-jobs", "check", module]
    if examples != 20:
        words += ["--examples", str(examples)]
    if seeds != 100 and s is None:
        words += ["--seeds", str(seeds)]
    if database_url is not None:
        words += ["--database-url", without_password(database_url)]
    if as_json:
        words.append("--json")
    words += ["--job", job]
    if k is not None:
        words += ["--example", str(k)]
    if s is not None:
        words += ["--seed", str(s)]
    return shlex.join(words)


def without_password(dsn: str) -> str:
    """``dsn`` as given when it holds no password, else the same connection
    without one (as ``key=value`` pairs)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        return dsn  # the gate refuses it anyway, naming no part of it
    if "password" not in params:
        return dsn
    del params["password"]
    return make_conninfo("", **params)


class _Notes(Progress):
    """Under ``--json``: only where the gate runs, on stderr (stdout is the report)."""

    def note(self, text: str) -> None:
        click.echo(f"trio-jobs check: {text}", err=True)


class _Live(Progress):
    """One rich progress line per job: examples x boundaries done, then seeds."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import Progress as Bar
        from rich.progress import TextColumn

        self.bar = Bar(TextColumn("{task.description}"), console=Console(stderr=True))
        self.tasks: dict[str, Any] = {}
        self.examples: dict[str, int] = {}
        self.runs: dict[str, int] = {}

    def job_started(self, name: str, examples: int) -> None:
        self.examples[name] = examples
        self.runs[name] = 0
        self.tasks[name] = self.bar.add_task(f"{name}: drawing inputs", total=None)

    def boundary_done(self, name: str, example: int, done: int, total: int) -> None:
        self.runs[name] += 1
        self.bar.update(
            self.tasks[name],
            description=f"{name}: example {example + 1}/{self.examples[name]}, boundary "
            f"{min(done + 1, total)}/{total} ({self.runs[name]} crash runs)",
        )

    def seed_done(self, name: str, done: int, total: int) -> None:
        self.bar.update(
            self.tasks[name],
            description=f"{name}: {self.runs[name]} crash runs, seed {done}/{total}",
        )

    def note(self, text: str) -> None:
        self.bar.console.print(f"trio-jobs check: {text}", markup=False, highlight=False)

    def job_done(self, result: JobCheck) -> None:
        verdict = "ok" if result.ok else f"FAILED {result.failures[0].code}"
        self.bar.update(
            self.tasks[result.name],
            description=f"{result.name}: {verdict} ({result.examples} examples, "
            f"{result.boundaries} boundaries, {result.seeds} seeds)",
        )


def _table(report: CheckReport) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="trio-jobs check")
    for column in ("job", "examples", "boundaries", "seeds", "result"):
        table.add_column(
            column, justify="right" if column in ("examples", "boundaries", "seeds") else "left"
        )
    for job in report.jobs:
        verdict = "ok" if job.ok else ", ".join(f.code for f in job.failures)
        table.add_row(job.name, str(job.examples), str(job.boundaries), str(job.seeds), verdict)
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    for job in report.jobs:
        for failure in job.failures:
            where = f"seed {failure.seed}" if failure.seed is not None else failure.boundary
            example = "every example" if failure.example is None else f"example {failure.example}"
            console.print(
                f"{job.name}: {failure.code} at {where}, {example}: {failure.message}", markup=False
            )
            console.print(f"  reproduce: {failure.reproduce}", markup=False)


@click.command()
@click.argument("module", metavar="MODULE")
@click.option("--job", "job_name", default=None, metavar="NAME", help="Check only this job.")
@click.option(
    "--examples",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Inputs per job, when the module's trio_jobs_examples does not give them.",
)
@click.option(
    "--seeds", type=click.IntRange(min=0), default=100, show_default=True,
    help="Simulation seeds per job (0 to 99 by default).",
)  # fmt: skip
@click.option(
    "--example", type=click.IntRange(min=0), default=None, metavar="K",
    help="Only the job's example K (0-based), as a failure's reproduce line names it.",
)  # fmt: skip
@click.option(
    "--seed", type=click.IntRange(min=0), default=None, metavar="S",
    help="Only simulation seed S (and no crash runs), as a failure's reproduce line names it.",
)  # fmt: skip
@click.option(
    "--database-url",
    "database_url",
    default=None,
    metavar="DSN",
    help="Run the crash runs on PostgreSQL, in a throwaway schema made and dropped by the "
    "gate (simulation seeds stay on the memory driver). Default: the memory driver; "
    "$DATABASE_URL is never read.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check(
    module: str,
    job_name: str | None,
    examples: int,
    seeds: int,
    example: int | None,
    seed: int | None,
    database_url: str | None,
    as_json: bool,
) -> None:
    """Kill every job of MODULE at every boundary, replay it for determinism,
    and race it on seeded schedules; exit 0 when every job passes, 1 when one
    fails (each failure with a one-line reproduce command), 2 when the gate
    cannot run (a module that does not import or has no jobs, inputs
    Hypothesis cannot build, a hook that raises, a database it cannot reach).

    Inputs are the module's trio_jobs_examples[name], else drawn from the
    job's input type by Hypothesis (the same ones every run). The module may
    define trio_jobs_observe() and trio_jobs_reset() (sync or async) and
    trio_jobs_invariant(world).

    With --database-url the crash runs and replay checks run on PostgreSQL in
    a throwaway schema the gate makes and drops (its name is said on stderr);
    the simulation seeds stay on the memory driver."""
    if (example is not None or seed is not None) and job_name is None:
        refuse(
            _usage("--example and --seed name one job's run: add --job NAME"), as_json, EXIT_USAGE
        )
    driver = None
    if database_url is not None:
        if not database_url.strip():
            # An empty DSN would fall back to $DATABASE_URL, which check never reads.
            refuse(_usage("--database-url is empty; give a PostgreSQL URL"), as_json, EXIT_USAGE)
        from ._common import is_redis_url

        if is_redis_url(database_url):
            refuse(
                _usage(
                    "--database-url names a Redis server; check runs its crash runs on "
                    "PostgreSQL (give a postgresql:// URL) or on the memory driver (leave it out)"
                ),
                as_json,
                EXIT_USAGE,
            )
        from ..drivers.postgres import postgres_driver

        driver = postgres_driver(database_url)
    logging.getLogger("trio_jobs").setLevel(logging.CRITICAL)  # the gate reports, not the logs

    def reproduce(name: str, k: int | None, s: int | None) -> str:
        return reproduce_command(module, examples, seeds, as_json, name, k, s, database_url)

    live = None if as_json else _Live()
    try:
        target = import_module(module)

        async def go() -> CheckReport:
            return await check_jobs(
                target,
                examples=examples,
                seeds=seeds,
                job=job_name,
                example=example,
                seed=seed,
                progress=live or _Notes(),
                reproduce=reproduce,
                driver=driver,
            )

        if live is not None:
            with live.bar:
                report = trio.run(go)
        else:
            report = trio.run(go)
    except BaseException as exc:
        error = _jobs_error(exc)
        if error is None:
            raise
        refuse(error, as_json, EXIT_USAGE)
    if as_json:
        click.echo(orjson.dumps(report.to_json()).decode())
    else:
        _table(report)
    if not report.ok:
        sys.exit(EXIT_FAILED)
