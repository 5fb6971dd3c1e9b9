"""Bad input at the command line's door: each argument is checked before any I/O,
as far as the command can tell on its own (whether a job exists is the database's
answer).

Each check raises ``JobsError`` with a spec code and a message that names the
flag and says what to write instead. A message never repeats the value it
refuses: an argument in the wrong place may be a connection string, a password
or a payload.
"""

from __future__ import annotations

import re
from typing import Any

import click

from .._declare import _QUEUE_RE
from .._enqueue import job_ref
from ..drivers._cursor import decode_cursor
from ..drivers._protocol import MAX_JOB_PAGE, MIN_ID_PREFIX, ListFilter
from ..errors import ErrorCode, JobsError

__all__ = [
    "MAX_REASON",
    "check_arguments",
    "check_id",
    "check_id_prefix",
    "check_job_name",
    "check_page",
    "check_port",
    "check_queue",
    "check_reason",
    "check_step",
    "check_target",
    "check_tenant",
    "check_text",
]

#: The queue names ``job(queue=...)`` accepts: no job is in any other queue.
QUEUE_RE = _QUEUE_RE
#: The longest job name ``job(name=...)`` and step name ``step.run`` accept.
MAX_NAME = 200
#: The longest ``cancel --reason``: it is recorded as the job's last error.
MAX_REASON = 1_000
_ID_PREFIX_RE = re.compile(r"[0-9A-Fa-f-]{1,36}")


def _bad(message: str) -> JobsError:
    return JobsError(ErrorCode.X_CONFIG_INVALID, message)


def check_text(value: str, flag: str) -> None:
    """Any text argument: no NUL (PostgreSQL text cannot hold one) and valid
    UTF-8 (an argument the shell could not decode arrives with surrogates)."""
    if "\x00" in value:
        raise _bad(f"{flag} holds a NUL character, which PostgreSQL text cannot store; remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(
            f"{flag} is not valid UTF-8; check the encoding of the shell or script that passed it"
        ) from None


def _label(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def check_arguments(ctx: click.Context, values: dict[str, Any]) -> None:
    """:func:`check_text` on every text argument a command was given."""
    for param in ctx.command.params:
        value = values.get(param.name or "")
        if isinstance(value, str):
            check_text(value, _label(param))


def check_id(job_id: str, flag: str = "ID") -> None:
    """A job id is a UUID, or a prefix of one of at least 8 characters (the short
    id ``trio-jobs dev`` prints), which the database resolves to one job
    (``X_JOB_NOT_FOUND``, ``X_ID_AMBIGUOUS``). Anything else names no job: it is
    ``X_ID_INVALID``, refused before the database is opened."""
    try:
        job_ref(job_id)
    except JobsError:
        raise JobsError(
            ErrorCode.X_ID_INVALID,
            f"{flag} is a job's id as `trio-jobs list` prints it (0191c6a2-6c1e-7a3b-9f0e-...), "
            f"or its first {MIN_ID_PREFIX} or more characters (0191c6a2, 0191c6a2-6c1e)",
        ) from None


def check_id_prefix(prefix: str | None) -> None:
    if prefix is not None and not _ID_PREFIX_RE.fullmatch(prefix):
        raise _bad(
            "--id-prefix is the start of a job id: 1 to 36 hex digits and dashes "
            "(0191c6a2, 0191c6a2-6c1e)"
        )


def check_queue(queue: str | None, flag: str) -> None:
    if queue is not None and not QUEUE_RE.fullmatch(queue):
        raise _bad(
            f"{flag} is a queue name: 1-128 letters, digits, '_', '.', ':' or '-', as "
            "job(queue=...) declares it; `trio-jobs stats` lists the queues"
        )


def check_job_name(name: str | None, flag: str) -> None:
    if name is not None and (not name.strip() or len(name) > MAX_NAME):
        raise _bad(
            f"{flag} is a job name: a non-empty string of at most {MAX_NAME} characters, as "
            "job(name=...) declares it; `trio-jobs list` shows the names"
        )


def check_webhook_id(value: str | None, flag: str) -> None:
    if value is not None and (not value.strip() or len(value) > MAX_NAME):
        raise _bad(
            f"{flag} is an id a webhook delivery names: a non-empty string of at most "
            f"{MAX_NAME} characters; `trio-jobs webhooks` lists them"
        )
    if value is not None:
        check_text(value, flag)


def check_step(step: str | None, flag: str) -> None:
    if step is not None and (not step or len(step) > MAX_NAME):
        raise _bad(
            f"{flag} is a step name: a non-empty string of at most {MAX_NAME} characters; "
            "`trio-jobs show ID` lists a job's steps"
        )


def check_tenant(tenant: str | None) -> None:
    if tenant == "":
        raise _bad("--tenant is empty: name a tenant id, or leave the flag out for every tenant")


def check_reason(reason: str) -> None:
    if not reason.strip() or len(reason) > MAX_REASON:
        raise _bad(
            f"--reason says why, in at most {MAX_REASON} characters: it is recorded as the "
            "job's last error"
        )


#: ``ListFilter``'s refusals of a page, said in terms of the flags.
_PAGE_WORDING: dict[str, str] = {
    ErrorCode.X_INVARIANT: "pass --after (the older page) or --before (the newer one), not both",
    ErrorCode.X_JOB_PAGE_INVALID: (
        f"--limit is 1 to {MAX_JOB_PAGE} rows; page with the --after cursor for more"
    ),
}


def check_page(limit: int, after: str | None, before: str | None) -> None:
    """``list``'s page, refused by ``ListFilter``'s own validation and the
    cursor's checksum (the codes the driver would answer), worded for the flags."""
    try:
        ListFilter(limit=limit, after=after, before=before)
    except JobsError as exc:
        raise JobsError(exc.code, _PAGE_WORDING.get(exc.code, exc.message)) from None
    for flag, cursor, footer in (("--after", after, "older"), ("--before", before, "newer")):
        if cursor is None:
            continue
        try:
            decode_cursor(cursor)
        except JobsError:
            raise JobsError(
                ErrorCode.X_JOB_PAGE_INVALID,
                f"{flag} takes the cursor a page of `trio-jobs list` printed in its footer "
                f"(`{footer}: {flag} CURSOR`); leave it out for the newest page",
            ) from None


def check_port(port: int, flag: str = "--port") -> None:
    if not 0 <= port <= 65535:
        raise _bad(f"{flag} is a TCP port: a whole number from 0 (any free port) to 65535")


def check_target(target: str, flag: str | None = None) -> tuple[str, str]:
    """``MODULE[:ATTR]`` of dotted Python names → ``(module, attr)``; with
    ``flag`` (``--auth``) the ``:ATTR`` is required. A relative or malformed
    name is refused before anything is imported."""
    module, _, attr = target.partition(":")
    if (
        not _dotted(module)
        or (attr and not _dotted(attr))
        or (":" in target and not attr)
        or (flag is not None and not attr)
    ):
        if flag is not None:
            raise _bad(f"{flag} takes MODULE:ATTR, dotted Python names (e.g. myapp.admin:auth)")
        raise _bad(
            "name the jobs as MODULE or MODULE:ATTR, dotted Python names (e.g. myapp.jobs or "
            "myapp.jobs:all_jobs)"
        )
    return module, attr


def _dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))
