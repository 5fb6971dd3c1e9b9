"""The webhook ledger: one row per delivery attempt, and each endpoint's
consecutive failures and disabled mark.

The ledger is a seam (:class:`WebhookLedger`) handed to :func:`~trio_jobs.webhook`:
:func:`memory_webhook_ledger` keeps it in this process (development, tests);
:func:`postgres_webhook_ledger` keeps it in the ``trio_jobs_webhook_attempts``
and ``trio_jobs_webhook_endpoints`` tables (migration 0012), one statement per
call. Retention is the app's: nothing here deletes an attempt row.

What an attempt does to its endpoint's count is decided from the attempt
itself (:func:`effect_of`): a 2xx resets it, ``X_WEBHOOK_DELIVERY_FAILED`` and
``X_WEBHOOK_DELIVERY_REJECTED`` add one, anything else (a throttle, an attempt
refused before sending) leaves it. The write that brings the count to
``disable_after`` marks the endpoint disabled, in the same statement; only
:meth:`WebhookLedger.enable` clears the mark.
"""

from __future__ import annotations

import builtins
from collections import deque
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import attrs

from ._validate import check_text
from .errors import ErrorCode, JobsError

if TYPE_CHECKING:
    from ._facade import Jobs
    from .drivers._protocol import JobDriver
    from .drivers.postgres._driver import PostgresDriver

__all__ = [
    "MAX_WEBHOOK_ROWS",
    "WebhookAttempt",
    "WebhookEndpointState",
    "WebhookLedger",
    "effect_of",
    "memory_webhook_ledger",
    "postgres_webhook_ledger",
    "read_webhooks",
]

#: The most rows one ``attempts()`` or ``endpoints()`` call answers.
MAX_WEBHOOK_ROWS = 1_000
#: How many attempts the memory ledger keeps (the oldest go first).
MEMORY_LEDGER_ATTEMPTS = 10_000

Effect = Literal["ok", "fail", "none"]
_COUNTED = frozenset({ErrorCode.X_WEBHOOK_DELIVERY_FAILED, ErrorCode.X_WEBHOOK_DELIVERY_REJECTED})


@attrs.frozen
class WebhookAttempt:
    """One delivery attempt as the ledger keeps it.

    ``attempt`` is the job's attempt number; ``status`` the HTTP status the
    endpoint answered (``None`` for an attempt refused before sending, or one
    that got no answer: a timeout, a connection error); ``code`` the ``X_*``
    code it failed with (``None`` for a 2xx); ``at`` when it started (epoch
    seconds) and ``duration_ms`` how long it took."""

    endpoint_id: str
    event_id: str
    attempt: int
    status: int | None
    code: str | None
    at: float
    duration_ms: float


@attrs.frozen
class WebhookEndpointState:
    """An endpoint as the ledger knows it: ``consecutive_failures`` (reset by a
    2xx), ``disabled`` and since when (``disabled_at``, epoch seconds), and the
    newest attempt's time (``last_attempt_at``)."""

    endpoint_id: str
    consecutive_failures: int
    disabled: bool
    disabled_at: float | None
    last_attempt_at: float | None


def effect_of(attempt: WebhookAttempt) -> Effect:
    """What ``attempt`` does to its endpoint's consecutive failures."""
    if attempt.status is not None and 200 <= attempt.status < 300 and attempt.code is None:
        return "ok"
    if attempt.code in _COUNTED:
        return "fail"
    return "none"


@runtime_checkable
class WebhookLedger(Protocol):
    """Where :func:`~trio_jobs.webhook` records its attempts and reads whether
    an endpoint is disabled (asked before every send)."""

    async def record(self, attempt: WebhookAttempt, *, disable_after: int) -> bool:
        """Append ``attempt`` and apply its :func:`effect_of` to the endpoint's
        count; mark the endpoint disabled when the count reaches
        ``disable_after``. Answers whether the endpoint is disabled now."""
        ...

    async def is_disabled(self, endpoint_id: str) -> bool:
        """Whether the ledger marked ``endpoint_id`` disabled."""
        ...

    async def enable(self, endpoint_id: str) -> None:
        """Clear the endpoint's disabled mark and its consecutive failures (the
        app's call: the library never re-enables an endpoint)."""
        ...

    async def attempts(
        self,
        endpoint_id: str | None = None,
        event_id: str | None = None,
        *,
        limit: int = MAX_WEBHOOK_ROWS,
    ) -> builtins.list[WebhookAttempt]:
        """The newest ``limit`` attempts (of one endpoint and/or event when
        given), answered oldest first."""
        ...

    async def endpoints(
        self, *, limit: int = MAX_WEBHOOK_ROWS
    ) -> builtins.list[WebhookEndpointState]:
        """Every endpoint with an attempt, by id (at most ``limit``)."""
        ...


def _check_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise JobsError(ErrorCode.X_INVARIANT, f"{what} must be a string of 1 to 200 characters")
    check_text(value, what=what, code=ErrorCode.X_INVARIANT)
    return value


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_WEBHOOK_ROWS:
        raise JobsError(
            ErrorCode.X_INVARIANT,
            f"limit is how many rows to answer: a whole number from 1 to {MAX_WEBHOOK_ROWS}",
        )
    return limit


