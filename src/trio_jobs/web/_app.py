"""The dashboard: a Starlette app over the facade's operator surface.

Three modules, one concern each: this one is the plumbing (routes, the access
and CSRF checks, rendering, the response headers); :mod:`._pages` reads the
facade and picks a template (``jobs.stats()``, ``jobs.list()``,
``jobs.show()``, ...); :mod:`._actions` calls it (``jobs.requeue()``,
``jobs.cancel()``, ...). The HTML is in ``templates/`` (Jinja2, autoescape on;
:mod:`._templates`). There is no SQL here. The app runs on whatever loop
serves it; the facade and the PostgreSQL driver need that loop to be Trio's,
so serve it with Hypercorn's Trio worker (:func:`trio_jobs.web.serve` does).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl

import attrs
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from .._facade import Jobs
from ..drivers._protocol import JobView
from ..errors import ErrorCode, JobsError
from . import _actions, _pages
from ._metrics import CONTENT_TYPE, render_metrics
from ._operator import AsOperator
from ._receivers import ReceiverDoors, receiver_routes
from ._security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    Auth,
    HostGuard,
    HostRules,
    allowed,
    host_rules,
    new_cookie_value,
    new_secret,
    same_origin,
    token_for,
    token_ok,
)
from ._templates import environment

__all__ = ["Dashboard", "create_app"]

#: The most bytes one action's form body may hold.
MAX_FORM_BYTES = 64 * 1024
_COOKIE_SHAPE = re.compile(r"^[A-Za-z0-9_-]{20,100}$")
_CODE_SHAPE = re.compile(r"^X_[A-Z0-9_]{1,60}$")

NAV = (
    ("overview", "/", "Overview"),
    ("jobs", "/jobs", "Jobs"),
    ("dead", "/dead", "Dead letters"),
    ("workers", "/workers", "Workers"),
    ("backfills", "/backfills", "Backfills"),
    ("tasks", "/tasks", "Tasks"),
    ("consumers", "/consumers", "Consumers"),
    ("webhooks", "/webhooks", "Webhooks"),
)

_DONE_TEXT = {
    "retried": "Requeued: it runs again from its first unfinished step.",
    "cancelled": "Cancelled.",
    "promoted": "Promoted: it runs now.",
    "removed": "Removed.",
    "paused": "Queue paused: no worker claims from it until it is resumed.",
    "resumed": "Queue resumed.",
    "task_paused": "Task paused: no occurrence fires until it is resumed.",
    "task_resumed": "Task resumed: its catch_up decides what it missed.",
    "resolved": "Step resolved: retry the job to go on.",
    "requeue_many": "Requeued matching jobs.",
    "remove_many": "Removed matching jobs.",
    "promote_many": "Promoted matching jobs.",
}
HINTS = {
    "X_JOB_NOT_REQUEUEABLE": "only a finished (done, failed, dead or cancelled) job can be retried",
    "X_JOB_NOT_CANCELLABLE": "only a live (ready, delayed, running or suspended) job can be cancelled",
    "X_JOB_NOT_REMOVABLE": "a running job cannot be removed: cancel it first",
    "X_JOB_DUPLICATE": "a live job holds this job's idempotency key",
    "X_JOB_NOT_FOUND": "no job has that id (removed, or purged by retention)",
    "X_TASK_NOT_FOUND": "no scheduled task has that name",
    "X_JOB_NOT_PROMOTABLE": "only a job waiting on its run time can be promoted",
    "X_NOT_IMPLEMENTED": "this driver has no operator surface",
}


@attrs.define
class Req:
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


Handler = Callable[["Dashboard", Req], Awaitable[Response]]


class Dashboard:
    """The dashboard over one facade (see :func:`create_app`): the routes and
    the checks every request passes; the pages and the actions are the
    functions of :mod:`._pages` and :mod:`._actions`."""

    def __init__(
        self,
        jobs: Jobs,
        *,
        auth: Auth | None,
        secret: bytes | None,
        registry: CollectorRegistry | None,
        reveal_unregistered: bool,
        allowed_hosts: Iterable[str] | None = None,
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
        self.hosts: HostRules = host_rules(allowed_hosts, has_auth=auth is not None)
        self.jobs = jobs
        self.auth = auth
        self.secret = secret if secret is not None else new_secret()
        self.registry = registry
        self.reveal_unregistered = reveal_unregistered

    # ------------------------------------------------------------------ plumbing

    def routes(self) -> list[BaseRoute]:
        get, post = ["GET", "HEAD"], ["POST"]
        return [
            Route("/", self._wrap(_pages.overview), methods=get),
            Route("/jobs", self._wrap(_pages.job_list), methods=get),
            Route("/dead", self._wrap(_pages.dead_letters), methods=get),
            Route("/workers", self._wrap(_pages.worker_list), methods=get),
            Route("/backfills", self._wrap(_pages.backfill_list), methods=get),
            Route("/tasks", self._wrap(_pages.task_list), methods=get),
            Route("/consumers", self._wrap(_pages.consumer_list), methods=get),
            Route("/webhooks", self._wrap(_pages.webhook_list), methods=get),
            Route("/tasks/pause", self._wrap(_actions.pause_task), methods=post),
            Route("/tasks/resume", self._wrap(_actions.resume_task), methods=post),
            Route("/metrics", self.metrics, methods=get),
            Route("/queues/pause", self._wrap(_actions.pause), methods=post),
            Route("/queues/resume", self._wrap(_actions.resume), methods=post),
            Route("/bulk", self._wrap(_actions.bulk), methods=post),
            Route("/{job_id:uuid}", self._wrap(_pages.job_page), methods=get),
            Route("/{job_id:uuid}/retry", self._wrap(_actions.retry), methods=post),
            Route("/{job_id:uuid}/cancel", self._wrap(_actions.cancel), methods=post),
            Route("/{job_id:uuid}/promote", self._wrap(_actions.promote), methods=post),
            Route("/{job_id:uuid}/remove", self._wrap(_actions.remove), methods=post),
            Route("/{job_id:uuid}/resolve-step", self._wrap(_actions.resolve), methods=post),
        ]

    def middleware(self) -> list[Middleware]:
        """The ``Host`` check, ahead of every route (see :class:`HostGuard`)."""
        return [Middleware(HostGuard, rules=self.hosts)]

    def _wrap(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not await allowed(request, self.auth):
                return refused(
                    "This dashboard serves loopback clients only. Configure an auth hook "
                    "(create_app(jobs, auth=...)) to open it to others."
                    if self.auth is None
                    else "The auth hook refused this request."
                )
            cookie = request.cookies.get(CSRF_COOKIE, "")
            new_cookie = not _COOKIE_SHAPE.match(cookie)
            if new_cookie:
                cookie = new_cookie_value()
            ctx = Req(
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
                    return refused("The form is too large or not a form.", status=413)
                if new_cookie or not token_ok(self.secret, cookie, form.get(CSRF_FIELD)):
                    return refused("Missing or invalid CSRF token: reload the page and try again.")
                if not same_origin(request.headers):
                    return refused("A cross-site request was refused.")
                ctx.form = form
            response = await handler(self, ctx)
            _secure(response, ctx)
            return response

        return endpoint

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus' text format (behind the same access check)."""
        if not await allowed(request, self.auth):
            return refused("Metrics are served to loopback clients, or as the auth hook says.")
        body = await render_metrics(self.jobs, self.registry)
        return Response(body, media_type=CONTENT_TYPE, headers={"Cache-Control": "no-store"})

    def render(
        self, ctx: Req, template: str, *, active: str, status: int = 200, **values: Any
    ) -> Response:
        """A page: ``template`` over ``base.html`` with this request's context."""
        html = (
            environment()
            .get_template(template)
            .render(
                root=ctx.root,
                nonce=ctx.nonce,
                csrf=ctx.csrf,
                nav=NAV,
                active=active,
                flash=_flash(ctx.request.query_params),
                **values,
            )
        )
        return HTMLResponse(html, status_code=status)

    def error_page(self, ctx: Req, exc: JobsError, *, active: str) -> Response:
        status = 404 if exc.code == ErrorCode.X_JOB_NOT_FOUND else 400
        if exc.code == ErrorCode.X_NOT_IMPLEMENTED:
            status = 501
        return self.render(
            ctx,
            "error.html",
            active=active,
            status=status,
            code=str(exc.code),
            hint=HINTS.get(str(exc.code), ""),
            message=exc.message,
        )

    def redacted(self, view: JobView) -> bool:
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

    # The name the tests (and older callers) know.
    _redacted = redacted

    def unknown(self, view: JobView) -> bool:
        """Neither a handle nor the row says whether the job is sensitive."""
        return self.jobs.handle(view.name) is None and getattr(view, "sensitive", None) is None

    def now(self) -> float:
        return float(self.jobs.driver.now())


