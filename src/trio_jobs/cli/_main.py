"""``trio-jobs``: the developer's and the operator's entry point.

Every subcommand takes ``--json`` and ``--database-url`` anywhere after its
name. The database is ``--database-url``, else ``$DATABASE_URL``, else the
embedded PostgreSQL under ``./.trio-jobs/`` (started on demand); a subcommand
that touches it migrates it first. A refusal exits 1 printing its ``X_*``
code; a usage error (click's: an unknown option, a missing value) exits 2,
printed the same way as ``X_CONFIG_INVALID`` (``_usage.py``); a worker that
abandons jobs at its drain deadline exits 3 (and so does ``worker --processes
N`` when any of its children did; ``_supervise.py``). Arguments are checked
before any I/O where the command can tell on its own (``_args.py``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click
import orjson

from ._backfills import backfills_command
from ._check import check
from ._common import (
    EXIT_ABANDONED,
    EXIT_REFUSED,
    common_options,
    config_error,
    configure_logging,
    duration,
    flush_logs,
    guarded,
    refuse,
    require_web,
    resolve_database,
    run,
)
from ._operate import OPERATOR_COMMANDS
from ._tasks import TASK_COMMANDS
from ._usage import JobsGroup
from ._verify import verify
from ._webhooks import webhooks_command

__all__ = ["main"]


@click.group(cls=JobsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="trio-jobs", prog_name="trio-jobs")
def main() -> None:
    """Durable background jobs and workflows on Trio."""


def _echo_json(value: Any) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode())


# --------------------------------------------------------------------------- dev


@main.command()
@click.option("--orgs", default=3, show_default=True, help="How many example runs to enqueue.")
@click.option(
    "--serve",
    is_flag=True,
    help="Keep the worker running after the example, with the dashboard, until Ctrl-C.",
)
@click.option(
    "--port", default=8765, show_default=True, type=int, help="The dashboard's port with --serve."
)
@common_options
@guarded
def dev(orgs: int, serve: bool, port: int, as_json: bool, database_url: str | None) -> None:
    """Run the example app against the embedded PostgreSQL, with a worker.

    Zero setup: starts the embedded server under ./.trio-jobs/ (or uses
    --database-url / $DATABASE_URL), migrates it, enqueues the example
    onboarding workflow in one transaction, runs it to completion with a real
    worker and prints the result table.
    """
    from ..drivers._protocol import MAX_ENQUEUE_BATCH
    from ._args import check_port
    from ._dev import _print_rows, run_example

    if not 1 <= orgs <= MAX_ENQUEUE_BATCH:
        raise config_error(f"--orgs is how many runs to enqueue: 1 to {MAX_ENQUEUE_BATCH}")
    check_port(port)
    if serve:
        require_web("dev --serve")
    configure_logging(as_json, logging.WARNING)
    out = run(run_example, orgs, serve, database_url, port, as_json=as_json)
    rows = out["rows"]
    if as_json:
        _echo_json(out)
    elif not serve:
        _print_rows(rows)
        click.echo(f"effects: {out['effects']}   database: {out['database']}")
    unfinished = [r for r in rows if r["state"] != "done"]
    if unfinished and not serve:
        states = ", ".join(sorted({r["state"] for r in unfinished}))
        if out["interrupted"]:
            code, why = "X_DRAINING", "interrupted, the worker drained"
        elif any(r["state"] in ("dead", "failed") for r in unfinished):
            code, why = "X_JOB_MAX_ATTEMPTS", "failed for good"
        else:
            code, why = "X_JOB_TIMEOUT", "not done within a minute"
        click.echo(
            f"{code}: {len(unfinished)} example run(s) did not complete ({why}; states: "
            f"{states}); live ones stay queued, and `trio-jobs worker "
            "trio_jobs.examples.onboarding` runs them",
            err=True,
        )
        sys.exit(EXIT_REFUSED)


# --------------------------------------------------------------------------- migrate


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", default=8765, show_default=True, type=int, help="Port to bind (0: any free port)."
)
@click.option(
    "--auth",
    "auth_target",
    default=None,
    metavar="MODULE:ATTR",
    help="An auth hook (a function of the request answering True for an operator), "
    "imported from the current folder or PYTHONPATH; required to bind anything but loopback.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="HOST[:PORT]",
    help="With --auth: a Host name the dashboard answers to (repeat it; *.example.com for "
    "subdomains, * for any). Without it only localhost and loopback addresses are answered.",
)
@common_options
@guarded
def dashboard(
    host: str,
    port: int,
    auth_target: str | None,
    allowed_hosts: tuple[str, ...],
    as_json: bool,
    database_url: str | None,
) -> None:
    """Serve the dashboard at /admin/jobs and Prometheus metrics at /metrics.

    Without --auth only loopback clients are served, and a non-loopback --host
    is refused with X_CONFIG_INVALID. Requests naming another Host than
    localhost or a loopback address are refused unless --allowed-host lists it
    (with --auth). Ctrl-C (or SIGTERM) stops it.
    """
    from ._args import check_port
    from ._dashboard import check_host, load_attr, serve_dashboard

    check_port(port)
    require_web("dashboard")
    from ..web._security import host_rules  # the web extra is there

    check_host(host, auth_target is not None)
    host_rules(allowed_hosts or None, has_auth=auth_target is not None)
    configure_logging(as_json, logging.WARNING)
    auth = load_attr(auth_target, "--auth") if auth_target is not None else None

    def announce(urls: list[str]) -> None:
        if as_json:
            _echo_json({"ok": True, "urls": [u + "/admin/jobs/" for u in urls]})
        else:
            for url in urls:
                click.echo(f"dashboard: {url}/admin/jobs/   metrics: {url}/metrics")
        flush_logs()

    run(
        serve_dashboard,
        host,
        port,
        database_url,
        auth,
        announce,
        list(allowed_hosts) or None,
        as_json=as_json,
    )


@main.command()
@common_options
@guarded
def migrate(as_json: bool, database_url: str | None) -> None:
    """Create or upgrade the schema; idempotent (safe to run on every deploy)."""
    from ..drivers.postgres import SCHEMA_VERSION
    from ..drivers.postgres import migrate as apply

    async def go() -> tuple[list[int], str, int]:
        db = await resolve_database(database_url)
        if db.kind == "redis":
            # The Redis driver upgrades its key space when it opens: open it.
            from ..drivers.redis import SCHEMA_VERSION as REDIS_VERSION

            driver = db.driver()
            await driver.open()
            await driver.close()
            return [], db.source, REDIS_VERSION
        return await apply(db.dsn), db.source, SCHEMA_VERSION

    applied, source, version = run(go, as_json=as_json)
    if as_json:
        _echo_json({"ok": True, "applied": applied, "version": version, "database": source})
    elif applied:
        click.echo(
            f"migrated to version {version} (applied {', '.join(map(str, applied))}); "
            f"database: {source}"
        )
    else:
        click.echo(f"up to date at version {version}; database: {source}")


# --------------------------------------------------------------------------- worker


@main.command()
@click.argument("target", metavar="MODULE[:ATTR]")
@click.option(
    "--queues",
    default=None,
    help="Comma-separated queues to serve. Default: every queue the jobs declare "
    "(or the queues --concurrency names).",
)
@click.option(
    "--concurrency",
    default="8",
    show_default=True,
    help="Slots per queue: N for every queue, or q1=N,q2=M.",
)
@click.option("--max-in-flight", type=int, default=None, help="Cap on the whole process.")
@click.option("--visibility-timeout", default="30s", show_default=True, help="The claim's lease.")
@click.option(
    "--drain-timeout",
    default="30s",
    show_default=True,
    help="How long SIGTERM waits for held jobs to unwind before abandoning them.",
)
@click.option("--poll-interval", default="250ms", show_default=True, help="Poll while busy.")
@click.option(
    "--idle-poll-max",
    default=None,
    help="Idle poll ceiling. Default: 2s, or 5s once the wake is proven.",
)
@click.option(
    "--purge/--no-purge",
    default=True,
    show_default=True,
    help="Run the hourly retention purge (done rows after 14 d, dead after 90 d).",
)
@click.option(
    "--rate-per-tenant",
    default=None,
    metavar="LIMIT/PER",
    help="At most LIMIT bodies of one tenant started per PER (a duration: 10/1m) by each "
    "worker process; a run over it is deferred, its attempt uncounted.",
)
@click.option(
    "--listen-database-url",
    "listen_database_url",
    envvar="TRIO_JOBS_LISTEN_URL",
    default=None,
    metavar="URL",
    help="Where the LISTEN session connects when the database URL goes through a "
    "transaction-mode pooler (PgBouncer): a direct or session-pooled address. Without it "
    "a pooler that drops notifications is warned about once and the worker polls. "
    "Default: $TRIO_JOBS_LISTEN_URL.",
)
@click.option(
    "--processes",
    type=int,
    default=1,
    show_default=True,
    help="Worker processes under one supervisor (1 to 64): SIGTERM drains them all, and a "
    "child that dies is restarted. 1: this process is the worker.",
)
@common_options
@guarded
def worker(
    target: str,
    queues: str | None,
    concurrency: str,
    max_in_flight: int | None,
    visibility_timeout: str,
    drain_timeout: str,
    poll_interval: str,
    idle_poll_max: str | None,
    purge: bool,
    rate_per_tenant: str | None,
    listen_database_url: str | None,
    processes: int,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Run a worker for the jobs of MODULE (every job at its top level), or of
    the list MODULE:ATTR. SIGTERM drains it (exit 0 once drained); a second
    SIGTERM, or the drain deadline, abandons the held jobs (exit 3).

    With --processes N, a supervisor runs N such workers, each with these
    arguments: SIGTERM (or Ctrl-C) drains them all (exit 0, or 3 when any
    abandoned jobs); a child that dies is restarted after a backoff; a child
    that refuses its configuration at start stops them all with its exit code."""
    from ._supervise import ChildLink
    from ._worker import (
        WorkerOptions,
        check_settings,
        parse_concurrency,
        parse_queues,
        parse_rate,
        serve,
    )

    configure_logging(as_json)
    opts = WorkerOptions(
        target=target,
        queues=parse_queues(queues),
        concurrency=parse_concurrency(concurrency),
        max_in_flight=max_in_flight,
        visibility_timeout=duration(visibility_timeout),
        drain_timeout=duration(drain_timeout),
        poll_interval=duration(poll_interval),
        idle_poll_max=duration(idle_poll_max),
        purge=purge,
        database_url=database_url,
        processes=processes,
        rate_per_tenant=parse_rate(rate_per_tenant),
        listen_database_url=listen_database_url,
    )
    check_settings(opts)
    if processes > 1:
        _supervise(opts, as_json)
        return
    link = ChildLink.from_env()
    summary = run(
        serve, opts, link, as_json=as_json, refused=link.refused if link is not None else None
    )
    if as_json and link is None:  # a supervised worker's summary is its supervisor's to print
        _echo_json({"ok": summary["outcome"] == "drained", **summary})
    if summary["outcome"] != "drained":
        sys.exit(EXIT_ABANDONED)