def _check_filters(endpoint_id: object, event_id: object, limit: object) -> int:
    """``attempts()``'s arguments, checked; answers the limit."""
    if endpoint_id is not None:
        _check_id(endpoint_id, "endpoint_id")
    if event_id is not None:
        _check_id(event_id, "event_id")
    return _check_limit(limit)


def _check_disable_after(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobsError(ErrorCode.X_INVARIANT, "disable_after must be a whole number, 1 or more")
    return value


# --------------------------------------------------------------------------- memory


@attrs.define
class _Endpoint:
    failures: int = 0
    disabled_at: float | None = None
    last_attempt_at: float | None = None


class MemoryWebhookLedger:
    """The ledger in this process's memory: the newest
    :data:`MEMORY_LEDGER_ATTEMPTS` attempts, and every endpoint's state. For
    development and tests (a second process sees none of it)."""

    kind = "memory"

    def __init__(self, *, keep: int = MEMORY_LEDGER_ATTEMPTS) -> None:
        self._attempts: deque[WebhookAttempt] = deque(maxlen=keep)
        self._endpoints: dict[str, _Endpoint] = {}

    def __repr__(self) -> str:
        return f"<memory_webhook_ledger endpoints={len(self._endpoints)}>"

    async def record(self, attempt: WebhookAttempt, *, disable_after: int) -> bool:
        limit = _check_disable_after(disable_after)
        state = self._endpoints.setdefault(attempt.endpoint_id, _Endpoint())
        self._attempts.append(attempt)
        effect = effect_of(attempt)
        if effect == "ok":
            state.failures = 0
        elif effect == "fail":
            state.failures += 1
            if state.disabled_at is None and state.failures >= limit:
                state.disabled_at = attempt.at
        last = state.last_attempt_at
        state.last_attempt_at = attempt.at if last is None else max(last, attempt.at)
        return state.disabled_at is not None

    async def is_disabled(self, endpoint_id: str) -> bool:
        state = self._endpoints.get(_check_id(endpoint_id, "endpoint_id"))
        return state is not None and state.disabled_at is not None

    async def enable(self, endpoint_id: str) -> None:
        state = self._endpoints.get(_check_id(endpoint_id, "endpoint_id"))
        if state is not None:
            state.failures = 0
            state.disabled_at = None

    async def attempts(
        self,
        endpoint_id: str | None = None,
        event_id: str | None = None,
        *,
        limit: int = MAX_WEBHOOK_ROWS,
    ) -> builtins.list[WebhookAttempt]:
        n = _check_filters(endpoint_id, event_id, limit)
        found = [
            a
            for a in self._attempts
            if (endpoint_id is None or a.endpoint_id == endpoint_id)
            and (event_id is None or a.event_id == event_id)
        ]
        found.sort(key=lambda a: a.at)  # stable: equal times keep their order of writing
        return found[-n:]

    async def endpoints(
        self, *, limit: int = MAX_WEBHOOK_ROWS
    ) -> builtins.list[WebhookEndpointState]:
        n = _check_limit(limit)
        return [
            WebhookEndpointState(
                key, s.failures, s.disabled_at is not None, s.disabled_at, s.last_attempt_at
            )
            for key, s in sorted(self._endpoints.items())[:n]
        ]


def memory_webhook_ledger() -> MemoryWebhookLedger:
    """A :class:`WebhookLedger` in this process's memory (development and tests:
    it keeps the newest 10,000 attempts, and another process sees none of it).

    >>> ledger = memory_webhook_ledger()
    >>> deliver = webhook(name="partner.webhooks", ..., ledger=ledger)
    """
    return MemoryWebhookLedger()


# --------------------------------------------------------------------------- postgres


class PostgresWebhookLedger:
    """The ledger in PostgreSQL (``trio_jobs_webhook_attempts`` and
    ``trio_jobs_webhook_endpoints``, migration 0012). Unbound, it uses the
    running job's driver, else the ambient facade's (``open_jobs``); bound
    (``postgres_webhook_ledger(driver)``), that driver."""

    kind = "postgres"

    def __init__(self, driver: JobDriver | None = None) -> None:
        self._driver = driver

    def __repr__(self) -> str:
        return "<postgres_webhook_ledger>"

    async def _pg(self) -> PostgresDriver:
        from . import _ambient
        from .drivers.postgres._driver import PostgresDriver

        driver: Any = self._driver
        if driver is None:
            run = _ambient.run_var.get()
            if run is not None:
                driver = run.driver
            else:
                from ._facade import current_jobs

                driver = await current_jobs()._resolved_driver()
        if not isinstance(driver, PostgresDriver):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                f"postgres_webhook_ledger() needs the PostgreSQL driver; this facade runs the "
                f"{getattr(driver, 'name', type(driver).__name__)} driver (use "
                "memory_webhook_ledger(), or open_jobs(driver=postgres_driver(...)))",
            )
        return driver

    async def record(self, attempt: WebhookAttempt, *, disable_after: int) -> bool:
        limit = _check_disable_after(disable_after)
        driver = await self._pg()
        rows = await driver._fetch(
            "webhook_record",
            {
                "endpoint_id": attempt.endpoint_id,
                "event_id": attempt.event_id,
                "attempt": int(attempt.attempt),
                "status": attempt.status,
                "code": attempt.code,
                "at": float(attempt.at),
                "duration_ms": float(attempt.duration_ms),
                "effect": effect_of(attempt),
                "disable_after": limit,
            },
        )
        return bool(rows and rows[0][0])

    async def is_disabled(self, endpoint_id: str) -> bool:
        driver = await self._pg()
        rows = await driver._fetch(
            "webhook_is_disabled", {"endpoint_id": _check_id(endpoint_id, "endpoint_id")}
        )
        return bool(rows and rows[0][0])

    async def enable(self, endpoint_id: str) -> None:
        driver = await self._pg()
        await driver._fetch(
            "webhook_enable", {"endpoint_id": _check_id(endpoint_id, "endpoint_id")}
        )

    async def attempts(
        self,
        endpoint_id: str | None = None,
        event_id: str | None = None,
        *,
        limit: int = MAX_WEBHOOK_ROWS,
    ) -> builtins.list[WebhookAttempt]:
        n = _check_filters(endpoint_id, event_id, limit)
        driver = await self._pg()
        rows = await driver._fetch(
            "webhook_attempts", {"endpoint_id": endpoint_id, "event_id": event_id, "limit": n}
        )
        return [
            WebhookAttempt(
                endpoint_id=r[0],
                event_id=r[1],
                attempt=int(r[2]),
                status=None if r[3] is None else int(r[3]),
                code=r[4],
                at=float(r[5]),
                duration_ms=float(r[6]),
            )
            for r in rows
        ]

    async def endpoints(
        self, *, limit: int = MAX_WEBHOOK_ROWS
    ) -> builtins.list[WebhookEndpointState]:
        n = _check_limit(limit)
        driver = await self._pg()
        rows = await driver._fetch("webhook_endpoints", {"limit": n})
        return [
            WebhookEndpointState(
                endpoint_id=r[0],
                consecutive_failures=int(r[1]),
                disabled=r[2] is not None,
                disabled_at=None if r[2] is None else float(r[2]),
                last_attempt_at=None if r[3] is None else float(r[3]),
            )
            for r in rows
        ]


