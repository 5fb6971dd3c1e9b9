"""Retrying the writes a run must land when the driver is briefly unavailable.

A run's settle (``ack``/``nack``: done, a retry, a sleep or wait hand-back, a
drain, a burial) and its step records are fenced on the claim and each has a
bounded write budget (``WRITE_BUDGET``). A driver that cannot be reached for a
moment (``X_DRIVER_UNAVAILABLE``: a database restart, a dropped connection;
``X_DRIVER_CONFLICT``: a deadlock or a serialization failure the server broke)
used to end the write at once: the settle was given up, the row stayed
``running`` until its lease lapsed and the job was redelivered with an attempt
counted. Now such a failure is retried with capped exponential backoff and
jitter, as long as

* the write budget has room for another try (``deadline``), and
* the claim's lease still holds as the worker knows it (``gone()`` is false):
  once the lease is surely gone, every retry would be refused by the fence.

Anything else (a refused fence answers ``False``, it does not raise; any other
error, a closed driver) is not retried. A retry is safe because every one of
these writes is fenced and idempotent per fence: the drivers recognise a retried
settle whose first try landed (its answer was lost), and a retried step write
reads the record back first (``RunState.put``). See
``docs/explanation/design-choices.md``, "Settles and step writes ride out a
short outage".
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import trio

from .errors import ErrorCode, JobsError
from .logging import emit

__all__ = [
    "RETRY_BASE",
    "RETRY_CAP",
    "TRANSIENT",
    "is_transient",
    "retry_delay",
    "retry_transient",
    "write_retrying",
]

T = TypeVar("T")

log = logging.getLogger("trio_jobs")

#: The first retry waits about this long; each next one twice as long...
RETRY_BASE = 0.1
#: ... up to this ceiling (a restart is seen within a second of its end).
RETRY_CAP = 1.0


#: The codes of a driver failure worth retrying: a refused or dropped connection
#: (every driver maps one to ``X_DRIVER_UNAVAILABLE``) and a statement the database
#: rolled back to break a deadlock or a serialization conflict (``X_DRIVER_CONFLICT``).
TRANSIENT = frozenset({ErrorCode.X_DRIVER_UNAVAILABLE, ErrorCode.X_DRIVER_CONFLICT})


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a driver failure worth retrying (:data:`TRANSIENT`)."""
    return isinstance(exc, JobsError) and exc.code in TRANSIENT


def retry_delay(key: str, retry: int) -> float:
    """The wait before retry number ``retry`` (1, 2, ...): ``RETRY_BASE * 2**(retry - 1)``
    capped at ``RETRY_CAP``, times a jitter in ``[0.5, 1)``.

    The jitter is drawn from ``key`` (the claim) and the retry's number, not
    from a shared random source: slots retrying after one outage spread out,
    and a seeded simulation replays the same waits."""
    ceiling = min(RETRY_CAP, RETRY_BASE * 2.0 ** min(retry - 1, 32))
    spread = zlib.crc32(f"{key}:{retry}".encode()) / 4294967296.0
    return ceiling * (0.5 + 0.5 * spread)


async def retry_transient(
    write: Callable[[], Awaitable[T]],
    first: JobsError,
    *,
    deadline: float,
    gone: Callable[[], bool],
    key: str,
    event: str,
    fields: Mapping[str, Any],
) -> T:
    """Retry ``write`` after its first try failed with ``first`` (transient).

    Each retry waits :func:`retry_delay` first and is logged as ``event`` with
    ``fields`` (the job's id and attempt, never a value). It stops, re-raising
    the last transient error, when the next try could not start before
    ``deadline`` (Trio time) or ``gone()`` says the lease is surely lost; a
    non-transient error is raised at once. Call it inside the write's shielded,
    bounded scope: a try in flight is never cut by this function, only by that
    scope's deadline."""
    last = first
    retry = 0
    while True:
        retry += 1
        delay = retry_delay(key, retry)
        if gone() or trio.current_time() + delay >= deadline:
            raise last
        emit(
            log,
            logging.WARNING,
            event,
            **{**fields, "code": last.code, "retry": retry, "retry_in": round(delay, 3)},
        )
        await trio.sleep(delay)
        if gone():
            raise last
        try:
            return await write()
        except JobsError as exc:
            if not is_transient(exc):
                raise
            last = exc


async def write_retrying(
    write: Callable[[], Awaitable[T]],
    *,
    again: Callable[[], Awaitable[T]] | None = None,
    deadline: float,
    gone: Callable[[], bool],
    about: Callable[[], tuple[str, str, Mapping[str, Any]]],
) -> T:
    """``write()`` once; after a transient failure, :func:`retry_transient` with
    ``again`` (a retry that first checks whether the lost try landed), or
    ``write`` itself. ``about()`` answers the retry's jitter key, log event and
    fields; it is called only on a failure, so the fast path builds nothing."""
    try:
        return await write()
    except JobsError as exc:
        if not is_transient(exc):
            raise
        key, event, fields = about()
        return await retry_transient(
            again if again is not None else write,
            exc,
            deadline=deadline,
            gone=gone,
            key=key,
            event=event,
            fields=fields,
        )
