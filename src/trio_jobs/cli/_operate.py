"""The operator commands: ``list``, ``show``, ``retry``, ``cancel``,
``resolve-step``, ``promote``, ``remove``, ``requeue``, ``pause``, ``resume``,
``stats``, ``workers`` and ``counters``.

Each one opens the facade over the PostgreSQL driver (which migrates the
database first), calls one member of the operator surface (the spec's
``JobIntrospection``, through :class:`~trio_jobs.Jobs`) and prints a rich table,
or with ``--json`` a stable JSON shape (see ``docs/reference/cli.md``). A
refusal prints its ``X_*`` code and exits 1.

The command imports no job module, so it learns whether a job is sensitive
from the row: ``JobView.sensitive``, stored at enqueue from the job's
``sensitive=True``. A row that does not say (``None``: enqueued before the flag
was stored) is treated as sensitive. A sensitive row's payload, result, step
outputs and keys print as ``[redacted]``; its error stays visible.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import click
import orjson

from ..drivers._backfills import BackfillRow
from ..drivers._protocol import (
    ALL_STATES,
    MAX_BULK_ROWS,
    BulkAction,
    BulkPreview,
    BulkResult,
    CounterRow,
    JobPage,
    JobView,
    QueueStats,
    WorkerInfo,
)
from ..errors import ErrorCode, JobsError
from ._args import (
    check_id,
    check_id_prefix,
    check_job_name,
    check_page,
    check_queue,
    check_reason,
    check_step,
    check_tenant,
)
from ._common import (
    EXIT_REFUSED,
    common_options,
    config_error,
    configure_logging,
    guarded,
    log_event,
    run,
)

if TYPE_CHECKING:
    from .._facade import Jobs

T = TypeVar("T")

__all__ = [
    "OPERATOR_COMMANDS",
    "REDACTED",
    "VIEW_FIELDS",
    "backfill_json",
    "ledger_rows",
    "page_json",
    "view_json",
]

#: What a sensitive job's payload, result, step outputs and keys print as.
REDACTED = "[redacted]"

#: The fields of ``show --json`` (and of each ``list --json`` row): every field of
#: :class:`JobView`, in its order, then what the CLI derives.
VIEW_FIELDS: tuple[str, ...] = (
    "id",
    "run_id",
    "name",
    "queue",
    "state",
    "attempts",
    "max_attempts",
    "tenant_id",
    "idempotency_key",
    "concurrency_key",
    "run_at",
    "created_at",
    "error_code",
    "last_error",
    "progress",
    "result",
    "steps",
    "payload",
    "priority",
    "updated_at",
    "worker_id",
    "sensitive",
    "attempt_log",
    "consumer",
    "parent_id",
    "children",
    # derived
    "next_retry",
    "redacted",
    "backfill",
)

_WAITING = ("ready", "delayed")
_STATE_HELP = ", ".join(ALL_STATES)


# --------------------------------------------------------------------------- shapes


def redacts(view: JobView) -> bool:
    """Whether the CLI hides ``view``'s values: declared sensitive, or the row
    does not say."""
    return view.sensitive is not False


def backfill_json(row: BackfillRow, *, hide: bool = False) -> dict[str, Any]:
    """One pass as ``--json`` prints it: the fields of :class:`~trio_jobs.BackfillRow`
    (``hide``: a sensitive job's cursor redacted)."""
    return {
        "name": row.name,
        "job_id": row.job_id,
        "pages": row.pages,
        "items": row.items,
        "cursor": REDACTED if hide and row.cursor is not None else row.cursor,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
    }


async def ledger_rows(jobs: Jobs, views: Sequence[JobView]) -> dict[str, BackfillRow]:
    """The backfill ledger's rows of the passes among ``views``, by job id, in
    one round trip (none without a ledger or a view)."""
    ledger = jobs.driver.backfills
    if ledger is None or not views:
        return {}
    return {r.job_id: r for r in await ledger.rows([v.id for v in views])}


def view_json(view: JobView, backfill: BackfillRow | None = None) -> dict[str, Any]:
    """``show --json``: the :class:`JobView` fields, a sensitive row's values
    redacted, plus ``next_retry`` (``run_at`` while ready or delayed, else
    ``null``), ``redacted``, and ``backfill``: the pass's ledger row when the
    job is a ``backfill()`` pass (see :func:`ledger_rows`), else ``null``."""
    hide = redacts(view)

    def value(v: Any) -> Any:
        return REDACTED if hide and v is not None else v

    progress = view.progress
    return {
        "id": view.id,
        "run_id": view.run_id,
        "name": view.name,
        "queue": view.queue,
        "state": view.state,
        "attempts": view.attempts,
        "max_attempts": view.max_attempts,
        "tenant_id": view.tenant_id,
        "idempotency_key": value(view.idempotency_key),
        "concurrency_key": value(view.concurrency_key),
        "run_at": view.run_at,
        "created_at": view.created_at,
        "error_code": view.error_code,
        "last_error": view.last_error,
        "progress": None
        if progress is None
        else {"done": progress.done, "total": progress.total, "note": progress.note},
        "result": value(view.result),
        "steps": [
            {
                "name": s.name,
                "status": s.status,
                "executions": s.executions,
                "output": value(s.output),
                "error": s.error,
            }
            for s in view.steps
        ],
        "payload": value(view.payload),
        "priority": view.priority,
        "updated_at": view.updated_at,
        "worker_id": view.worker_id,
        "sensitive": view.sensitive,
        # each claim: its times, outcome, code and first line (a sensitive job's
        # line is redacted, as on the dashboard)
        "attempt_log": [
            {
                **attrs.asdict(a),
                "error": REDACTED if hide and a.error is not None else a.error,
            }
            for a in view.attempt_log
        ],
        # a consumer run's key, last batch and lag (null for any other job)
        "consumer": None
        if view.consumer is None
        else {**view.consumer, "key": value(view.consumer.get("key"))},
        # step.invoke/step.gather: the run that enqueued this one, and the runs
        # this one enqueued (ids only)
        "parent_id": view.parent_id,
        "children": list(view.children),
        "next_retry": view.run_at if view.state in _WAITING else None,
        "redacted": hide,
        "backfill": None if backfill is None else backfill_json(backfill, hide=hide),
    }


def page_json(page: JobPage, ledger: dict[str, BackfillRow] | None = None) -> dict[str, Any]:
    """``list --json``: ``{"rows": [...], "after": ..., "before": ...}``; each
    row carries its pass's ledger row (``ledger``, by job id) under ``backfill``."""
    found = ledger or {}
    return {
        "rows": [view_json(v, found.get(v.id)) for v in page.rows],
        "after": page.after,
        "before": page.before,
    }


def stats_json(stats: Sequence[QueueStats], paused: Sequence[str]) -> dict[str, Any]:
    rows = {s.queue: s for s in stats}
    for queue in paused:  # a paused queue with no rows yet is still worth a line
        rows.setdefault(queue, QueueStats(queue))
    return {
        "queues": [
            {
                "queue": s.queue,
                "paused": s.queue in paused,
                "depth": s.depth,
                **{state: getattr(s, state) for state in ALL_STATES},
            }
            for s in sorted(rows.values(), key=lambda s: s.queue)
        ]
    }


def worker_json(info: WorkerInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "host": info.host,
        "pid": info.pid,
        "started_at": info.started_at,
        "queues": list(info.queues),
        "slots": dict(info.slots),
        "in_flight": list(info.in_flight),
        "last_heartbeat": info.last_heartbeat,
    }


def counter_json(row: CounterRow) -> dict[str, Any]:
    return {
        "bucket": row.bucket,
        "name": row.name,
        "done": row.done,
        "retried": row.retried,
        "failed": row.failed,
        "dead": row.dead,
        "duration": row.duration,
    }


def counter_totals(rows: Sequence[CounterRow]) -> list[dict[str, Any]]:
    """Per job name over the window: the counts, and the seconds spent settling them."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        t = out.setdefault(
            r.name,
            {"name": r.name, "done": 0, "retried": 0, "failed": 0, "dead": 0, "duration": 0.0},
        )
        for field in ("done", "retried", "failed", "dead"):
            t[field] += getattr(r, field)
        t["duration"] += r.duration
    return [out[name] for name in sorted(out)]


# --------------------------------------------------------------------------- input


def parse_moment(text: str | None, flag: str) -> tuple[str, float] | None:
    """A point in time: an ISO 8601 datetime (``2026-11-29T20:00:00Z``; without
    an offset, UTC) or a duration ago (``90s``, ``1h``, ``2d``, seconds).
    Answers ``("at", epoch)`` or ``("ago", seconds)``; checked before any I/O."""
    if text is None:
        return None
    from .._time import parse_duration

    with contextlib.suppress(JobsError):
        return ("ago", parse_duration(text, field=flag, allow_zero=True))
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise config_error(
            f"{flag} takes an ISO 8601 datetime (2026-11-29T20:00:00Z) or a duration ago "
            "(90s, 15m, 1h, 2d)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return ("at", when.timestamp())


def _resolve_moment(moment: tuple[str, float] | None, now: float) -> float | None:
    if moment is None:
        return None
    kind, value = moment
    return now - value if kind == "ago" else value


def _json_arg(text: str, flag: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        # Never echoed: it may be a value the operator should not see in a log.
        raise config_error(f"{flag} must be JSON (quote a string: --output '\"sent\"')") from None


def _check_scope(queue: str | None, name: str | None, tenant: str | None) -> None:
    """``--queue``, ``--name`` and ``--tenant``, checked before any I/O."""
    check_queue(queue, "--queue")
    check_job_name(name, "--name")
    check_tenant(tenant)


def _one_or_bulk(
    job_id: str | None,
    state: str | None,
    *,
    dry_run: bool = False,
    yes: bool = False,
    **scope: str | None,
) -> None:
    given = [f"--{k.replace('_', '-')}" for k, v in scope.items() if v is not None]
    if job_id is not None and (state is not None or given):
        raise config_error(
            "pass a job ID, or --state (with --queue/--name/--tenant) for every matching "
            "job, not both"
        )
    if job_id is not None and (dry_run or yes):
        raise config_error(
            "--dry-run and --yes go with --state (every matching job); one job by ID needs neither"
        )
    if dry_run and yes:
        raise config_error("pass --dry-run (change nothing) or --yes (go ahead), not both")
    if job_id is None and state is None:
        raise config_error(
            "name a job ID, or pass --state (and optionally --queue/--name/--tenant) for "
            "every matching job"
        )
    if job_id is not None:
        check_id(job_id)


# --------------------------------------------------------------------------- the database


async def queue_known(jobs: Jobs, queue: str, declared: Sequence[str] = ()) -> bool:
    """Whether ``queue`` is one anything knows: a job declares it (``declared``,
    the queues of the jobs a worker loaded), a job is in it, or a live worker
    serves it. ``pause`` and ``worker --queues`` warn when none does: a typo."""
    if queue in declared:
        return True
    if any(s.queue == queue for s in await jobs.stats()):
        return True
    if jobs.driver.introspect is None:
        return False
    return any(queue in w.queues for w in await jobs.workers())


@contextlib.asynccontextmanager
async def open_operator(database_url: str | None) -> AsyncIterator[Jobs]:
    """The facade over the resolved database (migrated on open). No job module is
    imported: the operator surface needs none."""
    from .._facade import open_jobs
    from ._common import resolve_database

    db = await resolve_database(database_url)
    async with open_jobs(db.driver(pool_size=2)) as jobs:
        yield jobs


def _operate(fn: Callable[[Jobs], Awaitable[T]], database_url: str | None, as_json: bool) -> T:
    """Run ``await fn(jobs)`` on a fresh facade; a JobsError is a refusal."""

    async def go() -> T:
        async with open_operator(database_url) as jobs:
            return await fn(jobs)

    configure_logging(as_json, logging.WARNING, plain=True)
    return run(go, as_json=as_json)


# --------------------------------------------------------------------------- output


def _echo_json(value: Any) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode())


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty() and "COLUMNS" not in os.environ:
        width = 160  # a pipe or a file: wide enough for ids, names and codes
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def _text(value: Any) -> Any:
    """A cell: queue content is text, never rich markup."""
    from rich.text import Text

    return Text("" if value is None else str(value))


def _iso(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _ago(seconds: float) -> str:
    s = abs(seconds)
    if s < 1:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            amount = f"{s / size:.0f}{unit}"
            break
    else:
        amount = f"{s:.0f}s"
    return f"{amount} ago" if seconds >= 0 else f"in {amount}"


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return ""
    return f"{_iso(ts)} ({_ago(now - ts)})"


def _compact(value: Any) -> str:
    if isinstance(value, str) and value == REDACTED:
        return REDACTED
    return orjson.dumps(value, default=str).decode()


def _table(
    title: str | None, columns: Sequence[str], *, whole: Sequence[str] = ("id",), **kw: Any
) -> Any:
    """A table; the ``whole`` columns (ids) never wrap, so they paste back intact."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        pad_edge=False,
        collapse_padding=True,
        **kw,
    )
    for col in columns:
        table.add_column(col, overflow="fold", no_wrap=col in whole)
    return table