def postgres_webhook_ledger(driver: JobDriver | None = None) -> PostgresWebhookLedger:
    """A :class:`WebhookLedger` in PostgreSQL, in the tables migration 0012
    creates. Without ``driver`` it uses the running job's driver (and, outside
    a job, the ambient facade's), which must be :func:`~trio_jobs.postgres_driver`;
    another one is ``X_CONFIG_INVALID`` at the first call.

    >>> deliver = webhook(name="partner.webhooks", ..., ledger=postgres_webhook_ledger())
    >>> await deliver.ledger.enable("e1")            # the app re-enables an endpoint
    """
    return PostgresWebhookLedger(driver)


# --------------------------------------------------------------------------- readers


async def read_webhooks(
    jobs: Jobs,
    *,
    endpoint_id: str | None = None,
    event_id: str | None = None,
    limit: int = 100,
) -> tuple[builtins.list[WebhookEndpointState], builtins.list[WebhookAttempt]]:
    """What the dashboard and ``trio-jobs webhooks`` show: every endpoint and
    the newest ``limit`` attempts (of one endpoint and/or event when given),
    newest first, from the ledgers of the facade's webhook jobs, and from the
    PostgreSQL ledger when the facade runs that driver.

    ``X_NOT_IMPLEMENTED`` when there is no ledger to read (no webhook job and
    another driver)."""
    from .drivers.postgres._driver import PostgresDriver

    n = _check_limit(limit)
    ledgers: builtins.list[Any] = []
    for handle in jobs.handles.values():
        ledger = getattr(handle, "ledger", None)
        if handle.kind == "webhook" and ledger is not None and ledger not in ledgers:
            ledgers.append(ledger)
    driver = await jobs._resolved_driver()
    if isinstance(driver, PostgresDriver):
        ledgers = [x for x in ledgers if not isinstance(x, PostgresWebhookLedger)]
        ledgers.append(PostgresWebhookLedger(driver))
    if not ledgers:
        raise JobsError(
            ErrorCode.X_NOT_IMPLEMENTED,
            f"no webhook ledger to read: the {driver.name} driver keeps none and no webhook() "
            "job of this facade names one (use postgres_driver(), or list the webhook jobs "
            "in open_jobs(jobs=[...]))",
        )
    endpoints: dict[str, WebhookEndpointState] = {}
    attempts: builtins.list[WebhookAttempt] = []
    for ledger in ledgers:
        for state in await ledger.endpoints():
            endpoints.setdefault(state.endpoint_id, state)
        attempts.extend(await ledger.attempts(endpoint_id, event_id, limit=n))
    attempts.sort(key=lambda a: a.at, reverse=True)
    return [endpoints[k] for k in sorted(endpoints)], attempts[:n]
