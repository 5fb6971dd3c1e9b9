"""The dashboard's pages: each reads the facade and renders one template.

A page gathers plain data (records from the facade, numbers it computes) and
hands it to its template; it builds no HTML.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
from starlette.responses import Response

from ..drivers._protocol import (
    ALL_STATES,
    LIVE_STATES,
    MAX_ATTEMPT_LOG,
    MAX_BULK_ROWS,
    MAX_JOB_PAGE,
    TERMINAL_STATES,
    CounterRow,
    JobPage,
    QueueStats,
    WorkerInfo,
)
from ..errors import ErrorCode, JobsError

if TYPE_CHECKING:
    from ._app import Dashboard, Req

__all__ = [
    "consumer_list",
    "dead_letters",
    "job_list",
    "job_page",
    "overview",
    "task_list",
    "webhook_list",
    "worker_list",
]

#: Minutes of throughput each sparkline draws.
SPARK_MINUTES = 60

_FILTERS = ("queue", "name", "state", "tenant_id", "id_prefix", "created_from", "created_to")


async def _or_empty(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except JobsError:
        return []


def _minutes(now: float) -> dict[float, int]:
    last = math.floor(now / 60) * 60
    return {last - (SPARK_MINUTES - 1 - i) * 60.0: i for i in range(SPARK_MINUTES)}


@attrs.define
class _Series:
    """One sparkline's worth: done and failed per minute, oldest first."""

    ok: list[float]
    bad: list[float]

    @classmethod
    def empty(cls, n: int) -> _Series:
        return cls([0.0] * n, [0.0] * n)


@attrs.define
class _Throughput:
    name: str
    ok: list[float]
    bad: list[float]
    done: int = 0
    retried: int = 0
    failed: int = 0
    dead: int = 0
    duration: float = 0.0

    @property
    def mean(self) -> float | None:
        settled = self.done + self.retried + self.failed + self.dead
        return self.duration / settled if settled and self.duration else None


async def overview(d: Dashboard, ctx: Req) -> Response:
    """``GET /``: queues, throughput, workers, the newest dead letters."""
    now = d.now()
    try:
        stats = await d.jobs.stats()
    except JobsError as exc:
        return d.error_page(ctx, exc, active="overview")
    paused = await _or_empty(d.jobs.paused_queues())
    counters: list[CounterRow] = await _or_empty(d.jobs.counters(None, now - SPARK_MINUTES * 60))
    workers: list[WorkerInfo] = await _or_empty(d.jobs.workers())
    try:
        dead: JobPage | None = await d.jobs.list(state="dead", limit=8)
    except JobsError:
        dead = None
    by_queue: dict[str, QueueStats] = {s.queue: s for s in stats}
    minutes = _minutes(now)
    n = len(minutes)
    # Which queue a counter row belongs to: the row says (the queue its job
    # settled in); a row from before counters carried it, by the job's handle.
    handle_queue = {h.name: h.queue for h in d.jobs.handles.values()}
    per_queue: dict[str, _Series] = {}
    per_name: dict[str, _Throughput] = {}
    for row in counters:
        index = minutes.get(row.bucket)
        t = per_name.setdefault(row.name, _Throughput(row.name, [0.0] * n, [0.0] * n))
        t.done += row.done
        t.retried += row.retried
        t.failed += row.failed
        t.dead += row.dead
        t.duration += row.duration
        if index is None:
            continue
        t.ok[index] += row.done
        t.bad[index] += row.failed + row.dead
        queue = row.queue or handle_queue.get(row.name)
        if queue is None:
            continue
        series = per_queue.setdefault(queue, _Series.empty(n))
        series.ok[index] += row.done
        series.bad[index] += row.failed + row.dead
    names = sorted(set(by_queue) | set(paused) | set(handle_queue.values()) | set(per_queue))
    queues = [
        {
            "name": q,
            "stats": by_queue.get(q, QueueStats(q)),
            "paused": q in paused,
            "ok": per_queue.get(q, _Series.empty(n)).ok,
            "bad": per_queue.get(q, _Series.empty(n)).bad,
        }
        for q in names
    ]
    return d.render(
        ctx,
        "overview.html",
        active="overview",
        now=now,
        queues=queues,
        throughput=[per_name[k] for k in sorted(per_name)],
        workers=workers,
        dead=dead.rows if dead else [],
    )


