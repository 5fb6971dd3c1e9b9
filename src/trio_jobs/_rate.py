"""Rate limits: :func:`rate_limiter` over the driver's store, and a worker's
per-tenant starts (``Worker(rate_per_tenant=(limit, per))``).

A limiter counts acquisitions in a sliding window: at most ``limit`` in any
interval of length ``per``. ``scope="shared"`` keeps the window in the driver's
store (a PostgreSQL table, Redis keys, the memory driver's process), so every
worker of the fleet spends one budget; ``scope="process"`` keeps it in this
process. A refusal is ``JobsError("X_RATE_LIMITED", meta={"retry_after_seconds":
s})``; raised by a body, the worker defers the run to it with the attempt
uncounted (``_retry.deferral``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any, Literal

import attrs
import trio

from . import _ambient
from ._context import WRITE_BUDGET, InfraFault
from ._facade import current_jobs
from ._time import Duration, parse_duration
from ._validate import text_fault
from ._write_retry import is_transient, write_retrying
from .drivers._protocol import ClaimedJob, JobDriver, NackOptions, RateGrant, RateLimitStore
from .drivers._window import SlidingLog, short_wait
from .errors import ErrorCode, JobsError
from .logging import emit

__all__ = [
    "MAX_RATE_KEY",
    "MAX_RATE_LIMIT",
    "Fleet",
    "RateLimiter",
    "Scope",
    "TenantRate",
    "check_fleet",
    "deferred",
    "rate_limiter",
    "tenant_rate",
]

log = logging.getLogger("trio_jobs")

Scope = Literal["shared", "process"]
#: ``Worker(fleet=...)``: other processes may serve the same queues, or not.
Fleet = Literal["many", "single"]
#: The most acquisitions one window may hold: the window is a log with one
#: entry per acquisition (a larger budget is a shorter window: 100 per second,
#: not 360,000 per hour).
MAX_RATE_LIMIT = 100_000
#: The longest limiter name and acquisition key, in characters.
MAX_RATE_KEY = 200

#: How many times ``acquire`` asks again after a short refusal before it raises.
_SHORT_TRIES = 4

# A scope="process" limiter's windows, per driver (the harness's and each test's
# driver keep their own, on their own clocks).
_process_logs: weakref.WeakKeyDictionary[Any, SlidingLog] = weakref.WeakKeyDictionary()


@attrs.frozen
class RateLimiter:
    """A sliding-window budget: at most :attr:`limit` acquisitions in any
    interval of :attr:`per` seconds. Made by :func:`rate_limiter`; await
    :meth:`acquire` as a job body's first line, before its first step."""

    name: str
    limit: int
    per: float
    scope: Scope = "shared"

    async def acquire(self, key: str = "") -> None:
        """Take one acquisition of this budget (``key`` splits it: one window
        per key) or raise ``JobsError("X_RATE_LIMITED", meta={"retry_after_seconds":
        s})``, ``s`` being this acquisition's turn. A worker defers a body that
        raises it to then, with the attempt uncounted.

        The refused are spread: the first refusal of a full window is told when
        its oldest grant leaves, the next one when the next grant leaves, and so
        on over the windows to come (one place per slot per window), so deferred
        runs come back one per freed slot instead of all at once. A refusal whose
        slot frees within a slot's share of the window (at most 250 ms) is
        waited out here instead of raised.

        The store is the ambient facade's driver's. ``scope="shared"`` over a
        store in one process's memory (the memory driver) is
        ``X_RATE_LIMIT_NOT_SHARED`` unless the worker running the body is the
        whole fleet (``Worker(fleet="single")``; the harness and the simulation
        are)."""
        if not isinstance(key, str) or len(key) > MAX_RATE_KEY or text_fault(key) is not None:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                f"rate limiter {self.name!r}: acquire(key=...) takes a string of at most "
                f"{MAX_RATE_KEY} characters, without NUL",
            )
        facade = current_jobs()
        _ambient.check_not_aborted()
        driver = await facade._resolved_driver()
        # A refusal whose slot frees within the short wait (a run promised a
        # slot, back a few ms before the grant in it leaves) is waited out here,
        # a few times at most, rather than handed back to the queue.
        budget = short_wait(self.limit, self.per)
        grant = await self._take(driver, key)
        for _ in range(_SHORT_TRIES - 1):
            if grant.granted or grant.retry_after > budget:
                break
            budget -= grant.retry_after
            await trio.sleep(grant.retry_after)
            _ambient.check_not_aborted()
            grant = await self._take(driver, key)
        if not grant.granted:
            raise JobsError(
                ErrorCode.X_RATE_LIMITED,
                f"rate limit {self.name!r} is spent ({self.limit} per {self.per:g}s); this "
                f"acquisition's turn comes in {grant.retry_after:.3f}s — a job body raising "
                "this is deferred to then, its attempt uncounted",
                meta={"retry_after_seconds": grant.retry_after, "limiter": self.name},
            )

    async def _take(self, driver: JobDriver, key: str) -> RateGrant:
        if self.scope == "process":
            logs = _process_logs.get(driver)
            if logs is None:
                logs = _process_logs[driver] = SlidingLog()
            wait = logs.take((self.name, key), self.limit, self.per, driver.now())
            return RateGrant(True) if wait is None else RateGrant(False, wait)
        return await self._shared(driver, key)

    async def _shared(self, driver: JobDriver, key: str) -> RateGrant:
        store = driver.rate_limits
        if store is None:
            raise JobsError(
                ErrorCode.X_NOT_IMPLEMENTED,
                f"the {driver.name} driver keeps no rate limits; use the memory, PostgreSQL "
                "or Redis driver, or scope='process'",
            )
        if not store.shared and _ambient.fleet_var.get() != "single":
            raise JobsError(
                ErrorCode.X_RATE_LIMIT_NOT_SHARED,
                f"rate limiter {self.name!r} has scope='shared', but the {driver.name} driver "
                "keeps it in this process's memory: N workers would each spend the whole "
                "budget. Use the PostgreSQL or Redis driver, declare scope='process', or run "
                "the one worker of the fleet as Worker(..., fleet='single')",
            )
        run = _ambient.run_var.get()
        if run is None:
            return await store.acquire(self.name, key, self.limit, self.per)
        return await _in_run(run, store, self.name, key, self.limit, self.per)


