"""Serve the dashboard with Hypercorn's Trio worker, on the facade's own loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIFramework
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from .._facade import Jobs
from ..errors import ErrorCode, JobsError
from ._app import Dashboard, build_app
from ._receivers import ReceiverDoors, receiver_routes
from ._security import Auth, HostGuard, is_loopback_host

__all__ = ["DEFAULT_PREFIX", "serve", "standalone_app"]

#: Where :func:`serve` mounts the dashboard.
DEFAULT_PREFIX = "/admin/jobs"


def standalone_app(
    jobs: Jobs,
    *,
    auth: Auth | None = None,
    prefix: str = DEFAULT_PREFIX,
    secret: bytes | None = None,
    reveal_unregistered: bool = False,
    allowed_hosts: Iterable[str] | None = None,
) -> Starlette:
    """The dashboard mounted at ``prefix``, ``/metrics`` at the top, ``/`` redirecting
    to the dashboard: what :func:`serve` and ``trio-jobs dashboard`` serve. Every
    route, ``/metrics`` and ``/`` included, checks ``Host`` as
    :func:`~trio_jobs.web.create_app` says. Every
    :func:`~trio_jobs.webhook_receiver` among the facade's jobs is served at its
    own ``path`` (from the top, not under ``prefix``), outside those checks."""
    if not prefix.startswith("/") or prefix.endswith("/") or len(prefix) < 2:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID, "prefix is a path like /admin/jobs (no trailing slash)"
        )
    dashboard_app = build_app(
        jobs,
        auth=auth,
        allowed_hosts=allowed_hosts,
        secret=secret,
        registry=None,
        reveal_unregistered=reveal_unregistered,
        receivers=False,
    )
    dashboard: Dashboard = dashboard_app.state.dashboard

    async def home(request: Request) -> Response:
        return RedirectResponse(prefix + "/", status_code=307)

    routes: list[BaseRoute] = [
        Route("/", home, methods=["GET", "HEAD"]),
        Route("/metrics", dashboard.metrics, methods=["GET", "HEAD"]),
        Mount(prefix, app=dashboard_app),
    ]
    # The receivers' doors at their own paths, outside the Host check.
    doors = receiver_routes(jobs)
    outer = [Middleware(ReceiverDoors, routes=doors, shadow=lambda: routes)] if doors else []
    return Starlette(
        routes=routes,
        middleware=[*outer, Middleware(HostGuard, rules=dashboard.hosts)],
    )


async def serve(
    jobs: Jobs,
    host: str = "127.0.0.1",
    port: int = 8765,
    auth: Auth | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    secret: bytes | None = None,
    reveal_unregistered: bool = False,
    allowed_hosts: Iterable[str] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard at ``http://host:port/admin/jobs/`` and metrics at
    ``/metrics`` until cancelled; ``await nursery.start(serve, jobs, ...)``
    answers the bound URLs (``port=0`` picks a free port).

    Without ``auth`` a host that is not loopback (``0.0.0.0``, a LAN address, a
    hostname) is refused with ``X_CONFIG_INVALID`` before anything binds: the
    dashboard would otherwise be one proxy away from the world. Requests are
    answered only under the ``Host`` names ``allowed_hosts`` lists (with
    ``auth``), else under ``localhost`` or a loopback address on this port.
    """
    if auth is None and not is_loopback_host(host):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"refusing to serve the dashboard on {host!r} without an auth hook: bind 127.0.0.1, "
            "or pass auth= (a function of the request answering True for an operator)",
            meta={"host": host},
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise JobsError(ErrorCode.X_CONFIG_INVALID, "port is a whole number, 0 to 65535")
    app = standalone_app(
        jobs,
        auth=auth,
        prefix=prefix,
        secret=secret,
        reveal_unregistered=reveal_unregistered,
        allowed_hosts=allowed_hosts,
    )
    config = Config()
    name = host.strip("[]")
    config.bind = [f"[{name}]:{port}" if ":" in name else f"{name}:{port}"]
    config.accesslog = None
    config.errorlog = "-"
    # Starlette's ASGI signature is looser than Hypercorn's protocol type.
    await hypercorn_serve(cast(ASGIFramework, app), config, task_status=task_status)
