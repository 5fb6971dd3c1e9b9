"""Error codes and :class:`JobsError`.

Every code the specification names is a member of :class:`ErrorCode`. Codes are
added, never renamed: ``tests/unit/test_errors.py`` snapshots the list. An app may
raise :class:`JobsError` with its own ``X_*`` code and classify it with
:func:`register_error_retry`.

Messages say what to do. They never carry a payload value, a secret or PII.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Mapping
from typing import Any, Literal

__all__ = [
    "ErrorCode",
    "JobsError",
    "JobDeclarationError",
    "JobAbortedError",
    "DriverError",
    "RetryClass",
    "register_error_retry",
    "retry_class_of",
]


class ErrorCode(enum.StrEnum):
    """Every error code the library itself raises or records."""

    X_ABORTED = "X_ABORTED"
    X_BODY_INVALID = "X_BODY_INVALID"
    X_CHILD_FAILED = "X_CHILD_FAILED"
    X_CHILD_TIMEOUT = "X_CHILD_TIMEOUT"
    X_CONFIG_INVALID = "X_CONFIG_INVALID"
    X_CONSUMER_INVALID = "X_CONSUMER_INVALID"
    X_CONSUMER_SELF_ENQUEUE = "X_CONSUMER_SELF_ENQUEUE"
    X_DRAINING = "X_DRAINING"
    X_DRIVER_CONFLICT = "X_DRIVER_CONFLICT"
    X_DRIVER_UNAVAILABLE = "X_DRIVER_UNAVAILABLE"
    X_FORBIDDEN = "X_FORBIDDEN"
    X_IDEMPOTENCY_CONFLICT = "X_IDEMPOTENCY_CONFLICT"
    X_IDEMPOTENCY_REQUIRED = "X_IDEMPOTENCY_REQUIRED"
    #: An addition to the spec's codes: a job id prefix that matches more than
    #: one job (``jobs.show("6b63347c")``, ``trio-jobs show 6b63347c``).
    X_ID_AMBIGUOUS = "X_ID_AMBIGUOUS"
    X_ID_INVALID = "X_ID_INVALID"
    X_IMPORT_HEADER_MISMATCH = "X_IMPORT_HEADER_MISMATCH"
    X_IMPORT_RECORD_TOO_LARGE = "X_IMPORT_RECORD_TOO_LARGE"
    #: Additions to the spec's codes: a refused row's code in an import's error
    #: report (``{line, field, code}``; never raised): a record that is not
    #: UTF-8, one that is not csv / ndjson (an unclosed or stray quote, a ragged
    #: row, a NUL byte, a line that is not a JSON object), a field the schema
    #: refuses.
    X_IMPORT_ROW_ENCODING = "X_IMPORT_ROW_ENCODING"
    X_IMPORT_ROW_INVALID = "X_IMPORT_ROW_INVALID"
    X_IMPORT_ROW_MALFORMED = "X_IMPORT_ROW_MALFORMED"
    X_IMPORT_SOURCE_CHANGED = "X_IMPORT_SOURCE_CHANGED"
    #: An addition to the spec's codes: the object an import names is not in
    #: its store.
    X_IMPORT_SOURCE_MISSING = "X_IMPORT_SOURCE_MISSING"
    X_IMPORT_TOO_MANY_ERRORS = "X_IMPORT_TOO_MANY_ERRORS"
    X_INVARIANT = "X_INVARIANT"
    X_JOB_COMPENSATION_FAILED = "X_JOB_COMPENSATION_FAILED"
    X_JOB_CONCURRENCY_UNENFORCEABLE = "X_JOB_CONCURRENCY_UNENFORCEABLE"
    X_JOB_CRASH_DIVERGED = "X_JOB_CRASH_DIVERGED"
    X_JOB_DECLARATION_INVALID = "X_JOB_DECLARATION_INVALID"
    X_JOB_DUPLICATE = "X_JOB_DUPLICATE"
    X_JOB_ENQUEUE_BATCH_TOO_LARGE = "X_JOB_ENQUEUE_BATCH_TOO_LARGE"
    X_JOB_EVENT_INVALID = "X_JOB_EVENT_INVALID"
    X_JOB_INPUT_INVALID = "X_JOB_INPUT_INVALID"
    X_JOB_KEY_BUSY = "X_JOB_KEY_BUSY"
    X_JOB_LEASE_LOST = "X_JOB_LEASE_LOST"
    X_JOB_MAX_ATTEMPTS = "X_JOB_MAX_ATTEMPTS"
    X_JOB_NONDETERMINISTIC = "X_JOB_NONDETERMINISTIC"
    X_JOB_NOT_CANCELLABLE = "X_JOB_NOT_CANCELLABLE"
    X_JOB_NOT_FOUND = "X_JOB_NOT_FOUND"
    X_JOB_NOT_REMOVABLE = "X_JOB_NOT_REMOVABLE"
    X_JOB_NOT_REQUEUEABLE = "X_JOB_NOT_REQUEUEABLE"
    X_JOB_ON_SETTLED_FAILED = "X_JOB_ON_SETTLED_FAILED"
    X_JOB_PAGE_INVALID = "X_JOB_PAGE_INVALID"
    X_JOB_REFRESH_VIEW_INVALID = "X_JOB_REFRESH_VIEW_INVALID"
    X_JOB_ROLLUP_INVALID = "X_JOB_ROLLUP_INVALID"
    X_JOB_SLOT_LOST = "X_JOB_SLOT_LOST"
    X_JOB_TENANT_MISMATCH = "X_JOB_TENANT_MISMATCH"
    X_JOB_TIMEOUT = "X_JOB_TIMEOUT"
    X_NOT_IMPLEMENTED = "X_NOT_IMPLEMENTED"
    X_N_PLUS_ONE_WRITE = "X_N_PLUS_ONE_WRITE"
    X_RATE_LIMITED = "X_RATE_LIMITED"
    X_RATE_LIMIT_NOT_SHARED = "X_RATE_LIMIT_NOT_SHARED"
    X_SIMULATION_INVARIANT = "X_SIMULATION_INVARIANT"
    X_STEP_DUPLICATE = "X_STEP_DUPLICATE"
    X_STEP_OUTCOME_UNKNOWN = "X_STEP_OUTCOME_UNKNOWN"
    X_STEP_OUTPUT_UNSERIALIZABLE = "X_STEP_OUTPUT_UNSERIALIZABLE"
    X_SUBJECT_CYCLE = "X_SUBJECT_CYCLE"
    X_SUBJECT_ERASE_INCOMPLETE = "X_SUBJECT_ERASE_INCOMPLETE"
    X_SUBJECT_TABLE_UNDECLARED = "X_SUBJECT_TABLE_UNDECLARED"
    X_SUBJECT_TREATMENT_INVALID = "X_SUBJECT_TREATMENT_INVALID"
    X_TASK_NOT_FOUND = "X_TASK_NOT_FOUND"
    X_WEBHOOK_DELIVERY_FAILED = "X_WEBHOOK_DELIVERY_FAILED"
    X_WEBHOOK_DELIVERY_REJECTED = "X_WEBHOOK_DELIVERY_REJECTED"
    X_WEBHOOK_DELIVERY_THROTTLED = "X_WEBHOOK_DELIVERY_THROTTLED"
    X_WEBHOOK_ENDPOINT_DISABLED = "X_WEBHOOK_ENDPOINT_DISABLED"
    X_WEBHOOK_ENDPOINT_INVALID = "X_WEBHOOK_ENDPOINT_INVALID"
    X_WEBHOOK_ENDPOINT_UNKNOWN = "X_WEBHOOK_ENDPOINT_UNKNOWN"
    X_WEBHOOK_EVENT_ID_INVALID = "X_WEBHOOK_EVENT_ID_INVALID"
    X_WEBHOOK_EVENT_INVALID = "X_WEBHOOK_EVENT_INVALID"
    X_WEBHOOK_EVENT_UNKNOWN = "X_WEBHOOK_EVENT_UNKNOWN"
    X_WEBHOOK_INVALID = "X_WEBHOOK_INVALID"
    X_WEBHOOK_RECEIVER_INVALID = "X_WEBHOOK_RECEIVER_INVALID"
    X_WEBHOOK_RECEIVER_UNAVAILABLE = "X_WEBHOOK_RECEIVER_UNAVAILABLE"
    X_WEBHOOK_SIGNATURE_INVALID = "X_WEBHOOK_SIGNATURE_INVALID"
    X_WEBHOOK_SIGNATURE_STALE = "X_WEBHOOK_SIGNATURE_STALE"


_CODE_RE = re.compile(r"X_[A-Z0-9_]+")

RetryClass = Literal["terminal", "retry-after"]

# The library's own classification. An app extends it with register_error_retry().
_BUILTIN_RETRY: dict[str, RetryClass] = {
    ErrorCode.X_STEP_DUPLICATE: "terminal",
    ErrorCode.X_STEP_OUTCOME_UNKNOWN: "terminal",
    ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE: "terminal",
    ErrorCode.X_JOB_EVENT_INVALID: "terminal",
    ErrorCode.X_JOB_TENANT_MISMATCH: "terminal",
    ErrorCode.X_JOB_INPUT_INVALID: "terminal",
    ErrorCode.X_JOB_DECLARATION_INVALID: "terminal",
    ErrorCode.X_CONSUMER_SELF_ENQUEUE: "terminal",
    ErrorCode.X_JOB_ROLLUP_INVALID: "terminal",
    ErrorCode.X_JOB_REFRESH_VIEW_INVALID: "terminal",
    # The same file gives the same answer (PYTHON-API.md, data jobs).
    ErrorCode.X_IMPORT_HEADER_MISMATCH: "terminal",
    ErrorCode.X_IMPORT_RECORD_TOO_LARGE: "terminal",
    ErrorCode.X_IMPORT_SOURCE_CHANGED: "terminal",
    ErrorCode.X_IMPORT_SOURCE_MISSING: "terminal",
    ErrorCode.X_IMPORT_TOO_MANY_ERRORS: "terminal",
    # The same declaration and tables give the same answer (PYTHON-API, data jobs).
    ErrorCode.X_SUBJECT_CYCLE: "terminal",
    ErrorCode.X_SUBJECT_ERASE_INCOMPLETE: "terminal",
    ErrorCode.X_SUBJECT_TABLE_UNDECLARED: "terminal",
    ErrorCode.X_SUBJECT_TREATMENT_INVALID: "terminal",
    # A consumer's callables answered what no retry changes (a cursor of the
    # wrong type, keys that cannot run): the same answer again.
    ErrorCode.X_CONSUMER_INVALID: "terminal",
    ErrorCode.X_RATE_LIMITED: "retry-after",
    ErrorCode.X_WEBHOOK_DELIVERY_THROTTLED: "retry-after",
    # webhook(): nothing was sent, and the same endpoint or event answers the
    # same on the next attempt (an app re-enabling an endpoint re-enqueues).
    ErrorCode.X_WEBHOOK_ENDPOINT_DISABLED: "terminal",
    ErrorCode.X_WEBHOOK_ENDPOINT_INVALID: "terminal",
    ErrorCode.X_WEBHOOK_ENDPOINT_UNKNOWN: "terminal",
    ErrorCode.X_WEBHOOK_EVENT_INVALID: "terminal",
    ErrorCode.X_WEBHOOK_EVENT_UNKNOWN: "terminal",
}
_app_retry: dict[str, RetryClass] = {}
_lock = threading.Lock()


def register_error_retry(classes: Mapping[str, RetryClass]) -> None:
    """Classify error codes for the retry path.

    ``"terminal"``: a failure with that code stops the job on the attempt that
    failed, without spending the attempts left. ``"retry-after"``: the error's
    ``meta["retry_after_seconds"]`` replaces the backoff delay (clamped by
    ``max_delay``). An unclassified code takes the ordinary retry path.

    >>> register_error_retry({"X_CARD_DECLINED": "terminal"})
    """
    checked: dict[str, RetryClass] = {}
    for code, klass in classes.items():
        if not isinstance(code, str) or not _CODE_RE.fullmatch(code):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "register_error_retry takes codes of the form X_UPPER_CASE; "
                f"got a key of type {type(code).__name__} that is not one",
            )
        if klass not in ("terminal", "retry-after"):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                f"register_error_retry: the class for {code} must be 'terminal' or 'retry-after'",
            )
        checked[code] = klass
    with _lock:
        _app_retry.update(checked)


def retry_class_of(code: str | None) -> RetryClass | None:
    """The retry classification of ``code``, or ``None`` when it is unclassified."""
    if code is None:
        return None
    with _lock:
        found = _app_retry.get(code)
    if found is not None:
        return found
    return _BUILTIN_RETRY.get(code)


def _reset_error_retry_for_tests() -> None:
    with _lock:
        _app_retry.clear()


class JobsError(Exception):
    """An error with a stable ``X_*`` code, a message that says what to do, and meta.

    ``JobsError(code, message, *, meta=None)`` accepts any ``X_[A-Z0-9_]+`` code,
    the app's own included. ``meta`` must be JSON-serialisable and never hold a
    payload value or a secret.
    """

    code: str
    message: str
    meta: dict[str, Any]

    def __init__(
        self, code: str, message: str = "", *, meta: Mapping[str, Any] | None = None
    ) -> None:
        code = str(code)
        if not _CODE_RE.fullmatch(code):
            raise ValueError(f"JobsError code must match X_[A-Z0-9_]+, got {code!r}")
        self.code = code
        self.message = message
        self.meta = dict(meta or {})
        super().__init__(code, message)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r}, meta={self.meta!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.code, self.message, self.meta))

    def to_json(self) -> dict[str, Any]:
        """The JSON form: ``{"code", "message", "meta"}``."""
        return {"code": self.code, "message": self.message, "meta": dict(self.meta)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobsError:
        """Rebuild an error from :meth:`to_json`'s form, picking the family subclass."""
        code = str(data["code"])
        klass = _family_of(code)
        return klass(code, str(data.get("message", "")), meta=data.get("meta") or {})

    @property
    def retry_class(self) -> RetryClass | None:
        """This error's retry classification (see :func:`register_error_retry`)."""
        return retry_class_of(self.code)


