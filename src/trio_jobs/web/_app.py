"""The dashboard: a Starlette app over the facade's operator surface.

Every page reads the facade (``jobs.stats()``, ``jobs.list()``, ``jobs.show()``,
...), every action calls it (``jobs.requeue()``, ``jobs.cancel()``, ...):
there is no SQL here. The app runs on whatever loop serves it; the facade and
the PostgreSQL driver need that loop to be Trio's, so serve it with
Hypercorn's Trio worker (:func:`trio_jobs.web.serve` does).
"""

from __future__ import annotations

import logging
import math
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

import attrs
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from .._facade import Jobs
from ..drivers._protocol import (
    ALL_STATES,
    LIVE_STATES,
    MAX_JOB_PAGE,
    TERMINAL_STATES,
    CounterRow,
    JobPage,
    JobView,
    QueueStats,
    WorkerInfo,
)
from ..errors import ErrorCode, JobsError
from . import _html as H
from ._metrics import CONTENT_TYPE, render_metrics
from ._operator import AsOperator
from ._security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    Auth,
    allowed,
    new_cookie_value,
    new_secret,
    same_origin,
    token_for,
    token_ok,
)

__all__ = ["Dashboard", "create_app"]

log = logging.getLogger("trio_jobs.web")

#: The most bytes one action's form body may hold.
MAX_FORM_BYTES = 64 * 1024
_COOKIE_SHAPE = re.compile(r"^[A-Za-z0-9_-]{20,100}$")
_CODE_SHAPE = re.compile(r"^X_[A-Z0-9_]{1,60}$")
#: Minutes of throughput each sparkline draws.
SPARK_MINUTES = 60

_DONE_TEXT = {
    "retried": "Requeued: it runs again from its first unfinished step.",
    "cancelled": "Cancelled.",
    "promoted": "Promoted: it runs now.",
    "removed": "Removed.",
    "paused": "Queue paused: no worker claims from it until it is resumed.",
    "resumed": "Queue resumed.",
    "resolved": "Step resolved: retry the job to go on.",
    "requeue_many": "Requeued matching jobs.",
    "remove_many": "Removed matching jobs.",
    "promote_many": "Promoted matching jobs.",
}
_HINTS = {
    "X_JOB_NOT_REQUEUEABLE": "only a finished (done, failed, dead or cancelled) job can be retried",
    "X_JOB_NOT_CANCELLABLE": "only a live (ready, delayed, running or suspended) job can be cancelled",
    "X_JOB_NOT_REMOVABLE": "a running job cannot be removed: cancel it first",
    "X_JOB_DUPLICATE": "a live job holds this job's idempotency key",
    "X_JOB_NOT_FOUND": "no job has that id (removed, or purged by retention)",
    "X_JOB_NOT_PROMOTABLE": "only a job waiting on its run time can be promoted",
    "X_NOT_IMPLEMENTED": "this driver has no operator surface",
}


@attrs.define
class _Req:
    """One request's security context: where the app is mounted, the CSP nonce,
    the CSRF cookie (and whether it is new), the parsed form of a POST."""

    request: Request
    root: str
    nonce: str
    cookie: str
    new_cookie: bool
    token: str
    form: dict[str, str] = attrs.Factory(dict)

    @property
    def csrf(self) -> dict[str, str]:
        """The hidden field every form of this page carries."""
        return {CSRF_FIELD: self.token}


Handler = Callable[["Dashboard", _Req], Awaitable[Response]]


def _href(root: str, path: str, query: Mapping[str, Any] | None = None) -> str:
    full = root.rstrip("/") + path
    items = {k: v for k, v in (query or {}).items() if v not in (None, "")}
    return full + ("?" + urlencode(items) if items else "")


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