async def _in_run(
    run: Any, store: RateLimitStore, name: str, key: str, limit: int, per: float
) -> RateGrant:
    """An acquisition inside a job body: a transient driver failure is retried
    within the write budget (a retry whose lost first try landed spends one
    more: the budget is under-used, never over-spent); still failing, the run
    is handed back uncounted, like any of the library's own statements."""
    claimed = run.claimed

    def gone() -> bool:
        return bool(run.driver.closed or run.lost)

    try:
        return await write_retrying(
            lambda: store.acquire(name, key, limit, per),
            deadline=trio.current_time() + WRITE_BUDGET,
            gone=gone,
            about=lambda: (
                f"{claimed.id}:{claimed.fence.claim}:rate:{name}",
                "jobs.step.retry",
                {
                    "job_id": claimed.id,
                    "job": claimed.name,
                    "attempt": claimed.attempt,
                    "worker_id": claimed.fence.worker_id,
                },
            ),
        )
    except JobsError as exc:
        if not is_transient(exc) or gone():
            raise
        raise InfraFault(exc) from None


def rate_limiter(name: str, *, limit: int, per: Duration, scope: Scope = "shared") -> RateLimiter:
    """Declare a budget of at most ``limit`` acquisitions in any interval of
    length ``per`` (a sliding window), kept in the driver's store.

    ``scope="shared"`` (the default) is one budget for the whole fleet (a
    table on PostgreSQL, keys on Redis, the process on the memory driver);
    ``scope="process"`` is one per process. A ``limit`` that is not a whole
    number from 1 to 100,000, a ``per`` that is not a positive duration, an
    empty name or an unknown scope is ``X_CONFIG_INVALID`` naming every fault.

    >>> vendor = rate_limiter("mail-vendor", limit=600, per="1m")
    >>> async def send(ctx):
    ...     await vendor.acquire()          # FIRST, before the first step
    """
    faults: list[str] = []
    if not isinstance(name, str) or not name or len(name) > MAX_RATE_KEY:
        faults.append(f"name must be a non-empty string of at most {MAX_RATE_KEY} characters")
    elif (fault := text_fault(name)) is not None:
        faults.append(f"name cannot be stored: {fault}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RATE_LIMIT:
        faults.append(
            f"limit must be a whole number from 1 to {MAX_RATE_LIMIT:,} (for a larger budget, "
            "use a shorter window)"
        )
    seconds = 0.0
    try:
        seconds = parse_duration(per, field="per")
    except JobsError as exc:
        faults.append(exc.message)
    if scope not in ("shared", "process"):
        faults.append("scope must be 'shared' (one budget for the fleet) or 'process'")
    if faults:
        shown = repr(name) if isinstance(name, str) and len(name) <= MAX_RATE_KEY else "(name)"
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"rate_limiter {shown} is invalid: " + "; ".join(faults),
            meta={"faults": faults},
        )
    return RateLimiter(name, limit, seconds, scope)