async def job_list(d: Dashboard, ctx: Req) -> Response:
    """``GET /jobs``: the filtered, keyset-paged list."""
    return await _listing(d, ctx, fixed_state=None)


async def dead_letters(d: Dashboard, ctx: Req) -> Response:
    """``GET /dead``: the dead-letter queue (the list, ``state=dead``)."""
    return await _listing(d, ctx, fixed_state="dead")


def _epoch_of(text: str | None) -> float | None:
    """A ``datetime-local`` value (read as UTC) or epoch seconds."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise JobsError(
            ErrorCode.X_INVARIANT, "a created-at bound is a date and time (UTC)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


async def _listing(d: Dashboard, ctx: Req, *, fixed_state: str | None) -> Response:
    q = ctx.request.query_params
    filters = {k: (q.get(k) or "").strip() for k in _FILTERS}
    if fixed_state is not None:
        filters["state"] = fixed_state
    limit_text = q.get("limit") or "50"
    error: JobsError | None = None
    page: JobPage | None = None
    try:
        try:
            limit = int(limit_text)
        except ValueError:
            raise JobsError(
                ErrorCode.X_JOB_PAGE_INVALID, f"limit is a number, 1 to {MAX_JOB_PAGE}"
            ) from None
        page = await d.jobs.list(
            queue=filters["queue"] or None,
            name=filters["name"] or None,
            state=filters["state"] or None,
            tenant_id=filters["tenant_id"] or None,
            id_prefix=filters["id_prefix"].lower() or None,
            created_from=_epoch_of(filters["created_from"]),
            created_to=_epoch_of(filters["created_to"]),
            limit=limit,
            after=q.get("after") or None,
            before=q.get("before") or None,
        )
    except JobsError as exc:
        error = exc
    dead = fixed_state == "dead"
    keep = {k: v for k, v in filters.items() if v}
    if fixed_state is not None:
        keep.pop("state", None)
    if limit_text != "50":
        keep["limit"] = limit_text
    return d.render(
        ctx,
        "dead.html" if dead else "jobs.html",
        active="dead" if dead else "jobs",
        heading="Dead letters" if dead else "Jobs",
        path="/dead" if dead else "/jobs",
        now=d.now(),
        filters=filters,
        fixed_state=fixed_state,
        states=ALL_STATES,
        limit=limit_text,
        max_page=MAX_JOB_PAGE,
        max_bulk=MAX_BULK_ROWS,
        error=error,
        page=page,
        keep=keep,
    )


async def _list_page(
    d: Dashboard,
    ctx: Req,
    fetch: Callable[[], Awaitable[Any]],
    template: str,
    active: str,
    name: str,
) -> Response:
    """A page that shows one list the facade answers (an error page if it refuses)."""
    try:
        rows = await fetch()
    except JobsError as exc:
        return d.error_page(ctx, exc, active=active)
    return d.render(ctx, template, active=active, now=d.now(), **{name: rows})


async def worker_list(d: Dashboard, ctx: Req) -> Response:
    """``GET /workers``: every live worker and its last heartbeat."""
    return await _list_page(d, ctx, d.jobs.workers, "workers.html", "workers", "workers")


async def backfill_list(d: Dashboard, ctx: Req) -> Response:
    """``GET /backfills``: the backfill ledger, one row per pass, newest first."""
    return await _list_page(d, ctx, d.jobs.backfills, "backfills.html", "backfills", "passes")


async def webhook_list(d: Dashboard, ctx: Req) -> Response:
    """``GET /webhooks``: the webhook ledger: every endpoint with its consecutive
    failures and disabled mark, and the newest delivery attempts."""
    from .._webhook_ledger import read_webhooks

    async def fetch() -> dict[str, Any]:
        endpoints, attempts = await read_webhooks(d.jobs, limit=200)
        return {"endpoints": endpoints, "attempts": attempts}

    return await _list_page(d, ctx, fetch, "webhooks.html", "webhooks", "ledger")


async def task_list(d: Dashboard, ctx: Req) -> Response:
    """``GET /tasks``: every scheduled task, paused or not, its last and next fire."""
    return await _list_page(d, ctx, d.jobs.tasks, "tasks.html", "tasks", "tasks")


async def consumer_list(d: Dashboard, ctx: Req) -> Response:
    """``GET /consumers``: every key of every consumer, by its newest run: its
    state, when its last batch committed, and its lag."""
    from .._consumer import consumer_rows

    return await _list_page(
        d, ctx, lambda: consumer_rows(d.jobs), "consumers.html", "consumers", "consumers"
    )


#: The children a job page lists by name and state (and counts by state).
CHILDREN_SHOWN = 100


async def _tree(d: Dashboard, view: Any) -> tuple[Any, list[Any], dict[str, int]]:
    """The job's place in its tree: its parent's view (``None`` for a job with
    no parent, or one removed since), its first children's views, and how many
    of those are in each state."""
    parent = None
    if view.parent_id is not None:
        try:
            parent = await d.jobs.show(view.parent_id)
        except JobsError:
            parent = None
    shown = []
    for child_id in list(view.children)[:CHILDREN_SHOWN]:
        try:
            shown.append(await d.jobs.show(child_id))
        except JobsError:
            continue  # removed since
    counts: dict[str, int] = {}
    for child in shown:
        counts[child.state] = counts.get(child.state, 0) + 1
    return parent, shown, dict(sorted(counts.items()))


async def job_page(d: Dashboard, ctx: Req) -> Response:
    """``GET /{id}``: one job, its step timeline, error, progress and actions."""
    job_id = str(ctx.request.path_params["job_id"])
    try:
        view = await d.jobs.show(job_id)
    except JobsError as exc:
        return d.error_page(ctx, exc, active="jobs")
    redact = d.redacted(view)
    share = 0.0
    if view.progress is not None and view.progress.total > 0:
        share = max(0.0, min(1.0, view.progress.done / view.progress.total))
    # A once step whose outcome is unknown (it started, or failed, and the run
    # stopped on X_STEP_OUTCOME_UNKNOWN): the operator says whether it ran.
    unknown_outcome = view.state in TERMINAL_STATES and (
        view.error_code == ErrorCode.X_STEP_OUTCOME_UNKNOWN
    )
    unresolved = {
        s.name
        for s in view.steps
        if (s.status == "started" and view.state in TERMINAL_STATES)
        or (unknown_outcome and s.status == "failed")
    }
    # The claim running now, and the step its last heartbeat named when no
    # record shows it (a step.run records only when it ends; a failed step is
    # running again; a completed one was a beat behind).
    live = view.attempt_log[-1] if view.attempt_log else None
    if view.state != "running" or live is None or live.ended_at is not None:
        live = None
    current = None
    if live is not None and live.step is not None:
        recorded = {s.name: s for s in view.steps}
        known = recorded.get(live.step)
        if known is None or known.status == "failed":
            current = {"name": live.step, "since": live.step_started_at}
    parent, children, child_states = await _tree(d, view)
    return d.render(
        ctx,
        "job.html",
        active="jobs",
        now=d.now(),
        view=view,
        parent=parent,
        children=children,
        child_states=child_states,
        children_shown=CHILDREN_SHOWN,
        redact=redact,
        unknown=d.unknown(view),
        share=share,
        unresolved=unresolved,
        live_attempt=live,
        current_step=current,
        max_attempt_log=MAX_ATTEMPT_LOG,
        terminal_states=TERMINAL_STATES,
        live_states=LIVE_STATES,
    )