class Dashboard:
    """The dashboard's pages and actions over one facade (see :func:`create_app`)."""

    def __init__(
        self,
        jobs: Jobs,
        *,
        auth: Auth | None,
        secret: bytes | None,
        registry: CollectorRegistry | None,
        reveal_unregistered: bool,
    ) -> None:
        if not isinstance(jobs, Jobs):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID, "create_app(jobs) takes the facade open_jobs yielded"
            )
        if auth is not None and not callable(auth):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "auth= takes a function of the request answering True to serve it",
            )
        if secret is not None and (not isinstance(secret, bytes) or len(secret) < 16):
            raise JobsError(ErrorCode.X_CONFIG_INVALID, "secret= takes at least 16 random bytes")
        self.jobs = jobs
        self.auth = auth
        self.secret = secret if secret is not None else new_secret()
        self.registry = registry
        self.reveal_unregistered = reveal_unregistered

    # ------------------------------------------------------------------ plumbing

    def routes(self) -> list[BaseRoute]:
        get, post = ["GET", "HEAD"], ["POST"]
        return [
            Route("/", self._wrap(Dashboard.overview), methods=get),
            Route("/jobs", self._wrap(Dashboard.job_list), methods=get),
            Route("/dead", self._wrap(Dashboard.dead_letters), methods=get),
            Route("/workers", self._wrap(Dashboard.worker_list), methods=get),
            Route("/metrics", self.metrics, methods=get),
            Route("/queues/pause", self._wrap(Dashboard.pause), methods=post),
            Route("/queues/resume", self._wrap(Dashboard.resume), methods=post),
            Route("/bulk", self._wrap(Dashboard.bulk), methods=post),
            Route("/{job_id:uuid}", self._wrap(Dashboard.job_page), methods=get),
            Route("/{job_id:uuid}/retry", self._wrap(Dashboard.retry), methods=post),
            Route("/{job_id:uuid}/cancel", self._wrap(Dashboard.cancel), methods=post),
            Route("/{job_id:uuid}/promote", self._wrap(Dashboard.promote), methods=post),
            Route("/{job_id:uuid}/remove", self._wrap(Dashboard.remove), methods=post),
            Route("/{job_id:uuid}/resolve-step", self._wrap(Dashboard.resolve), methods=post),
        ]

    def _wrap(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not await allowed(request, self.auth):
                return _forbidden(
                    "This dashboard serves loopback clients only. Configure an auth hook "
                    "(create_app(jobs, auth=...)) to open it to others."
                    if self.auth is None
                    else "The auth hook refused this request."
                )
            cookie = request.cookies.get(CSRF_COOKIE, "")
            new_cookie = not _COOKIE_SHAPE.match(cookie)
            if new_cookie:
                cookie = new_cookie_value()
            ctx = _Req(
                request=request,
                root=str(request.scope.get("root_path", "")).rstrip("/"),
                nonce=secrets.token_urlsafe(16),
                cookie=cookie,
                new_cookie=new_cookie,
                token=token_for(self.secret, cookie),
            )
            if request.method == "POST":
                form = await _read_form(request)
                if form is None:
                    return _forbidden("The form is too large or not a form.", status=413)
                if new_cookie or not token_ok(self.secret, cookie, form.get(CSRF_FIELD)):
                    return _forbidden(
                        "Missing or invalid CSRF token: reload the page and try again."
                    )
                if not same_origin(request.headers):
                    return _forbidden("A cross-site request was refused.")
                ctx.form = form
            response = await handler(self, ctx)
            _secure(response, ctx)
            return response

        return endpoint

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus' text format (behind the same access check)."""
        if not await allowed(request, self.auth):
            return _forbidden("Metrics are served to loopback clients, or as the auth hook says.")
        body = await render_metrics(self.jobs, self.registry)
        return Response(body, media_type=CONTENT_TYPE, headers={"Cache-Control": "no-store"})

    def _page(
        self, ctx: _Req, *, title: str, body: str, active: str, status: int = 200
    ) -> Response:
        html = H.page(
            title=title,
            body=body,
            root=ctx.root,
            nonce=ctx.nonce,
            active=active,
            flash=_flash(ctx.request.query_params),
        )
        return HTMLResponse(html, status_code=status)

    def _error_page(self, ctx: _Req, exc: JobsError, *, active: str) -> Response:
        status = 404 if exc.code == ErrorCode.X_JOB_NOT_FOUND else 400
        if exc.code == ErrorCode.X_NOT_IMPLEMENTED:
            status = 501
        body = (
            f"<h1>{H.esc(exc.code)}</h1><p>{H.esc(_HINTS.get(str(exc.code), ''))}</p>"
            f'<pre class="error">{H.esc(exc.message)}</pre>'
            f'<p><a href="{H.url(ctx.root, "/")}">Back to the overview</a></p>'
        )
        return self._page(ctx, title=str(exc.code), body=body, active=active, status=status)

    def _redacted(self, view: JobView) -> bool:
        """Whether a job's payload, outputs and keys are shown as ``[redacted]``:
        when its handle or its row says it is sensitive; when neither knows (no
        handle here, a row from before the flag was stored), unless
        ``reveal_unregistered``."""
        handle = self.jobs.handle(view.name)
        row: bool | None = getattr(view, "sensitive", None)
        if (handle is not None and handle.sensitive) or row is True:
            return True
        if handle is not None or row is False:
            return False
        return not self.reveal_unregistered

    def _unknown(self, view: JobView) -> bool:
        return self.jobs.handle(view.name) is None and getattr(view, "sensitive", None) is None

    def _now(self) -> float:
        return float(self.jobs.driver.now())

    # ------------------------------------------------------------------ pages

    async def overview(self, ctx: _Req) -> Response:
        """``GET /``: queues, throughput, workers, the newest dead letters."""
        now = self._now()
        try:
            stats = await self.jobs.stats()
        except JobsError as exc:
            return self._error_page(ctx, exc, active="overview")
        paused = await _or_empty(self.jobs.paused_queues())
        counters: list[CounterRow] = await _or_empty(
            self.jobs.counters(None, now - SPARK_MINUTES * 60)
        )
        workers: list[WorkerInfo] = await _or_empty(self.jobs.workers())
        try:
            dead: JobPage | None = await self.jobs.list(state="dead", limit=8)
        except JobsError:
            dead = None
        by_queue: dict[str, QueueStats] = {s.queue: s for s in stats}
        queues = sorted(set(by_queue) | set(paused) | {h.queue for h in self.jobs.handles.values()})
        minutes = _minutes(now)
        queue_of = {h.name: h.queue for h in self.jobs.handles.values()}
        per_queue: dict[str, tuple[list[float], list[float]]] = {}
        per_name: dict[str, list[CounterRow]] = {}
        for row in counters:
            per_name.setdefault(row.name, []).append(row)
            queue = queue_of.get(row.name)
            if queue is None or row.bucket not in minutes:
                continue
            ok, bad = per_queue.setdefault(queue, ([0.0] * len(minutes), [0.0] * len(minutes)))
            ok[minutes[row.bucket]] += row.done
            bad[minutes[row.bucket]] += row.failed + row.dead
        rows = []
        for queue in queues:
            s = by_queue.get(queue, QueueStats(queue))
            is_paused = queue in paused
            ok, bad = per_queue.get(queue, ([0.0] * len(minutes), [0.0] * len(minutes)))
            action = "resume" if is_paused else "pause"
            button = H.button_form(
                H.url(ctx.root, f"/queues/{action}"),
                "Resume" if is_paused else "Pause",
                {**ctx.csrf, "queue": queue},
                cls="primary" if is_paused else "",
                confirm=None if is_paused else f"Pause queue {queue}? No worker claims from it.",
            )
            name_cell = (
                f'<a href="{H.url(ctx.root, "/jobs", {"queue": queue})}">{H.esc(queue)}</a>'
                + (" " + H.badge("paused") if is_paused else "")
            )
            rows.append(
                "<tr>"
                f"<td>{name_cell}</td>"
                f'<td class="num"><b>{s.depth}</b></td>'
                f'<td class="num">{s.ready}</td><td class="num">{s.delayed}</td>'
                f'<td class="num">{s.suspended}</td><td class="num">{s.running}</td>'
                f'<td class="num">{s.done}</td>'
                f'<td class="num">{_link_count(ctx, queue, "failed", s.failed)}</td>'
                f'<td class="num">{_link_count(ctx, queue, "dead", s.dead)}</td>'
                f'<td class="num">{s.cancelled}</td>'
                f"<td>{H.sparkline(ok, bad, title=f'{queue}: {sum(ok):.0f} done, {sum(bad):.0f} failed in the last hour')}"
                f' <span class="muted">{sum(ok):.0f}/h</span></td>'
                f"<td>{button}</td></tr>"
            )
        head = [
            "<th>Queue</th>",
            '<th class="num">Depth</th>',
            '<th class="num">Ready</th>',
            '<th class="num">Delayed</th>',
            '<th class="num">Suspended</th>',
            '<th class="num">In flight</th>',
            '<th class="num">Done</th>',
            '<th class="num">Failed</th>',
            '<th class="num">Dead</th>',
            '<th class="num">Cancelled</th>',
            "<th>Last hour</th>",
            "<th></th>",
        ]
        body = ["<h1>Queues</h1>", H.table(head, rows, empty="No queue has any job yet.")]
        body.append("<h2>Throughput by job, last hour</h2>")
        body.append(_throughput(per_name, minutes))
        body.append(
            f'<h2>Workers <a class="muted" href="{H.url(ctx.root, "/workers")}">'
            f"({len(workers)} live)</a></h2>"
        )
        body.append(_workers_table(ctx, workers, now))
        body.append(
            f'<h2>Newest dead letters <a class="muted" href="{H.url(ctx.root, "/dead")}">'
            "(all)</a></h2>"
        )
        body.append(_jobs_table(ctx, dead.rows if dead else [], now, errors=True))
        return self._page(ctx, title="Overview", body="".join(body), active="overview")

    async def job_list(self, ctx: _Req) -> Response:
        """``GET /jobs``: the filtered, keyset-paged list."""
        return await self._listing(ctx, active="jobs", fixed_state=None)

    async def dead_letters(self, ctx: _Req) -> Response:
        """``GET /dead``: the dead-letter queue (the list, ``state=dead``)."""
        return await self._listing(ctx, active="dead", fixed_state="dead")

    async def _listing(self, ctx: _Req, *, active: str, fixed_state: str | None) -> Response:
        q = ctx.request.query_params
        filters = {
            k: (q.get(k) or "").strip()
            for k in (
                "queue",
                "name",
                "state",
                "tenant_id",
                "id_prefix",
                "created_from",
                "created_to",
            )
        }
        if fixed_state is not None:
            filters["state"] = fixed_state
        limit_text = q.get("limit") or "50"
        error = ""
        page: JobPage | None = None
        try:
            try:
                limit = int(limit_text)
            except ValueError:
                raise JobsError(
                    ErrorCode.X_JOB_PAGE_INVALID, f"limit is a number, 1 to {MAX_JOB_PAGE}"
                ) from None
            page = await self.jobs.list(
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
            error = f'<div class="flash bad"><b>{H.esc(exc.code)}</b>: {H.esc(exc.message)}</div>'
        title = "Dead letters" if fixed_state == "dead" else "Jobs"
        path = "/dead" if fixed_state == "dead" else "/jobs"
        body = [f"<h1>{title}</h1>", _filter_form(ctx, path, filters, limit_text, fixed_state)]
        body.append(error)
        now = self._now()
        if page is not None:
            body.append(_jobs_table(ctx, page.rows, now, errors=fixed_state == "dead"))
            keep = {k: v for k, v in filters.items() if v}
            if fixed_state is not None:
                keep.pop("state", None)
            if limit_text != "50":
                keep["limit"] = limit_text
            pager = []
            if page.before:
                pager.append(
                    f'<a href="{H.url(ctx.root, path, {**keep, "before": page.before})}">'
                    "← Newer</a>"
                )
            if page.after:
                pager.append(
                    f'<a href="{H.url(ctx.root, path, {**keep, "after": page.after})}">Older →</a>'
                )
            body.append(f'<div class="pager">{"".join(pager)}</div>')
        if filters["state"]:
            body.append(_bulk_form(ctx, filters, path))
        return self._page(ctx, title=title, body="".join(body), active=active)

    async def worker_list(self, ctx: _Req) -> Response:
        """``GET /workers``: every live worker and its last heartbeat."""
        try:
            workers = await self.jobs.workers()
        except JobsError as exc:
            return self._error_page(ctx, exc, active="workers")
        body = "<h1>Workers</h1>" + _workers_table(ctx, workers, self._now())
        return self._page(ctx, title="Workers", body=body, active="workers")

    async def job_page(self, ctx: _Req) -> Response:
        """``GET /{id}``: one job, its step timeline, error, progress and actions."""
        job_id = str(ctx.request.path_params["job_id"])
        try:
            view = await self.jobs.show(job_id)
        except JobsError as exc:
            return self._error_page(ctx, exc, active="jobs")
        now = self._now()
        redact = self._redacted(view)
        facts = [
            ("State", H.badge(view.state)),
            ("Job", H.esc(view.name)),
            (
                "Queue",
                f'<a href="{H.url(ctx.root, "/jobs", {"queue": view.queue})}">'
                f"{H.esc(view.queue)}</a>",
            ),
            ("Attempts", f"{view.attempts} of {view.max_attempts}"),
            ("Run id", f'<span class="mono">{H.esc(view.run_id)}</span>'),
            ("Created", H.stamp(view.created_at)),
            ("Updated", H.stamp(view.updated_at)),
        ]
        if view.state in ("ready", "delayed"):
            facts.append(("Next run", f"{H.stamp(view.run_at)} ({H.ago(view.run_at, now)})"))
        facts.append(("Tenant", H.esc(view.tenant_id) if view.tenant_id else "—"))
        key = H.REDACTED if redact else view.idempotency_key
        facts.append(("Idempotency key", f'<span class="mono">{H.esc(key)}</span>'))
        if view.concurrency_key is not None:
            ckey = H.REDACTED if redact else view.concurrency_key
            facts.append(("Concurrency key", f'<span class="mono">{H.esc(ckey)}</span>'))
        if view.priority:
            facts.append(("Priority", str(view.priority)))
        if view.worker_id:
            facts.append(("Worker", f'<span class="mono">{H.esc(view.worker_id)}</span>'))
        if view.progress is not None:
            p = view.progress
            share = 0.0 if p.total <= 0 else max(0.0, min(1.0, p.done / p.total))
            note = f" — {H.esc(p.note)}" if p.note else ""
            facts.append(
                (
                    "Progress",
                    f'<progress max="100" value="{share * 100:.0f}"></progress>'
                    f" {p.done:g} / {p.total:g}{note}",
                )
            )
        dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
        body = [
            f'<h1>{H.esc(view.name)} <span class="mono muted">{H.esc(view.id)}</span></h1>',
            '<div class="grid">',
            f'<div class="card"><dl class="facts">{dl}</dl></div>',
            f'<div class="card"><h2 class="first">Actions</h2>{self._actions(ctx, view)}</div>',
            "</div>",
        ]
        if view.error_code or view.last_error:
            body.append(
                f"<h2>Error {H.esc(view.error_code or '')}</h2>"
                f'<pre class="error">{H.esc(view.last_error or "")}</pre>'
            )
        body.append("<h2>Steps</h2>")
        body.append(self._timeline(ctx, view, redact))
        body.append('<div class="grid"><div>')
        body.append("<h2>Payload</h2>" + H.json_block(view.payload, redacted=redact))
        body.append("</div><div>")
        body.append("<h2>Result</h2>" + H.json_block(view.result, redacted=redact))
        body.append("</div></div>")
        if redact and self._unknown(view):
            body.append(
                '<p class="muted">Whether this job is sensitive is unknown here (its handle '
                "is not registered with this dashboard's facade and its row predates the "
                "flag), so its payload and outputs are hidden. Pass its handle to "
                "open_jobs(jobs=[...]) to show them.</p>"
            )
        return self._page(ctx, title=view.name, body="".join(body), active="jobs")

    def _timeline(self, ctx: _Req, view: JobView, redact: bool) -> str:
        if not view.steps:
            return '<p class="muted">No step recorded yet.</p>'
        items = []
        # A once step whose outcome is unknown: it started (or failed) and the run
        # stopped on X_STEP_OUTCOME_UNKNOWN. The operator says whether it ran.
        unknown = view.state in TERMINAL_STATES and (
            view.error_code == ErrorCode.X_STEP_OUTCOME_UNKNOWN
        )
        for step in view.steps:
            extra = ""
            if step.error:
                extra += f'<pre class="error">{H.esc(step.error)}</pre>'
            if step.status == "completed" or step.output is not None:
                extra += H.json_block(step.output, redacted=redact)
            if (step.status == "started" and view.state in TERMINAL_STATES) or (
                unknown and step.status == "failed"
            ):
                extra += self._resolve_form(ctx, view, step.name)
            items.append(
                f'<li class="{H.esc(step.status)}"><b>{H.esc(step.name)}</b> '
                f"{H.badge(step.status)} "
                f'<span class="muted">{step.executions} execution'
                f"{'' if step.executions == 1 else 's'}</span>{extra}</li>"
            )
        return f'<ol class="timeline">{"".join(items)}</ol>'

    def _resolve_form(self, ctx: _Req, view: JobView, step: str) -> str:
        base = {**ctx.csrf, "step": step}
        action = H.url(ctx.root, f"/{view.id}/resolve-step")
        ran = H.button_form(
            action,
            "It ran",
            {**base, "ran": "1"},
            extra='<input name="output" placeholder="its output, as JSON" size="24">',
        )
        not_ran = H.button_form(action, "It did not run", {**base, "ran": "0"})
        return (
            f'<div class="card"><span class="muted">Outcome unknown (a once step): '
            f"resolve it, then retry.</span><br>{ran}{not_ran}</div>"
        )

    def _actions(self, ctx: _Req, view: JobView) -> str:
        out = []
        base = f"/{view.id}"
        if view.state in TERMINAL_STATES:
            out.append(
                H.button_form(H.url(ctx.root, base + "/retry"), "Retry", ctx.csrf, cls="primary")
            )
            steps = [s.name for s in view.steps]
            if steps:
                options = "".join(f'<option value="{H.esc(n)}">{H.esc(n)}</option>' for n in steps)
                out.append(
                    H.button_form(
                        H.url(ctx.root, base + "/retry"),
                        "Retry from step",
                        ctx.csrf,
                        extra=f'<select name="from_step" aria-label="step">{options}</select> ',
                    )
                )
        if view.state in LIVE_STATES:
            out.append(
                H.button_form(
                    H.url(ctx.root, base + "/cancel"),
                    "Cancel",
                    ctx.csrf,
                    cls="danger",
                    extra='<input name="reason" placeholder="reason" size="18"> ',
                    confirm="Cancel this job?",
                )
            )
        if view.state in ("delayed", "ready") and view.run_at > self._now():
            out.append(H.button_form(H.url(ctx.root, base + "/promote"), "Run now", ctx.csrf))
        if view.state != "running":
            out.append(
                H.button_form(
                    H.url(ctx.root, base + "/remove"),
                    "Remove",
                    ctx.csrf,
                    cls="danger",
                    confirm="Remove this job and its steps for good?",
                )
            )
        return "<br>".join(out) if out else '<p class="muted">No action applies.</p>'

    # ------------------------------------------------------------------ actions

    async def _act(
        self,
        ctx: _Req,
        action: str,
        call: Callable[[], Awaitable[Any]],
        *,
        back: str,
        back_query: Mapping[str, Any] | None = None,
        job_id: str | None = None,
        queue: str | None = None,
        done: str | None = None,
        gone: str | None = None,
    ) -> Response:
        client = ctx.request.client.host if ctx.request.client else None
        try:
            result = await call()
        except JobsError as exc:
            log.info(
                "jobs.dashboard.action",
                extra={
                    "event": "jobs.dashboard.action",
                    "action": action,
                    "job_id": job_id,
                    "queue": queue,
                    "client": client,
                    "code": str(exc.code),
                },
            )
            return RedirectResponse(
                _href(ctx.root, back, {**(back_query or {}), "refused": exc.code}), status_code=303
            )
        log.info(
            "jobs.dashboard.action",
            extra={
                "event": "jobs.dashboard.action",
                "action": action,
                "job_id": job_id,
                "queue": queue,
                "client": client,
                "code": None,
            },
        )
        query: dict[str, Any] = {**(back_query or {}), "ok": done or action}
        if hasattr(result, "affected") and hasattr(result, "remaining"):
            query.update(affected=result.affected, remaining=result.remaining)
        return RedirectResponse(_href(ctx.root, gone or back, query), status_code=303)

    async def retry(self, ctx: _Req) -> Response:
        job_id = str(ctx.request.path_params["job_id"])
        step = ctx.form.get("from_step") or None
        return await self._act(
            ctx,
            "retry",
            lambda: self.jobs.requeue(job_id, from_step=step),
            back=f"/{job_id}",
            job_id=job_id,
            done="retried",
        )

    async def cancel(self, ctx: _Req) -> Response:
        job_id = str(ctx.request.path_params["job_id"])
        reason = (ctx.form.get("reason") or "").strip() or "cancelled from the dashboard"
        return await self._act(
            ctx,
            "cancel",
            lambda: self.jobs.cancel(job_id, reason=reason),
            back=f"/{job_id}",
            job_id=job_id,
            done="cancelled",
        )

    async def promote(self, ctx: _Req) -> Response:
        job_id = str(ctx.request.path_params["job_id"])
        return await self._act(
            ctx,
            "promote",
            lambda: self.jobs.promote(job_id),
            back=f"/{job_id}",
            job_id=job_id,
            done="promoted",
        )

    async def remove(self, ctx: _Req) -> Response:
        job_id = str(ctx.request.path_params["job_id"])
        return await self._act(
            ctx,
            "remove",
            lambda: self.jobs.remove(job_id),
            back=f"/{job_id}",
            job_id=job_id,
            done="removed",
            gone="/jobs",
        )

    async def resolve(self, ctx: _Req) -> Response:
        job_id = str(ctx.request.path_params["job_id"])
        step = ctx.form.get("step") or ""
        ran = ctx.form.get("ran") == "1"
        text = (ctx.form.get("output") or "").strip()

        async def call() -> None:
            output: Any = None
            if ran and text:
                import orjson

                try:
                    output = orjson.loads(text)
                except orjson.JSONDecodeError:
                    raise JobsError(
                        ErrorCode.X_INVARIANT, "the step's output must be JSON"
                    ) from None
            await self.jobs.resolve_step(job_id, step, ran=ran, output=output)

        return await self._act(
            ctx, "resolve-step", call, back=f"/{job_id}", job_id=job_id, done="resolved"
        )

    async def pause(self, ctx: _Req) -> Response:
        queue = ctx.form.get("queue") or ""
        return await self._act(
            ctx,
            "pause",
            lambda: self.jobs.pause_queue(queue),
            back="/",
            queue=queue,
            done="paused",
        )

    async def resume(self, ctx: _Req) -> Response:
        queue = ctx.form.get("queue") or ""
        return await self._act(
            ctx,
            "resume",
            lambda: self.jobs.resume_queue(queue),
            back="/",
            queue=queue,
            done="resumed",
        )

    async def bulk(self, ctx: _Req) -> Response:
        """``POST /bulk``: one bounded ``requeue_many`` / ``remove_many`` /
        ``promote_many`` over the list's filter (at most ``MAX_BULK_ROWS`` rows a
        press; the flash says how many remain)."""
        form = ctx.form
        op = form.get("op", "")
        filters = {
            "state": form.get("state") or "",
            "queue": form.get("queue") or None,
            "name": form.get("name") or None,
            "tenant_id": form.get("tenant_id") or None,
        }
        back = "/dead" if form.get("back") == "/dead" else "/jobs"
        calls = {
            "requeue": self.jobs.requeue_many,
            "remove": self.jobs.remove_many,
            "promote": self.jobs.promote_many,
        }
        method = calls.get(op)
        if method is None:
            return RedirectResponse(
                _href(ctx.root, back, {"refused": "X_INVARIANT"}), status_code=303
            )
        keep = {k: v for k, v in filters.items() if v}
        if back == "/dead":
            keep.pop("state", None)
        return await self._act(
            ctx,
            f"{op}_many",
            lambda: method(
                state=str(filters["state"]),
                queue=filters["queue"],
                name=filters["name"],
                tenant_id=filters["tenant_id"],
            ),
            back=back,
            back_query=keep,
            queue=filters["queue"],
        )


# --------------------------------------------------------------------------- helpers


async def _or_empty(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except JobsError:
        return []


async def _read_form(request: Request) -> dict[str, str] | None:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/x-www-form-urlencoded", ""):
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return dict(parse_qsl(text, keep_blank_values=True))


def _forbidden(message: str, *, status: int = 403) -> Response:
    html = (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Forbidden</title></head>"
        f"<body><h1>{status}</h1><p>{H.esc(message)}</p></body></html>"
    )
    return HTMLResponse(
        html,
        status_code=status,
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )


def _secure(response: Response, ctx: _Req) -> None:
    headers = response.headers
    headers["Content-Security-Policy"] = (
        f"default-src 'none'; style-src 'nonce-{ctx.nonce}'; script-src 'nonce-{ctx.nonce}'; "
        "connect-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    headers["X-Frame-Options"] = "DENY"
    headers["X-Content-Type-Options"] = "nosniff"
    headers["Referrer-Policy"] = "same-origin"
    headers["Cache-Control"] = "no-store"
    if ctx.new_cookie:
        # Lax, not Strict: a link into the dashboard from elsewhere (a chat, an
        # alert) carries the cookie, so it is not re-minted under the other open
        # tabs' forms; a cross-site POST still goes without it.
        response.set_cookie(
            CSRF_COOKIE,
            ctx.cookie,
            path=(ctx.root or "") + "/",
            httponly=True,
            samesite="lax",
            secure=ctx.request.url.scheme == "https",
        )


def _flash(query: Mapping[str, str]) -> str:
    refused = query.get("refused")
    if refused and _CODE_SHAPE.match(refused):
        hint = _HINTS.get(refused, "")
        return (
            f'<div class="flash bad"><b>Refused: {H.esc(refused)}</b>'
            f"{' — ' + H.esc(hint) if hint else ''}</div>"
        )
    done = query.get("ok")
    if done in _DONE_TEXT:
        text = _DONE_TEXT[done]
        affected, remaining = query.get("affected"), query.get("remaining")
        if affected and remaining and affected.isdigit() and remaining.isdigit():
            text += f" {affected} changed, {remaining} still match"
            text += " — press again to go on." if int(remaining) else "."
        return f'<div class="flash ok">{H.esc(text)}</div>'
    return ""


def _minutes(now: float) -> dict[float, int]:
    last = math.floor(now / 60) * 60
    return {last - (SPARK_MINUTES - 1 - i) * 60.0: i for i in range(SPARK_MINUTES)}


def _link_count(ctx: _Req, queue: str, state: str, count: int) -> str:
    if not count:
        return "0"
    return f'<a href="{H.url(ctx.root, "/jobs", {"queue": queue, "state": state})}">{count}</a>'


def _throughput(per_name: dict[str, list[CounterRow]], minutes: dict[float, int]) -> str:
    rows = []
    for name in sorted(per_name):
        series = [0.0] * len(minutes)
        bad = [0.0] * len(minutes)
        done = retried = failed = dead = 0
        duration = 0.0
        for row in per_name[name]:
            done += row.done
            retried += row.retried
            failed += row.failed
            dead += row.dead
            duration += row.duration
            index = minutes.get(row.bucket)
            if index is not None:
                series[index] += row.done
                bad[index] += row.failed + row.dead
        settled = done + retried + failed + dead
        mean = H.seconds(duration / settled) if settled and duration else "—"
        rows.append(
            f"<tr><td>{H.esc(name)}</td><td class='num'>{done}</td><td class='num'>{retried}</td>"
            f"<td class='num'>{failed}</td><td class='num'>{dead}</td><td class='num'>{mean}</td>"
            f"<td>{H.sparkline(series, bad, title=f'{name}: done per minute')}</td></tr>"
        )
    head = [
        "<th>Job</th>",
        '<th class="num">Done</th>',
        '<th class="num">Retried</th>',
        '<th class="num">Failed</th>',
        '<th class="num">Dead</th>',
        '<th class="num">Mean duration</th>',
        "<th>Per minute</th>",
    ]
    return H.table(head, rows, empty="No job settled in the last hour.")


def _workers_table(ctx: _Req, workers: list[WorkerInfo], now: float) -> str:
    rows = []
    for w in workers:
        slots = ", ".join(f"{H.esc(q)}={n}" for q, n in w.slots.items())
        held = "".join(
            f'<a class="mono" href="{H.url(ctx.root, "/" + j)}">{H.esc(j[:8])}</a> '
            for j in list(w.in_flight)[:12]
        )
        more = f" +{len(w.in_flight) - 12}" if len(w.in_flight) > 12 else ""
        rows.append(
            f'<tr><td class="mono">{H.esc(w.id[:8])}</td><td>{H.esc(w.host)}</td>'
            f'<td class="num">{w.pid}</td><td>{H.esc(", ".join(w.queues))}</td>'
            f"<td>{slots}</td><td>{len(w.in_flight)} {held}{more}</td>"
            f"<td>{H.ago(w.started_at, now)}</td>"
            f"<td><b>{H.ago(w.last_heartbeat, now)}</b></td></tr>"
        )
    head = [
        "<th>Worker</th>",
        "<th>Host</th>",
        '<th class="num">Pid</th>',
        "<th>Queues</th>",
        "<th>Slots</th>",
        "<th>In flight</th>",
        "<th>Started</th>",
        "<th>Last heartbeat</th>",
    ]
    return H.table(
        head,
        rows,
        empty="No live worker (a worker leaves one visibility timeout after its last heartbeat).",
    )


def _jobs_table(ctx: _Req, rows: Any, now: float, *, errors: bool) -> str:
    out = []
    for v in rows:
        error = ""
        if errors:
            text = v.last_error or ""
            if v.error_code and text.startswith(f"{v.error_code}: "):
                text = text[len(v.error_code) + 2 :]
            text = text[:160]
            error = (
                f"<td><b>{H.esc(v.error_code or '')}</b> "
                f'<span class="muted">{H.esc(text)}</span></td>'
            )
        out.append(
            f'<tr><td><a class="mono" href="{H.url(ctx.root, "/" + v.id)}">{H.esc(v.id[:8])}</a></td>'
            f"<td>{H.esc(v.name)}</td><td>{H.esc(v.queue)}</td><td>{H.badge(v.state)}</td>"
            f'<td class="num">{v.attempts}/{v.max_attempts}</td>'
            f"<td>{H.ago(v.created_at, now)}</td>"
            f"<td>{H.ago(v.run_at, now) if v.state in ('ready', 'delayed') else '—'}</td>"
            + (error or f"<td>{H.esc(v.error_code or '')}</td>")
            + "</tr>"
        )
    head = [
        "<th>Id</th>",
        "<th>Job</th>",
        "<th>Queue</th>",
        "<th>State</th>",
        '<th class="num">Attempts</th>',
        "<th>Created</th>",
        "<th>Runs</th>",
        "<th>Error</th>",
    ]
    return H.table(head, out, empty="No job matches.")


def _filter_form(
    ctx: _Req, path: str, filters: dict[str, str], limit: str, fixed_state: str | None
) -> str:
    def field(name: str, label: str, kind: str = "text", size: int = 14) -> str:
        return (
            f'<label>{H.esc(label)}<input type="{kind}" name="{name}" '
            f'value="{H.esc(filters.get(name, ""))}" size="{size}"></label>'
        )

    state = ""
    if fixed_state is None:
        options = '<option value="">any</option>' + "".join(
            f'<option value="{s}"{" selected" if filters["state"] == s else ""}>{s}</option>'
            for s in ALL_STATES
        )
        state = f'<label>State<select name="state">{options}</select></label>'
    return (
        f'<form method="get" action="{H.url(ctx.root, path)}" class="card filters">'
        + field("queue", "Queue")
        + field("name", "Job name", size=22)
        + state
        + field("tenant_id", "Tenant")
        + field("id_prefix", "Id prefix", size=10)
        + field("created_from", "Created from (UTC)", "datetime-local", 18)
        + field("created_to", "Created before (UTC)", "datetime-local", 18)
        + f'<label>Rows<input type="number" name="limit" value="{H.esc(limit)}" min="1" '
        f'max="{MAX_JOB_PAGE}" size="4"></label>'
        + '<button type="submit" class="btn primary">Filter</button>'
        + f'<a href="{H.url(ctx.root, path)}">clear</a></form>'
    )


def _bulk_form(ctx: _Req, filters: dict[str, str], back: str) -> str:
    fields = {
        **ctx.csrf,
        "state": filters["state"],
        "queue": filters["queue"],
        "name": filters["name"],
        "tenant_id": filters["tenant_id"],
        "back": back,
    }
    what = f"every {filters['state']} job" + (
        f" of queue {filters['queue']}" if filters["queue"] else ""
    )
    if filters["name"]:
        what += f" named {filters['name']}"
    buttons = [
        H.button_form(
            H.url(ctx.root, "/bulk"),
            "Requeue matching",
            {**fields, "op": "requeue"},
            confirm=f"Requeue {what}?",
        ),
        H.button_form(
            H.url(ctx.root, "/bulk"),
            "Remove matching",
            {**fields, "op": "remove"},
            cls="danger",
            confirm=f"Remove {what} for good?",
        ),
    ]
    if filters["state"] in ("delayed", "ready"):
        buttons.append(
            H.button_form(
                H.url(ctx.root, "/bulk"),
                "Promote matching",
                {**fields, "op": "promote"},
                confirm=f"Run {what} now?",
            )
        )
    return (
        f'<div class="card"><b>Bulk</b> <span class="muted">— {H.esc(what)}; at most 1,000 rows '
        f"a press; the id-prefix and created-at filters do not apply</span>"
        f"<br>{''.join(buttons)}</div>"
    )


def create_app(
    jobs: Jobs,
    *,
    auth: Auth | None = None,
    secret: bytes | None = None,
    registry: CollectorRegistry | None = None,
    reveal_unregistered: bool = False,
) -> Starlette:
    """The jobs dashboard as an ASGI app, to mount at ``/admin/jobs`` (any prefix
    works: links follow the mount's ``root_path``).

    Pages: ``/`` (queues, throughput, workers, newest dead letters), ``/jobs``
    (filters and keyset paging), ``/dead``, ``/workers``, ``/<job id>`` (the
    step timeline, error, progress and actions), and ``/metrics`` (Prometheus).

    Access is closed by default: without ``auth`` only loopback clients that
    are not behind a proxy are served (403 otherwise). ``auth(request)`` answers
    (or awaits) ``True`` to serve a request; it then decides alone. Every action
    is a POST carrying a CSRF token bound to a cookie and signed with ``secret``
    (random per process unless given: pass one when several processes serve
    one dashboard). ``registry`` is the prometheus-client registry ``/metrics``
    exposes (the default one unless given). A ``sensitive=True`` job's payload,
    outputs and keys are ``[redacted]`` (its handle or its row says so); a row
    that does not say, of a job whose handle the facade does not know, is
    hidden too unless ``reveal_unregistered=True``.

    The app must be served on Trio (the facade's loop), e.g. with
    :func:`trio_jobs.web.serve` or ``hypercorn.trio.serve``::

        app = Starlette(routes=[Mount("/admin/jobs", create_app(jobs, auth=is_admin))])
    """
    dashboard = Dashboard(
        jobs,
        auth=auth,
        secret=secret,
        registry=registry,
        reveal_unregistered=reveal_unregistered,
    )
    # The operator's view: no ambient actor the mounting app set confines it.
    app = Starlette(routes=dashboard.routes(), middleware=[Middleware(AsOperator)])
    app.state.dashboard = dashboard
    return app