def _supervise(opts: Any, as_json: bool) -> None:
    """``worker --processes N``: the supervisor, until every child has exited."""
    from .._time import parse_duration
    from ._supervise import Plan, Supervisor, child_command
    from ._worker import DRAIN_GRACE

    drain = parse_duration(opts.drain_timeout, field="--drain-timeout", allow_zero=True)
    plan = Plan(
        command=child_command(click.get_current_context()),
        processes=opts.processes,
        drain_budget=drain + DRAIN_GRACE,
    )
    outcome = run(Supervisor(plan).run, as_json=as_json)
    if outcome.refusal is not None:
        refuse(outcome.refusal, as_json, exit_code=outcome.exit_code)
    if as_json:
        _echo_json(outcome.body())
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


# --------------------------------------------------------------------------- operate

# list, show, retry, cancel, resolve-step, promote, remove, requeue, pause,
# resume, stats, workers, counters (src/trio_jobs/cli/_operate.py).
for _command in OPERATOR_COMMANDS:
    main.add_command(_command)

# backfills (src/trio_jobs/cli/_backfills.py).
main.add_command(backfills_command)
# check: the crash-proof CI gate (src/trio_jobs/cli/_check.py).
main.add_command(check)
# verify: every subject a module declares, against the catalog (src/trio_jobs/cli/_verify.py).
main.add_command(verify)
# tasks, pause-task, resume-task (src/trio_jobs/cli/_tasks.py).
for _command in TASK_COMMANDS:
    main.add_command(_command)
# webhooks: the webhook ledger (src/trio_jobs/cli/_webhooks.py).
main.add_command(webhooks_command)