def _attempts(v: dict[str, Any]) -> str:
    return f"{v['attempts']} / {v['max_attempts']}"


def _print_view(v: dict[str, Any], now: float) -> None:
    con = _console()
    head = _table(None, ("field", "value"), show_header=False)
    rows: list[tuple[str, Any]] = [
        ("job", v["id"]),
        ("name", v["name"]),
        ("queue", v["queue"]),
        ("state", v["state"]),
        ("attempts", _attempts(v)),
        ("next retry", _next_run(v, now)),
        ("run id", v["run_id"]),
        ("tenant", v["tenant_id"] or "-"),
        ("idempotency key", v["idempotency_key"]),
        ("concurrency key", v["concurrency_key"] or "-"),
        ("priority", v["priority"]),
        ("created", _when(v["created_at"], now)),
        ("updated", _when(v["updated_at"], now)),
    ]
    if v["worker_id"]:
        rows.append(("worker", v["worker_id"]))
    p = v["progress"]
    if p is not None:
        pct = f" ({100 * p['done'] / p['total']:.0f}%)" if p["total"] else ""
        note = f" {p['note']}" if p["note"] else ""
        rows.append(("progress", f"{p['done']:g} / {p['total']:g}{pct}{note}"))
    b = v["backfill"]
    if b is not None:
        at = "done" if b["finished_at"] is not None else f"next page at {_compact(b['cursor'])}"
        rows.append(("backfill", f"{b['pages']} page(s), {b['items']} item(s) handled; {at}"))
    if v["state"] in ("dead", "failed"):
        rows.append(("dead-letter reason", _reason(v)))
    elif v["error_code"] or v["last_error"]:
        rows.append((_error_label(v["state"]), _reason(v)))
    rows.append(
        ("sensitive", {True: "yes", False: "no", None: "unknown (treated as yes)"}[v["sensitive"]])
    )
    for label, value in rows:
        head.add_row(_text(label), _text(value))
    con.print(head)
    steps = _table("steps", ("#", "step", "status", "executions", "output", "error"))
    for i, s in enumerate(v["steps"], start=1):
        steps.add_row(
            _text(i),
            _text(s["name"]),
            _text(s["status"]),
            _text(s["executions"]),
            _text("" if s["output"] is None else _compact(s["output"])),
            _text(s["error"] or ""),
        )
    if v["steps"]:
        con.print(steps)
    else:
        con.print(_text("steps: none recorded"), soft_wrap=True)
    con.print(_text(f"payload: {_compact(v['payload'])}"), soft_wrap=True)
    if v["result"] is not None:
        con.print(_text(f"result: {_compact(v['result'])}"), soft_wrap=True)
    hint = _next_step_hint(v)
    if hint:
        con.print(_text(hint), soft_wrap=True)