def _rebuild(klass: type[JobsError], code: str, message: str, meta: dict[str, Any]) -> JobsError:
    return klass(code, message, meta=meta)


class JobDeclarationError(JobsError):
    """A refused declaration: ``X_JOB_DECLARATION_INVALID``, ``X_IDEMPOTENCY_REQUIRED``."""


class JobAbortedError(JobsError):
    """The reason on an aborted ``ctx.signal``: ``X_ABORTED``, ``X_DRAINING``,
    ``X_JOB_TIMEOUT``, ``X_JOB_SLOT_LOST`` or ``X_JOB_LEASE_LOST``."""


class DriverError(JobsError):
    """A driver could not be reached or refused the call: ``X_DRIVER_UNAVAILABLE``;
    or the database aborted a statement to break a deadlock or a serialization
    conflict: ``X_DRIVER_CONFLICT``. Both are transient: the library retries its own
    statements that meet them, and never counts an attempt for them."""


_FAMILIES: dict[str, type[JobsError]] = {
    ErrorCode.X_JOB_DECLARATION_INVALID: JobDeclarationError,
    ErrorCode.X_IDEMPOTENCY_REQUIRED: JobDeclarationError,
    ErrorCode.X_ABORTED: JobAbortedError,
    ErrorCode.X_DRAINING: JobAbortedError,
    ErrorCode.X_JOB_TIMEOUT: JobAbortedError,
    ErrorCode.X_JOB_SLOT_LOST: JobAbortedError,
    ErrorCode.X_JOB_LEASE_LOST: JobAbortedError,
    ErrorCode.X_DRIVER_UNAVAILABLE: DriverError,
    ErrorCode.X_DRIVER_CONFLICT: DriverError,
}


def _family_of(code: str) -> type[JobsError]:
    return _FAMILIES.get(code, JobsError)


def error(code: ErrorCode | str, message: str, **meta: Any) -> JobsError:
    """Build the right family subclass for ``code`` (internal helper)."""
    return _family_of(str(code))(code, message, meta=meta or None)