# --------------------------------------------------------------------------- the worker's side


def check_fleet(fleet: object) -> Fleet:
    """``Worker(fleet=...)``: ``"many"`` (the default: other processes may serve
    the same queues) or ``"single"`` (this worker is the whole fleet)."""
    if fleet not in ("many", "single"):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "fleet must be 'many' (the default) or 'single' (this worker is the whole fleet)",
        )
    return "single" if fleet == "single" else "many"


class TenantRate:
    """A worker's per-tenant starts: at most ``limit`` bodies of one tenant
    started by this process in any ``per`` seconds. A run of a tenant over it is
    handed back before its body starts, uncounted, due when the tenant has room;
    a run without a tenant is not limited."""

    def __init__(self, limit: int, per: float) -> None:
        self.limit = limit
        self.per = per
        self._log = SlidingLog()

    def refuse(self, claimed: ClaimedJob, now: float) -> NackOptions | None:
        """Spend one start of the run's tenant and answer ``None``, or answer the
        uncounted hand-back of a run whose tenant is over its starts."""
        tenant = claimed.tenant_id
        if tenant is None:
            return None
        wait = self._log.take(tenant, self.limit, self.per, now)
        if wait is None:
            return None
        message = (
            f"{ErrorCode.X_RATE_LIMITED}: the tenant is over this worker's rate_per_tenant "
            f"({self.limit} starts per {self.per:g}s); deferred {wait:.3f}s with the attempt "
            "uncounted, before the body started"
        )
        return NackOptions(
            fence=claimed.fence,
            state="ready",
            counted=False,
            delay=wait,
            error_code=ErrorCode.X_RATE_LIMITED,
            last_error=message,
        )


def tenant_rate(value: object) -> TenantRate | None:
    """``Worker(rate_per_tenant=(limit, per))``: ``None``, or a pair of a whole
    number of starts (1 or more) and a positive duration; ``X_CONFIG_INVALID``
    naming every fault otherwise."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 2:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            'rate_per_tenant must be a pair (limit, per), e.g. (10, "1m"): at most limit '
            "starts per tenant in any window of per",
        )
    limit, per = value
    faults: list[str] = []
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RATE_LIMIT:
        faults.append(
            f"rate_per_tenant's limit must be a whole number from 1 to {MAX_RATE_LIMIT:,}"
        )
    seconds = 0.0
    try:
        seconds = parse_duration(per, field="rate_per_tenant's per")
    except JobsError as exc:
        faults.append(exc.message)
    if faults:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "rate_per_tenant is invalid: " + "; ".join(faults),
            meta={"faults": faults},
        )
    return TenantRate(limit, seconds)


def deferred(claimed: ClaimedJob, nack: NackOptions, worker_id: str) -> None:
    """Log a run handed back by a rate limit (``jobs.attempt.deferred``)."""
    emit(
        log,
        logging.INFO,
        "jobs.attempt.deferred",
        job_id=claimed.id,
        job=claimed.name,
        attempt=claimed.attempt,
        code=nack.error_code,
        retry_in=round(nack.delay or 0.0, 3),
        queue=claimed.queue,
        worker_id=worker_id,
    )
