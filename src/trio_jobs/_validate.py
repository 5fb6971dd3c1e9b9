"""One validation for what reaches a driver: text, instants, priorities.

Every driver stores what the facade hands it, and each one would refuse (or
corrupt) something else: PostgreSQL ``text`` holds no NUL character, a
``float8`` instant of NaN or ``1e20`` is stored and then cannot be shown, an
``integer`` priority overflows at 2**31, while the memory and Redis drivers
accept all of it. So the facade checks each value here, once, before any driver
sees it, and every driver sees the same accepted range.

These helpers raise :class:`JobsError` with the code the caller names (each call
site keeps the code its neighbouring checks use) and a message naming the
argument and the fault, never the value.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

from .errors import ErrorCode, JobsError

__all__ = [
    "MAX_EPOCH",
    "MAX_PRIORITY",
    "MIN_EPOCH",
    "MIN_PRIORITY",
    "UNSTORABLE",
    "check_priority",
    "check_text",
    "epoch",
    "storable",
    "text_fault",
]

#: The earliest instant a caller may pass (``run_at=``, a filter's bound):
#: 1970-01-01T00:00:00Z, the Unix epoch.
MIN_EPOCH = 0.0
#: The latest: 9999-12-31T23:59:59Z, the last second a ``datetime`` holds.
MAX_EPOCH = 253_402_300_799.0
#: The range of ``priority=``: a 32-bit signed integer (PostgreSQL's ``integer``).
MIN_PRIORITY = -(2**31)
MAX_PRIORITY = 2**31 - 1

# NUL: PostgreSQL text cannot hold it. A lone surrogate: no UTF-8 form, so no
# driver can send it (psycopg, coredis and the JSON encoder all refuse it).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def text_fault(value: str) -> str | None:
    """Why ``value`` cannot be stored as text by every driver, or ``None``."""
    found = UNSTORABLE.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "it holds a NUL character (\\x00), which PostgreSQL text cannot store"
    return "it holds half of a surrogate pair, which has no UTF-8 form"


def storable(text: str) -> str:
    """``text`` with each character no driver stores (NUL, a lone surrogate)
    replaced by U+FFFD: for text the library records rather than refuses (an
    exception's message, written to ``last_error`` and a step's error)."""
    return UNSTORABLE.sub("\ufffd", text)


def check_text(value: str, *, what: str, code: ErrorCode, fix: str = "") -> None:
    """Refuse a string no driver can store whole: ``what`` names it, ``fix`` says
    what to do instead (the value is never echoed)."""
    fault = text_fault(value)
    if fault is not None:
        tail = f"; {fix}" if fix else ""
        raise JobsError(code, f"{what} cannot be stored: {fault}{tail}")


def epoch(value: object, *, what: str, code: ErrorCode) -> float:
    """An aware ``datetime`` or epoch seconds, as float seconds within
    :data:`MIN_EPOCH` .. :data:`MAX_EPOCH` (1970 to the end of 9999, UTC)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise JobsError(code, f"{what}: pass an aware datetime (with a tzinfo)")
        seconds = value.timestamp()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise JobsError(code, f"{what}: pass an aware datetime or epoch seconds")
    else:
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    if math.isnan(seconds):
        raise JobsError(code, f"{what} is NaN; pass an aware datetime or epoch seconds")
    if not MIN_EPOCH <= seconds <= MAX_EPOCH:
        raise JobsError(
            code,
            f"{what} is outside what a timestamp holds: pass an instant from "
            "1970-01-01 to 9999-12-31 UTC (epoch seconds 0 to 253402300799)",
        )
    return seconds


def check_priority(value: object, *, code: ErrorCode) -> int:
    """A whole number within a 32-bit signed integer (lower runs first)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobsError(code, "priority must be an int (lower runs first)")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise JobsError(
            code,
            f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY} "
            "(a 32-bit integer; lower runs first)",
        )
    return value