# --------------------------------------------------------------------------- helpers


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


def refused(message: str, *, status: int = 403) -> Response:
    """An access or CSRF refusal: a bare page, nothing of the dashboard's."""
    html = environment().get_template("refused.html").render(status=status, message=message)
    return HTMLResponse(
        html,
        status_code=status,
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )


def _secure(response: Response, ctx: Req) -> None:
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


def _flash(query: Mapping[str, str]) -> dict[str, str] | None:
    """The banner a redirect after an action asks for (``?ok=`` / ``?refused=``),
    from a fixed set of texts: nothing of the query is printed but a code."""
    refused_code = query.get("refused")
    if refused_code and _CODE_SHAPE.match(refused_code):
        return {"kind": "bad", "code": refused_code, "text": HINTS.get(refused_code, "")}
    done = query.get("ok")
    if done in _DONE_TEXT:
        text = _DONE_TEXT[done]
        affected, remaining = query.get("affected"), query.get("remaining")
        if affected and remaining and affected.isdigit() and remaining.isdigit():
            text += f" {affected} changed, {remaining} still match"
            text += " — press again to go on." if int(remaining) else "."
        return {"kind": "ok", "text": text}
    return None


def create_app(
    jobs: Jobs,
    *,
    auth: Auth | None = None,
    allowed_hosts: Iterable[str] | None = None,
    secret: bytes | None = None,
    registry: CollectorRegistry | None = None,
    reveal_unregistered: bool = False,
) -> Starlette:
    """The jobs dashboard as an ASGI app, to mount at ``/admin/jobs`` (any prefix
    works: links follow the mount's ``root_path``).

    Pages: ``/`` (queues, throughput, workers, newest dead letters), ``/jobs``
    (filters and keyset paging), ``/dead``, ``/workers``, ``/backfills``, ``/webhooks``, ``/<job id>`` (the
    attempt history, the step timeline, error, progress and actions), and
    ``/metrics`` (Prometheus).

    Every :func:`~trio_jobs.webhook_receiver` among the facade's jobs gets its
    door at its ``path`` (under the app's mount): ``POST``, and ``GET`` for its
    handshake. A receiver is a public door: the ``Host`` check, the auth hook,
    CSRF and the loopback rule below do not apply to it (its signature is its
    guard), and the dashboard's own routes answer first where paths overlap.

    Access is closed by default: without ``auth`` only loopback clients that
    are not behind a proxy are served (403 otherwise). ``auth(request)`` answers
    (or awaits) ``True`` to serve a request; it then decides who alone.

    Every request's ``Host`` is checked first (400 otherwise, nothing read):
    without ``allowed_hosts`` only ``localhost`` or a loopback address, on the
    port the app is served on, so a page on a DNS-rebinding domain cannot drive
    a loopback dashboard. ``allowed_hosts`` (with ``auth`` only) lists the names
    served instead: ``"jobs.example.com"`` (any port), ``"jobs.example.com:8443"``
    (that port), ``"*.example.com"`` (any subdomain), or ``"*"`` (any host, only
    when you say so); ``X_CONFIG_INVALID`` otherwise.

    Every action is a POST carrying a CSRF token bound to a cookie and signed
    with ``secret`` (random per process unless given: pass one when several
    processes serve one dashboard). ``registry`` is the prometheus-client
    registry ``/metrics`` exposes (the default one unless given). A
    ``sensitive=True`` job's payload, outputs and keys are ``[redacted]`` (its
    handle or its row says so), and its attempt history shows codes without
    messages; a row that does not say, of a job whose handle the facade does not
    know, is hidden too unless ``reveal_unregistered=True``.

    The app must be served on Trio (the facade's loop), e.g. with
    :func:`trio_jobs.web.serve` or ``hypercorn.trio.serve``::

        app = Starlette(routes=[Mount("/admin/jobs", create_app(jobs, auth=is_admin,
                                                                allowed_hosts=["ops.example.com"]))])
    """
    return build_app(
        jobs,
        auth=auth,
        allowed_hosts=allowed_hosts,
        secret=secret,
        registry=registry,
        reveal_unregistered=reveal_unregistered,
        receivers=True,
    )


def build_app(
    jobs: Jobs,
    *,
    auth: Auth | None,
    allowed_hosts: Iterable[str] | None,
    secret: bytes | None,
    registry: CollectorRegistry | None,
    reveal_unregistered: bool,
    receivers: bool,
) -> Starlette:
    """:func:`create_app`, with or without the receivers' doors (``standalone_app``
    mounts those at the top instead)."""
    dashboard = Dashboard(
        jobs,
        auth=auth,
        secret=secret,
        registry=registry,
        reveal_unregistered=reveal_unregistered,
        allowed_hosts=allowed_hosts,
    )
    routes = dashboard.routes()
    doors = receiver_routes(jobs) if receivers else []
    # The receivers' doors sit outside the Host check (a public door: the
    # signature is its guard); the dashboard's own routes answer first.
    outer = [Middleware(ReceiverDoors, routes=doors, shadow=lambda: routes)] if doors else []
    # The operator's view: no ambient actor the mounting app set confines it.
    app = Starlette(
        routes=routes,
        middleware=[*outer, *dashboard.middleware(), Middleware(AsOperator)],
    )
    app.state.dashboard = dashboard
    return app