def _next_run(v: dict[str, Any], now: float) -> str:
    """``show``'s next retry: ``due now`` once ``run_at`` has passed (the next
    claim takes it), else when; ``-`` for a job that is not waiting."""
    when = v["next_retry"]
    if when is None:
        return "-"
    if when <= now:
        return f"due now (since {_iso(when)})"
    return _when(when, now)


def _error_label(state: str) -> str:
    """What a row's error is to its state: a live or done job's error is an
    earlier attempt's (the run went on, or since succeeded), a cancelled job's
    the cancel's."""
    if state == "cancelled":
        return "cancelled"
    if state == "done":
        return "earlier attempt's error"
    return "last error"


def _short_error(v: dict[str, Any]) -> str:
    """A list row's error: its code, else the start of its message; a done
    job's says it was an earlier attempt's."""
    if v["error_code"]:
        error = str(v["error_code"])
    else:
        # The error's own clause; the show page has the rest.
        error = str(v["last_error"] or "").split(" — ")[0]
        error = error if len(error) <= 60 else error[:59] + "…"
    if error and v["state"] == "done":
        return f"(earlier) {error}"
    return error


def _reason(v: dict[str, Any]) -> str:
    code, error = v["error_code"], v["last_error"]
    if code and error and not error.startswith(code):
        return f"{code}: {error}"
    return error or code or ""


