"""``trio-jobs dashboard``: serve the dashboard and ``/metrics`` on the database."""

from __future__ import annotations

import importlib
import logging
import signal
from collections.abc import Callable
from typing import Any

import trio

from ..errors import ErrorCode, JobsError
from ._common import log_event, resolve_database

__all__ = ["load_attr", "serve_dashboard"]


def load_attr(target: str, what: str) -> Any:
    """``module:attr`` → the object, or ``X_CONFIG_INVALID`` saying what was wrong."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID, f"{what} takes MODULE:ATTR, e.g. myapp.admin:auth"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"{what}: cannot import {module_name!r} ({type(exc).__name__})",
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID, f"{what}: {module_name!r} has no {attr!r}"
        ) from None


async def serve_dashboard(
    host: str,
    port: int,
    database_url: str | None,
    auth: Callable[..., Any] | None,
    announce: Callable[[list[str]], None],
) -> None:
    """Open the facade on the database and serve until SIGINT/SIGTERM."""
    from .. import open_jobs
    from ..drivers.postgres import postgres_driver
    from ..web import serve
    from ..web._security import is_loopback_host

    if auth is None and not is_loopback_host(host):
        # Refused before anything opens or binds.
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"refusing to serve the dashboard on {host!r} without an auth hook: bind 127.0.0.1, "
            "or pass --auth MODULE:ATTR (a function of the request answering True for an operator)",
        )
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        db = await resolve_database(database_url)
        async with open_jobs(postgres_driver(db.dsn)) as jobs, trio.open_nursery() as nursery:
            urls = await nursery.start(
                lambda task_status: serve(jobs, host, port, auth, task_status=task_status)
            )
            log_event(logging.INFO, "jobs.dashboard.serving", urls=urls, database=db.source)
            announce(urls)
            async for _signum in signals:
                nursery.cancel_scope.cancel()
                break
