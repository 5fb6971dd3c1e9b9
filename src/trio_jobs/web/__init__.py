"""The web surface: the jobs dashboard, inbound webhook doors, Prometheus metrics
(``pip install 'trio-jobs[web]'``).

>>> from trio_jobs.web import create_app, serve, PrometheusObserver
>>> app = create_app(jobs, auth=is_operator)           # an ASGI app: mount it at /admin/jobs
>>> await nursery.start(serve, jobs, "127.0.0.1", 8765)  # or serve it on its own
>>> Worker(jobs, observer=PrometheusObserver())         # the worker's metrics
>>> mount_receivers(my_app, jobs)                      # webhook_receiver() doors in your app

The app runs on Trio, the facade's loop: serve it with Hypercorn's Trio worker
(:func:`serve` does, and so does ``hypercorn --worker-class trio``), never from
an asyncio server.
"""

from __future__ import annotations

try:
    import hypercorn  # noqa: F401
    import jinja2  # noqa: F401
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        f"trio_jobs.web needs the `web` extra: pip install 'trio-jobs[web]' ({exc.name} is missing)"
    ) from exc

from ._app import Dashboard, create_app
from ._metrics import PrometheusObserver, render_metrics
from ._receivers import mount_receivers
from ._security import CSRF_COOKIE, CSRF_FIELD, Auth
from ._serve import DEFAULT_PREFIX, serve, standalone_app

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "DEFAULT_PREFIX",
    "Auth",
    "Dashboard",
    "PrometheusObserver",
    "create_app",
    "mount_receivers",
    "render_metrics",
    "serve",
    "standalone_app",
]