def _next_step_hint(v: dict[str, Any]) -> str:
    if v["error_code"] == ErrorCode.X_STEP_OUTCOME_UNKNOWN and v["state"] in ("dead", "failed"):
        unknown = [s["name"] for s in v["steps"] if s["status"] in ("started", "failed")]
        step = unknown[-1] if unknown else "STEP"
        return (
            f"a once step's outcome is unknown: trio-jobs resolve-step {v['id']} {step} "
            f"--ran --output JSON (or --not-ran), then trio-jobs retry {v['id']}"
        )
    if v["state"] in ("dead", "failed", "cancelled"):
        return f"requeue it: trio-jobs retry {v['id']} (completed steps replay from storage)"
    return ""


def _due(v: dict[str, Any], now: float) -> str:
    """When a waiting job runs: ``now`` once its ``run_at`` has passed (it runs at
    the next claim), else how far off."""
    when = v["next_retry"]
    if when is None:
        return ""
    return "now" if when <= now else _ago(now - when)


def _page_table(page: dict[str, Any], now: float, width: int, title: str) -> Any:
    """``list``'s table of ``page["rows"]``: a column no row fills (no job waits,
    none failed) is left out."""
    cells = [
        {
            "id": v["id"],
            "name": v["name"],
            "queue": v["queue"],
            "state": v["state"],
            "attempts": _attempts(v),
            "created": _ago(now - v["created_at"]),
            "due": _due(v, now),
            "error": _short_error(v),
        }
        for v in page["rows"]
    ]
    columns = (
        [c for c in cells[0] if c not in ("due", "error") or any(r[c] for r in cells)]
        if cells
        else []
    )
    if "error" in columns:
        # The error takes what the other columns leave of the line (the show
        # page has all of it), so the table never folds its ids or names.
        used = sum(max(len(c), *(len(r[c]) for r in cells)) for c in columns if c != "error")
        room = max(12, width - used - 2 * (len(columns) - 1) - 2)  # the box edges
        for r in cells:
            if len(r["error"]) > room:
                r["error"] = r["error"][: room - 1] + "…"
    table = _table(title, columns, whole=("id", "name"))
    for row in cells:
        table.add_row(*(_text(row[c]) for c in columns))
    return table


def _print_page(page: dict[str, Any], now: float, shown_filters: str) -> None:
    con = _console()
    if not page["rows"]:
        con.print(_text(f"no job matches{shown_filters}"), soft_wrap=True)
    else:
        title = f"{len(page['rows'])} job(s){shown_filters}, newest first"
        con.print(_page_table(page, now, con.width, title))
    if page["after"]:
        con.print(_text(f"older: --after {page['after']}"), soft_wrap=True)
    if page["before"]:
        con.print(_text(f"newer: --before {page['before']}"), soft_wrap=True)


def _done(message: str, as_json: bool, body: dict[str, Any]) -> None:
    if as_json:
        _echo_json({"ok": True, **body})
    else:
        click.echo(message)


# --------------------------------------------------------------------------- commands


def _scope_options(fn: Any) -> Any:
    fn = click.option("--tenant", "tenant", default=None, help="Only this tenant's jobs.")(fn)
    fn = click.option("--name", "name", default=None, help="Only jobs of this name.")(fn)
    fn = click.option("--queue", "queue", default=None, help="Only jobs in this queue.")(fn)
    return fn


_STATE = click.Choice(ALL_STATES)


