"""``trio-jobs dashboard``: serve the dashboard and ``/metrics`` on the database."""

from __future__ import annotations

import importlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from ..errors import ErrorCode, JobsError
from ._common import log_event, resolve_database

__all__ = ["check_host", "load_attr", "serve_dashboard"]

_NO_AUTH = (
    "bind 127.0.0.1, or pass --auth MODULE:ATTR (a function of the request answering True "
    "for an operator)"
)


def check_host(host: str, has_auth: bool) -> None:
    """Refuse, before anything opens, a host nothing can bind, or one that is not
    loopback without an auth hook. The host is never echoed."""
    from ..web._security import is_loopback_host

    if not host or host != host.strip():
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "--host is an address to bind (127.0.0.1, ::1, 0.0.0.0), without spaces",
        )
    if not has_auth and not is_loopback_host(host):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"refusing to serve the dashboard on a --host that is not loopback without an auth "
            f"hook: {_NO_AUTH}",
        )


def load_attr(target: str, what: str) -> Any:
    """``module:attr`` → the object, or ``X_CONFIG_INVALID`` saying what was wrong.
    The current folder is importable, as for ``trio-jobs worker``."""
    from ._args import check_target

    module_name, attr = check_target(target, what)
    here = str(Path.cwd())
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"{what}: cannot import {module_name!r} ({type(exc).__name__}); run from the "
            "folder that holds it, or put it on PYTHONPATH",
        ) from None
    except Exception as exc:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"{what}: importing {module_name!r} raised {type(exc).__name__}; run "
            f'`python -c "import {module_name}"` to see the traceback',
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise JobsError(ErrorCode.X_CONFIG_INVALID, f"{what}: {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"{what} must name a function of the request answering True for an operator",
        )
    return obj


async def serve_dashboard(
    host: str,
    port: int,
    database_url: str | None,
    auth: Callable[..., Any] | None,
    announce: Callable[[list[str]], None],
    allowed_hosts: Sequence[str] | None = None,
) -> None:
    """Open the facade on the database and serve until SIGINT/SIGTERM."""
    from .. import open_jobs
    from ..web import serve
    from ..web._security import is_loopback_host

    if auth is None and not is_loopback_host(host):
        # Refused before anything opens or binds.
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"refusing to serve the dashboard on a --host that is not loopback without an auth "
            f"hook: {_NO_AUTH}",
        )
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        db = await resolve_database(database_url)
        async with open_jobs(db.driver()) as jobs, trio.open_nursery() as nursery:
            urls = await nursery.start(
                lambda task_status: serve(
                    jobs,
                    host,
                    port,
                    auth,
                    allowed_hosts=allowed_hosts,
                    task_status=task_status,
                )
            )
            log_event(logging.INFO, "jobs.dashboard.serving", urls=urls, database=db.source)
            announce(urls)
            async for _signum in signals:
                nursery.cancel_scope.cancel()
                break