@click.command("list")
@_scope_options
@click.option("--state", type=_STATE, default=None, help="Only jobs in this state.")
@click.option("--id-prefix", default=None, help="Only jobs whose id starts with this.")
@click.option(
    "--created-from",
    default=None,
    metavar="WHEN",
    help="Created at or after WHEN: an ISO 8601 datetime (UTC when it has no offset) "
    "or a duration ago (90s, 15m, 1h, 2d).",
)
@click.option("--created-to", default=None, metavar="WHEN", help="Created before WHEN.")
@click.option("--limit", default=50, show_default=True, help="Rows per page (at most 200).")
@click.option("--after", default=None, metavar="CURSOR", help="The page older than this one.")
@click.option("--before", default=None, metavar="CURSOR", help="The page newer than this one.")
@common_options
@guarded
def list_command(
    queue: str | None,
    name: str | None,
    tenant: str | None,
    state: str | None,
    id_prefix: str | None,
    created_from: str | None,
    created_to: str | None,
    limit: int,
    after: str | None,
    before: str | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """List jobs, newest first, one keyset page at a time.

    The footer prints the --after cursor of the next (older) page and the
    --before cursor of the previous (newer) one.
    """
    _check_scope(queue, name, tenant)
    check_id_prefix(id_prefix)
    check_page(limit, after, before)
    start = parse_moment(created_from, "--created-from")
    end = parse_moment(created_to, "--created-to")

    async def go(jobs: Jobs) -> tuple[JobPage, dict[str, BackfillRow], float]:
        now = float(jobs.driver.now())
        page = await jobs.list(
            queue=queue,
            name=name,
            state=state,
            tenant_id=tenant,
            id_prefix=id_prefix,
            created_from=_resolve_moment(start, now),
            created_to=_resolve_moment(end, now),
            limit=limit,
            after=after,
            before=before,
        )
        ledger = await ledger_rows(jobs, page.rows) if as_json else {}
        return page, ledger, now

    page, ledger, now = _operate(go, database_url, as_json)
    body = page_json(page, ledger)
    if as_json:
        _echo_json(body)
        return
    filters = ", ".join(
        f"{k}={v}"
        for k, v in (("queue", queue), ("name", name), ("state", state), ("tenant", tenant))
        if v is not None
    )
    _print_page(body, now, f" ({filters})" if filters else "")


@click.command("show")
@click.argument("job_id", metavar="ID")
@common_options
@guarded
def show_command(job_id: str, as_json: bool, database_url: str | None) -> None:
    """Show one job: state, attempts, next retry, keys, progress, the step
    timeline with executions and outputs, and the dead-letter reason.

    A job declared sensitive=True (or a row that does not say) shows its
    payload, result, step outputs and keys as [redacted].
    """
    check_id(job_id)

    async def go(jobs: Jobs) -> tuple[JobView, BackfillRow | None, float]:
        try:
            view = await jobs.show(job_id)
        except JobsError as exc:
            if exc.code != ErrorCode.X_JOB_NOT_FOUND:
                raise
            # this process cannot know the app's driver options: say both readings
            raise JobsError(
                ErrorCode.X_JOB_NOT_FOUND,
                "not found: no job has that id (an app whose driver runs with"
                " done_retention=0 keeps no done rows, so a job that finished done is"
                " not found either); list jobs with `trio-jobs list`",
                meta=dict(exc.meta),
            ) from None
        row = (await ledger_rows(jobs, [view])).get(view.id)
        return view, row, float(jobs.driver.now())

    view, row, now = _operate(go, database_url, as_json)
    body = view_json(view, row)
    if as_json:
        _echo_json(body)
    else:
        _print_view(body, now)


@click.command("retry")
@click.argument("job_id", metavar="ID")
@click.option(
    "--from-step",
    default=None,
    metavar="STEP",
    help="Drop STEP and every step recorded after it, so they run again.",
)
@common_options
@guarded
def retry_command(
    job_id: str, from_step: str | None, as_json: bool, database_url: str | None
) -> None:
    """Requeue a finished job (done, failed, dead or cancelled) with its
    attempts reset; completed steps replay from storage."""
    check_id(job_id)
    check_step(from_step, "--from-step")

    async def go(jobs: Jobs) -> JobView:
        return await jobs.requeue(job_id, from_step)

    view = _operate(go, database_url, as_json)
    since = f" from step {from_step}" if from_step else ""
    _done(
        f"requeued {view.id} ({view.name}){since}: {view.state}",
        as_json,
        {"action": "retry", "job": view_json(view)},
    )


@click.command("cancel")
@click.argument("job_id", metavar="ID")
@click.option("--reason", required=True, help="Why: recorded as the job's last error.")
@common_options
@guarded
def cancel_command(job_id: str, reason: str, as_json: bool, database_url: str | None) -> None:
    """Cancel a live job (ready, delayed, running or suspended). A running body
    hears X_ABORTED at its next heartbeat."""
    check_id(job_id)
    check_reason(reason)

    async def go(jobs: Jobs) -> JobView:
        return await jobs.cancel(job_id, reason)

    view = _operate(go, database_url, as_json)
    _done(
        f"cancelled {view.id} ({view.name}): {view.state}",
        as_json,
        {"action": "cancel", "job": view_json(view)},
    )


@click.command("resolve-step")
@click.argument("job_id", metavar="ID")
@click.argument("step", metavar="STEP")
@click.option("--ran", "ran", flag_value=True, default=None, help="The step ran.")
@click.option("--not-ran", "ran", flag_value=False, help="The step did not run.")
@click.option(
    "--output",
    default=None,
    metavar="JSON",
    help="With --ran: what the step returned, as JSON (default null).",
)
@common_options
@guarded
def resolve_step_command(
    job_id: str,
    step: str,
    ran: bool | None,
    output: str | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Resolve a once step whose outcome is unknown (the run stopped on
    X_STEP_OUTCOME_UNKNOWN): it ran, with --output, or it did not, and runs
    again. Then `trio-jobs retry ID`."""
    check_id(job_id)
    check_step(step, "STEP")
    if ran is None:
        raise config_error("say what happened: --ran (with --output JSON) or --not-ran")
    if not ran and output is not None:
        raise config_error("--output goes with --ran: a step that did not run has no output")
    value = _json_arg(output, "--output") if output is not None else None
    if value is not None:
        from .._serialization import payload_form

        # The facade's own check, before the database is opened.
        payload_form(value, what="--output", code=ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE)

    async def go(jobs: Jobs) -> str:
        key = await jobs.resolve_id(job_id)
        await jobs.resolve_step(key, step, ran=ran, output=value)
        return key

    resolved = _operate(go, database_url, as_json)
    said = "ran" if ran else "did not run"
    _done(
        f"step {step} of {resolved} resolved: it {said}; now `trio-jobs retry {resolved}`",
        as_json,
        {"action": "resolve-step", "id": resolved, "step": step, "ran": ran},
    )


#: How many of the jobs a bulk command would move its preview lists.
PREVIEW_SAMPLE = 10

#: What each bulk command does to a job, for its preview and its question.
_DOES = {"remove": "remove", "requeue": "requeue", "promote": "promote"}


def _scope_text(scope: dict[str, str | None]) -> str:
    return ", ".join(f"{k}={v}" for k, v in scope.items() if v is not None)


def _preview(
    action: BulkAction, scope: dict[str, str | None], database_url: str | None, as_json: bool
) -> tuple[BulkPreview, float]:
    async def go(jobs: Jobs) -> tuple[BulkPreview, float]:
        preview = await jobs.preview_many(action, **scope, sample=PREVIEW_SAMPLE)  # type: ignore[arg-type]
        return preview, float(jobs.driver.now())

    return _operate(go, database_url, as_json)


def preview_json(action: str, scope: dict[str, str | None], preview: BulkPreview) -> dict[str, Any]:
    """``--dry-run --json``: what the command would do, and the first jobs it would move."""
    return {
        "ok": True,
        "action": action,
        "dry_run": True,
        "filter": scope,
        "count": preview.count,
        "sample": [view_json(v) for v in preview.sample],
    }


def _print_preview(
    action: str,
    scope: dict[str, str | None],
    preview: BulkPreview,
    now: float,
    *,
    stderr: bool = False,
) -> None:
    """The preview as text: the count, then the first jobs as ``list`` shows them."""
    con = _console(stderr=stderr)
    count = preview.count
    con.print(
        _text(f"{action} would {_DOES[action]} {count} job(s) ({_scope_text(scope)})"),
        soft_wrap=True,
    )
    if not preview.sample:
        return
    body = {"rows": [view_json(v) for v in preview.sample], "after": None, "before": None}
    table = _page_table(body, now, con.width, f"the first {len(preview.sample)}, oldest first")
    con.print(table)
    if count > len(preview.sample):
        con.print(_text(f"... and {count - len(preview.sample)} more"), soft_wrap=True)


def _confirmed_bulk(
    action: BulkAction,
    call: Callable[..., Awaitable[BulkResult]],
    scope: dict[str, str | None],
    *,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    database_url: str | None,
) -> None:
    """A bulk command: ``--dry-run`` prints what it would do and writes nothing;
    otherwise ``--yes`` goes ahead, a terminal is asked first (the preview on
    stderr, then ``[y/N]``), and without a terminal to ask on the command is
    refused (exit 1) saying to pass ``--yes``."""
    if dry_run:
        preview, now = _preview(action, scope, database_url, as_json)
        if as_json:
            _echo_json(preview_json(action, scope, preview))
        else:
            _print_preview(action, scope, preview, now)
        return
    if not yes:
        if not sys.stdin.isatty():
            raise config_error(
                f"{action} --state changes every matching job and stdin is not a terminal to "
                f"confirm it on: pass --yes to go ahead (or --dry-run to see what would change)"
            )
        preview, now = _preview(action, scope, database_url, as_json)
        if preview.count == 0:
            _bulk(action, call, scope, as_json, database_url)  # moves nothing; says so
            return
        _print_preview(action, scope, preview, now, stderr=True)
        if not click.confirm(
            f"{_DOES[action].capitalize()} these {preview.count} job(s)?", default=False, err=True
        ):
            click.echo("not confirmed: nothing changed", err=True)
            sys.exit(EXIT_REFUSED)
    _bulk(action, call, scope, as_json, database_url)


def _bulk(
    action: str,
    call: Callable[..., Awaitable[BulkResult]],
    scope: dict[str, str | None],
    as_json: bool,
    database_url: str | None,
) -> None:
    """Call the bulk member until ``remaining`` is 0 (each call moves at most
    ``MAX_BULK_ROWS`` rows), with a progress bar on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = None
    if not as_json:
        progress = Progress(
            TextColumn(f"{action}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=_console(stderr=True),
            auto_refresh=False,
        )

    async def go(jobs: Jobs) -> dict[str, Any]:
        affected, calls, remaining, stalled = 0, 0, 0, False
        task = progress.add_task(action, total=None) if progress is not None else None
        with progress if progress is not None else contextlib.nullcontext():
            while True:
                result = await call(jobs, **scope)
                calls += 1
                affected += result.affected
                remaining = result.remaining
                if progress is not None and task is not None:
                    progress.update(task, completed=affected, total=affected + remaining)
                    progress.refresh()
                if remaining == 0:
                    break
                if result.affected == 0:
                    # Rows match but none moved (held by another transaction): stop
                    # rather than spin, and say so.
                    stalled = True
                    break
        return {"affected": affected, "remaining": remaining, "calls": calls, "stalled": stalled}

    out = _operate(go, database_url, as_json)
    body = {
        "ok": not out["stalled"],
        "action": action,
        "filter": scope,
        "affected": out["affected"],
        "remaining": out["remaining"],
        "calls": out["calls"],
    }
    if as_json:
        _echo_json(body)
    else:
        scope_text = _scope_text(scope)
        click.echo(
            f"{action}: {out['affected']} job(s) ({scope_text}) in {out['calls']} call(s) "
            f"of at most {MAX_BULK_ROWS}; {out['remaining']} remaining"
        )
    if out["stalled"]:
        click.echo(
            f"{out['remaining']} matching job(s) did not move in the last call (another "
            "transaction holds them, or they changed under it); run the command again",
            err=True,
        )
        sys.exit(EXIT_REFUSED)


async def _remove_many(jobs: Jobs, **scope: Any) -> BulkResult:
    return await jobs.remove_many(**scope)


async def _requeue_many(jobs: Jobs, **scope: Any) -> BulkResult:
    return await jobs.requeue_many(**scope)


async def _promote_many(jobs: Jobs, **scope: Any) -> BulkResult:
    return await jobs.promote_many(**scope)


def _bulk_scope(
    state: str, queue: str | None, name: str | None, tenant: str | None
) -> dict[str, str | None]:
    return {"state": state, "queue": queue, "name": name, "tenant_id": tenant}


def _dry_run_option(fn: Any) -> Any:
    return click.option(
        "--dry-run",
        is_flag=True,
        help="Bulk: print how many jobs would change and the first of them; change nothing.",
    )(fn)


def _yes_option(fn: Any) -> Any:
    return click.option(
        "--yes",
        "-y",
        "yes",
        is_flag=True,
        help="Bulk: go ahead without asking. Without it a terminal is asked first, and "
        "anything else (a script, a pipe) is refused.",
    )(fn)


@click.command("promote")
@click.argument("job_id", metavar="[ID]", required=False)
@click.option(
    "--state",
    type=click.Choice(("delayed", "ready")),
    default=None,
    help="Bulk: promote every matching job in this state (delayed, or ready backing off).",
)
@_scope_options
@_dry_run_option
@common_options
@guarded
def promote_command(
    job_id: str | None,
    state: str | None,
    queue: str | None,
    name: str | None,
    tenant: str | None,
    dry_run: bool,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Run a delayed job (or one backing off before a retry) now: one by ID, or
    every job matching --state (and --queue/--name/--tenant). --dry-run prints
    how many would move, and the first of them."""
    _one_or_bulk(job_id, state, queue=queue, name=name, tenant=tenant, dry_run=dry_run)
    _check_scope(queue, name, tenant)
    if job_id is None:
        assert state is not None
        _confirmed_bulk(
            "promote",
            _promote_many,
            _bulk_scope(state, queue, name, tenant),
            dry_run=dry_run,
            yes=True,  # promoting only brings a due time forward: nothing to confirm
            as_json=as_json,
            database_url=database_url,
        )
        return

    async def go(jobs: Jobs) -> JobView:
        return await jobs.promote(job_id)

    view = _operate(go, database_url, as_json)
    _done(
        f"promoted {view.id} ({view.name}): {view.state}, due now",
        as_json,
        {"action": "promote", "job": view_json(view)},
    )


@click.command("remove")
@click.argument("job_id", metavar="[ID]", required=False)
@click.option(
    "--state",
    type=_STATE,
    default=None,
    help="Bulk: remove every matching job in this state (never running).",
)
@_scope_options
@_dry_run_option
@_yes_option
@common_options
@guarded
def remove_command(
    job_id: str | None,
    state: str | None,
    queue: str | None,
    name: str | None,
    tenant: str | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Delete jobs and their steps: one by ID, or every job matching --state
    (and --queue/--name/--tenant). A running job is refused: cancel it first.

    With --state, --dry-run prints how many jobs would go and the first of
    them, changing nothing; on a terminal the command shows that and asks
    first; --yes skips the question (and is required when there is no
    terminal to ask on)."""
    _one_or_bulk(job_id, state, queue=queue, name=name, tenant=tenant, dry_run=dry_run, yes=yes)
    _check_scope(queue, name, tenant)
    if job_id is None:
        assert state is not None
        _confirmed_bulk(
            "remove",
            _remove_many,
            _bulk_scope(state, queue, name, tenant),
            dry_run=dry_run,
            yes=yes,
            as_json=as_json,
            database_url=database_url,
        )
        return

    async def go(jobs: Jobs) -> str:
        key = await jobs.resolve_id(job_id)
        await jobs.remove(key)
        return key

    removed = _operate(go, database_url, as_json)
    _done(f"removed {removed}", as_json, {"action": "remove", "id": removed})


@click.command("requeue")
@click.option(
    "--state",
    type=click.Choice(("done", "failed", "dead", "cancelled")),
    default=None,
    help="Requeue every matching job in this state (required).",
)
@_scope_options
@_dry_run_option
@_yes_option
@common_options
@guarded
def requeue_command(
    state: str | None,
    queue: str | None,
    name: str | None,
    tenant: str | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Requeue every finished job matching --state (and --queue/--name/--tenant),
    attempts reset. A job whose key a live job holds stays where it is. One job:
    `trio-jobs retry ID`.

    --dry-run prints how many jobs would be requeued and the first of them,
    changing nothing; on a terminal the command shows that and asks first;
    --yes skips the question (and is required when there is no terminal to
    ask on)."""
    if state is None:
        raise config_error(
            "pass --state (done, failed, dead or cancelled); one job: trio-jobs retry ID"
        )
    if dry_run and yes:
        raise config_error("pass --dry-run (change nothing) or --yes (go ahead), not both")
    _check_scope(queue, name, tenant)
    _confirmed_bulk(
        "requeue",
        _requeue_many,
        _bulk_scope(state, queue, name, tenant),
        dry_run=dry_run,
        yes=yes,
        as_json=as_json,
        database_url=database_url,
    )


@click.command("pause")
@click.argument("queue", metavar="QUEUE")
@common_options
@guarded
def pause_command(queue: str, as_json: bool, database_url: str | None) -> None:
    """Pause a queue fleet-wide (within one poll): no worker claims from it;
    enqueues still land."""
    check_queue(queue, "QUEUE")

    async def go(jobs: Jobs) -> list[str]:
        await jobs.pause_queue(queue)
        if not await queue_known(jobs, queue):
            log_event(logging.WARNING, "jobs.queue.unknown", queue=queue, command="pause")
        return await jobs.paused_queues()

    paused = _operate(go, database_url, as_json)
    _done(
        f"paused {queue}; paused queues: {', '.join(paused)}",
        as_json,
        {"action": "pause", "queue": queue, "paused_queues": paused},
    )


@click.command("resume")
@click.argument("queue", metavar="QUEUE")
@common_options
@guarded
def resume_command(queue: str, as_json: bool, database_url: str | None) -> None:
    """Resume a paused queue (a queue that was not paused is left as it is)."""
    check_queue(queue, "QUEUE")

    async def go(jobs: Jobs) -> list[str]:
        await jobs.resume_queue(queue)
        return await jobs.paused_queues()

    paused = _operate(go, database_url, as_json)
    _done(
        f"resumed {queue}; paused queues: {', '.join(paused) or 'none'}",
        as_json,
        {"action": "resume", "queue": queue, "paused_queues": paused},
    )


@click.command("stats")
@common_options
@guarded
def stats_command(as_json: bool, database_url: str | None) -> None:
    """Jobs per queue and state; depth is what waits to run (ready, delayed,
    suspended)."""

    async def go(jobs: Jobs) -> tuple[list[QueueStats], list[str]]:
        return await jobs.stats(), await jobs.paused_queues()

    stats, paused = _operate(go, database_url, as_json)
    body = stats_json(stats, paused)
    if as_json:
        _echo_json(body)
        return
    table = _table("queues", ("queue", "paused", "depth", *ALL_STATES))
    for q in body["queues"]:
        table.add_row(
            _text(q["queue"]),
            _text("yes" if q["paused"] else ""),
            *(_text(q[c]) for c in ("depth", *ALL_STATES)),
        )
    _console().print(table)


@click.command("workers")
@common_options
@guarded
def workers_command(as_json: bool, database_url: str | None) -> None:
    """Live workers: host, pid, queues, slots, in-flight jobs, last heartbeat. A
    killed worker leaves the list one visibility timeout after its last beat."""

    async def go(jobs: Jobs) -> tuple[list[WorkerInfo], float]:
        return await jobs.workers(), float(jobs.driver.now())

    workers, now = _operate(go, database_url, as_json)
    body = {"workers": [worker_json(w) for w in workers]}
    if as_json:
        _echo_json(body)
        return
    if not workers:
        click.echo("no live worker")
        return
    table = _table(
        f"{len(workers)} worker(s)",
        ("id", "host", "pid", "queues", "slots", "in flight", "started", "last beat"),
    )
    for w in body["workers"]:
        table.add_row(
            _text(w["id"]),
            _text(w["host"]),
            _text(w["pid"]),
            _text(", ".join(w["queues"])),
            _text(", ".join(f"{q}={n}" for q, n in w["slots"].items())),
            _text(len(w["in_flight"])),
            _text(_ago(now - w["started_at"])),
            _text(_ago(now - w["last_heartbeat"])),
        )
    _console().print(table)


@click.command("counters")
@click.option("--job", "job_name", default=None, metavar="NAME", help="Only this job.")
@click.option(
    "--since",
    default="1h",
    show_default=True,
    metavar="WHEN",
    help="From WHEN: a duration ago (15m, 1h, 7d) or an ISO 8601 datetime.",
)
@click.option("--buckets", is_flag=True, help="One row per time bucket instead of totals.")
@common_options
@guarded
def counters_command(
    job_name: str | None, since: str, buckets: bool, as_json: bool, database_url: str | None
) -> None:
    """History per job: done, retried, failed and dead settles, and the seconds
    they took, in buckets of 1 minute (last 24 h), 5 minutes (7 d) or 1 hour
    (30 d)."""
    check_job_name(job_name, "--job")
    moment = parse_moment(since, "--since")

    async def go(jobs: Jobs) -> tuple[list[CounterRow], float]:
        now = float(jobs.driver.now())
        start = _resolve_moment(moment, now) or 0.0
        return await jobs.counters(job_name, start), start

    rows, start = _operate(go, database_url, as_json)
    totals = counter_totals(rows)
    if as_json:
        _echo_json(
            {
                "job": job_name,
                "since": start,
                "rows": [counter_json(r) for r in rows],
                "totals": totals,
            }
        )
        return
    if buckets:
        table = _table(
            f"since {_iso(start)}",
            ("bucket", "job", "done", "retried", "failed", "dead", "seconds"),
        )
        for r in rows:
            table.add_row(
                _text(_iso(r.bucket)),
                _text(r.name),
                *(_text(x) for x in (r.done, r.retried, r.failed, r.dead)),
                _text(f"{r.duration:.3f}"),
            )
    else:
        table = _table(
            f"since {_iso(start)}",
            ("job", "done", "retried", "failed", "dead", "seconds", "mean"),
        )
        for t in totals:
            settles = t["done"] + t["retried"] + t["failed"] + t["dead"]
            mean = t["duration"] / settles if settles else 0.0
            table.add_row(
                _text(t["name"]),
                *(_text(t[x]) for x in ("done", "retried", "failed", "dead")),
                _text(f"{t['duration']:.3f}"),
                _text(f"{mean:.3f}"),
            )
    _console().print(table)


#: Registered on the ``trio-jobs`` group by ``_main``.
OPERATOR_COMMANDS: tuple[click.Command, ...] = (
    list_command,
    show_command,
    retry_command,
    cancel_command,
    resolve_step_command,
    promote_command,
    remove_command,
    requeue_command,
    pause_command,
    resume_command,
    stats_command,
    workers_command,
    counters_command,
)
