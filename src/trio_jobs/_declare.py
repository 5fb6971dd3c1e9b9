"""``job()`` and the handle it returns.

A declaration is checked whole when it is written: every fault is collected and
reported in one ``X_JOB_DECLARATION_INVALID``. The handle lifts every field,
already resolved (durations as float seconds, ``retry`` with defaults merged).
"""

from __future__ import annotations

import inspect
import math
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast, overload

import attrs
import cattrs

from ._enqueue import _MISSING, Actor, Enqueued, enqueue_inputs, enqueue_one
from ._serialization import converter, json_schema, payload_form, too_deep
from ._time import Duration, parse_duration
from ._validate import UNSTORABLE, check_text, text_fault
from .drivers._protocol import UNWIND_MARGIN
from .errors import ErrorCode, JobDeclarationError, JobsError, error

if TYPE_CHECKING:
    from ._context import JobContext
    from ._settled import Settled

__all__ = [
    "Concurrency",
    "Enqueued",
    "Job",
    "Retry",
    "job",
    "MAX_CONCURRENCY_KEY",
    "MAX_IDEMPOTENCY_KEY",
]

I = TypeVar("I")
R = TypeVar("R")

MAX_CONCURRENCY_KEY = 200
MAX_IDEMPOTENCY_KEY = 1_000
_unstorable = UNSTORABLE.search
_QUEUE_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")

Backoff = Literal["exponential", "linear", "fixed"]
WhenBusy = Literal["wait", "fail"]

#: Inputs whose payload is the value itself (the strict hooks of _serialization).
_SCALARS = (int, float, str, bool)


@attrs.frozen(kw_only=True)
class Retry:
    """A job's retry policy. Keyword-only; these are the defaults.

    ``attempts`` counts runs, the first included (``attempts=1``: never retried).
    ``base`` and ``max_delay`` take durations (``"1s"``, ``timedelta``, seconds)
    and are lifted as float seconds. ``jitter`` is *equal* jitter: half the
    delay fixed, half drawn. ``dead_letter=False`` buries a job that fails for
    good as ``failed`` (outcome ``dropped``) instead of ``dead``.
    """

    attempts: int = 3
    backoff: Backoff = "exponential"
    base: Any = 1.0
    max_delay: Any = 3600.0
    jitter: bool = True
    dead_letter: bool = True


@attrs.frozen
class Concurrency:
    """A fleet-wide cap on simultaneous runs of one job, or of one key of it.

    ``Concurrency(limit, key=fn, when_busy="wait")``: ``limit`` (positional or
    keyword) is a whole number, 1 or more. ``key(input)`` (optional, keyword-only)
    makes the cap per key; ``when_busy`` (keyword-only: ``"wait"``, the default, or
    ``"fail"``) is what a claim over a keyed cap does.
    """

    limit: int
    key: Callable[[Any], str] | None = attrs.field(default=None, kw_only=True)
    when_busy: WhenBusy = attrs.field(default="wait", kw_only=True)


_faults_t = list[str]


def _check_retry(retry: object, faults: _faults_t) -> Retry:
    if retry is None:
        return Retry()
    if not isinstance(retry, Retry):
        faults.append("retry must be a trio_jobs.Retry(...)")
        return Retry()
    attempts = retry.attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        faults.append("retry.attempts must be a whole number, 1 or more")
        attempts = 3
    if retry.backoff not in ("exponential", "linear", "fixed"):
        faults.append("retry.backoff must be 'exponential', 'linear' or 'fixed'")
    # None is not a duration here: it would silently read as the default (a
    # max_delay=None under base="2h" would cap every wait below the base).
    base = _duration(_none_refused(retry.base), "retry.base", faults, default=1.0)
    max_delay = _duration(_none_refused(retry.max_delay), "retry.max_delay", faults, default=3600.0)
    if base is not None and max_delay is not None and max_delay < base:
        faults.append("retry.max_delay must be at least retry.base")
    if not isinstance(retry.jitter, bool):
        faults.append("retry.jitter must be True or False")
    if not isinstance(retry.dead_letter, bool):
        faults.append("retry.dead_letter must be True or False")
    return Retry(
        attempts=attempts,
        backoff=retry.backoff
        if retry.backoff in ("exponential", "linear", "fixed")
        else "exponential",
        base=base if base is not None else 1.0,
        max_delay=max_delay if max_delay is not None else 3600.0,
        jitter=bool(retry.jitter),
        dead_letter=bool(retry.dead_letter),
    )


def _none_refused(value: object) -> object:
    return _MISSING if value is None else value


def _duration(
    value: object, field: str, faults: _faults_t, *, default: float | None
) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value, field=field)
    except JobsError:
        faults.append(
            f"{field} must be a positive duration of at most 100 years "
            '("30s", "250ms", a timedelta or seconds)'
        )
        return default


def _is_whole(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value) and value.is_integer() and False


def _check_concurrency(
    value: object, faults: _faults_t
) -> tuple[int | None, Callable[[Any], str] | None, WhenBusy | None]:
    if value is None:
        return None, None, None
    if isinstance(value, Concurrency):
        limit, key, when_busy = value.limit, value.key, value.when_busy
    elif isinstance(value, int) and not isinstance(value, bool):
        limit, key, when_busy = value, None, "wait"
    else:
        faults.append(
            "concurrency must be a whole number (1 or more) or Concurrency(limit, key=..., when_busy=...)"
        )
        return None, None, None
    if not _is_whole(limit) or limit < 1:
        faults.append(
            "concurrency limit must be a whole number, 1 or more (0, negative, fractional, NaN and infinity are refused)"
        )
        limit = 1
    if key is not None and not callable(key):
        faults.append("concurrency.key must be a function of the input answering a string")
        key = None
    if when_busy not in ("wait", "fail"):
        faults.append("concurrency.when_busy must be 'wait' or 'fail'")
        when_busy = "wait"
    if key is None and when_busy == "fail":
        faults.append("concurrency.when_busy='fail' needs a key=; a plain cap always waits")
    return limit, key, (when_busy if key is not None else None)


_SUPPORTED_SCALARS = (str, int, float, bool, uuid.UUID, datetime, dict, list)


def _check_input(tp: object, faults: _faults_t) -> object:
    if tp is None:
        return None
    if isinstance(tp, type) and (attrs.has(tp) or issubclass(tp, _SUPPORTED_SCALARS)):
        return tp
    if not isinstance(tp, type) and getattr(tp, "__origin__", None) is not None:
        return tp
    faults.append("input must be an attrs class (or a type cattrs can structure, or None)")
    return None


class Job(Generic[I, R]):
    """The handle ``job()`` returns. Every declared field is lifted, resolved.

    App code enqueues through it; only the worker calls :attr:`run`.
    """

    #: Which factory made the handle: ``"job"`` for :func:`job`, ``"backfill"``
    #: for :func:`~trio_jobs.backfill`, ... (each factory sets its own).
    kind: str = "job"
    #: Handles registered wherever this one is listed (``open_jobs(jobs=...)``, a
    #: worker): a consumer's supervisor task and arm job. Empty for a plain job.
    companions: tuple[Job[Any, Any], ...] = ()

    def __init__(
        self,
        fn: Callable[..., Awaitable[R] | R],
        *,
        name: str,
        input: Any,
        tenant: Callable[[I], Any] | Literal["none"],
        idempotency_key: Callable[[I], str],
        queue: str,
        retry: Retry,
        concurrency: int | None,
        concurrency_key_fn: Callable[[I], str] | None,
        when_busy: WhenBusy | None,
        timeout: float | None,
        step_timeout: float | None,
        event_poll: float | None,
        compensates: bool,
        on_settled: Callable[[Settled], Any] | None,
        on_settled_timeout: float,
        sensitive: bool,
        debounce: float | None = None,
        unique_for: float | None = None,
    ) -> None:
        self.run = fn
        self.name = name
        self.input = input
        self.tenant = tenant
        self._idempotency_key = idempotency_key
        self.queue = queue
        self.retry = retry
        self.concurrency = concurrency
        self._concurrency_key = concurrency_key_fn
        self.when_busy = when_busy
        self.timeout = timeout
        self.step_timeout = step_timeout
        self.event_poll = event_poll
        self.compensates = compensates
        self.on_settled = on_settled
        self.on_settled_timeout = on_settled_timeout
        self.sensitive = sensitive
        #: Seconds: enqueues of one key inside the window collapse into one run
        #: that starts this long after the last of them (``None``: no debounce).
        self.debounce = debounce
        #: Seconds a key stays taken after its run settled (``None``: only a
        #: live key dedupes).
        self.unique_for = unique_for
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__qualname__ = getattr(fn, "__qualname__", name)
        self.__module__ = getattr(fn, "__module__", __name__)
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<job {self.name!r} queue={self.queue!r}>"

    # ------------------------------------------------------------------ derived

    @property
    def max_attempts(self) -> int:
        """The bound the row carries: ``retry.attempts``, plus the unwind margin
        for a compensating job."""
        return self.retry.attempts + (UNWIND_MARGIN if self.compensates else 0)

    @property
    def lease_key_base(self) -> str:
        return self.name

    def parse(self, raw: Any) -> I:
        """Check a raw queue payload against the declared input and structure it.

        Refuses a wrong type, a missing field or an unknown one with
        ``X_JOB_INPUT_INVALID`` naming the fields, never their values."""
        tp = self.input
        if tp is None:
            if raw is not None:
                raise JobsError(
                    ErrorCode.X_JOB_INPUT_INVALID, f"{self.name} takes no input; pass None"
                )
            return None  # type: ignore[return-value]
        if type(raw) is tp and tp in _SCALARS:
            return cast("I", raw)  # what the strict scalar hook answers, without cattrs
        if isinstance(tp, type) and attrs.has(tp) and isinstance(raw, tp):
            return cast("I", raw)
        try:
            if isinstance(tp, type) and attrs.has(tp) and not isinstance(raw, Mapping):
                raise TypeError("not a mapping")
            return converter.structure(raw, tp)  # type: ignore[no-any-return]
        except RecursionError:
            raise JobsError(
                ErrorCode.X_JOB_INPUT_INVALID,
                too_deep(f"the payload for {self.name}"),
                meta={"job": self.name},
            ) from None
        except (cattrs.BaseValidationError, TypeError, ValueError, KeyError, AttributeError) as exc:
            fields = _fault_paths(exc)
            where = f" (check {', '.join(fields)})" if fields else ""
            raise JobsError(
                ErrorCode.X_JOB_INPUT_INVALID,
                f"the payload does not match {self.name}'s declared input{where}",
                meta={"job": self.name, "fields": fields},
            ) from None

    def _payload(self, value: I) -> Any:
        try:
            plain = converter.unstructure(value)
        except RecursionError:
            raise JobsError(
                ErrorCode.X_JOB_INPUT_INVALID, too_deep(f"{self.name}'s input")
            ) from None
        return payload_form(
            plain,
            what=f"{self.name}'s input",
            code=ErrorCode.X_JOB_INPUT_INVALID,
        )

    def idempotency_key_for(self, input: I) -> str:
        """The dedupe key: what the declared ``idempotency_key`` returned."""
        key = self._idempotency_key(input)
        # The common case in one test (an enqueue_many stages 1,000 of them);
        # anything else takes the checks below, which name the fault.
        if type(key) is str and 0 < len(key) <= MAX_IDEMPOTENCY_KEY and not _unstorable(key):
            return key
        return self._checked_key(key)

    def _checked_key(self, key: object) -> str:
        if not isinstance(key, str):
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"{self.name}: idempotency_key must answer a string, got {type(key).__name__}",
            )
        if key == "":
            raise JobsError(
                ErrorCode.X_INVARIANT,
                f"{self.name}: idempotency_key answered an empty string; an empty key makes every "
                "enqueue a duplicate of every other — derive it from the input",
            )
        if len(key) > MAX_IDEMPOTENCY_KEY:
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"{self.name}: idempotency_key answered {len(key)} characters, over "
                f"{MAX_IDEMPOTENCY_KEY}; hash the long part",
            )
        check_text(
            key,
            what=f"{self.name}: the key idempotency_key answered",
            code=ErrorCode.X_JOB_DECLARATION_INVALID,
            fix="derive it from text without one (or hash the part that holds it)",
        )
        return key

    def concurrency_key_for(self, input: I) -> str | None:
        """``concurrency.key(input)`` for a keyed cap, ``None`` otherwise."""
        if self._concurrency_key is None:
            return None
        key = self._concurrency_key(input)
        if not isinstance(key, str) or key == "" or len(key) > MAX_CONCURRENCY_KEY:
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"{self.name}: concurrency.key must answer a non-empty string of at most "
                f"{MAX_CONCURRENCY_KEY} characters",
            )
        check_text(
            key,
            what=f"{self.name}: the key concurrency.key answered",
            code=ErrorCode.X_JOB_DECLARATION_INVALID,
            fix="derive it from text without one (or hash the part that holds it)",
        )
        return key

    def lease_key(self, concurrency_key: str | None) -> str:
        return self.name if concurrency_key is None else f"{self.name}\x1f{concurrency_key}"

    def tenant_of(self, input: I) -> str | None:
        """The tenant the declaration names for ``input`` (``None`` for ``tenant="none"``)."""
        if self.tenant == "none":
            return None
        value = self.tenant(input)  # type: ignore[operator,unused-ignore]
        if value is None:
            return None
        if isinstance(value, uuid.UUID):
            return str(value)
        if not isinstance(value, str) or value == "":
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"{self.name}: tenant must answer a non-empty string (or a UUID), got {type(value).__name__}",
            )
        check_text(
            value,
            what=f"{self.name}: the tenant that tenant(input) answered",
            code=ErrorCode.X_JOB_DECLARATION_INVALID,
            fix="answer the org's id as stored in your tables",
        )
        return value

    def describe(self) -> dict[str, Any]:
        """The manifest row. Never a key: keys are computed from an input."""
        return {
            "name": self.name,
            "kind": self.kind,
            "input": json_schema(self.input) if self.input is not None else {"type": "null"},
            "queue": self.queue,
            "retry": {
                "attempts": self.retry.attempts,
                "backoff": self.retry.backoff,
                "base": self.retry.base,
                "max_delay": self.retry.max_delay,
                "jitter": self.retry.jitter,
                "dead_letter": self.retry.dead_letter,
            },
            "steps": [],
            "idempotent": True,
            "concurrency": None
            if self.concurrency is None
            else {
                "limit": self.concurrency,
                "keyed": self._concurrency_key is not None,
                "when_busy": self.when_busy,
            },
            "timeout": self.timeout,
            "step_timeout": self.step_timeout,
            "event_poll": self.event_poll,
            "compensates": self.compensates,
            "debounce": self.debounce,
            "unique_for": self.unique_for,
        }

    # ------------------------------------------------------------------ enqueue

    async def enqueue(
        self,
        input: I,
        *,
        run_id: str | uuid.UUID | None = None,
        delay: Duration | None = None,
        run_at: datetime | float | None = None,
        tenant_id: str | None = None,
        priority: int = 0,
    ) -> Enqueued:
        """Queue one run. Joins the ambient transaction when one is open.

        A live job with the same idempotency key (for this job name and tenant)
        answers ``deduped=True`` and its own ids; the first payload wins.
        """
        return await enqueue_one(
            self,
            input,
            run_id=run_id,
            delay=delay,
            run_at=run_at,
            tenant_id=tenant_id,
            priority=priority,
            actor=_MISSING,
        )

    async def enqueue_many(
        self,
        inputs: Iterable[I],
        *,
        delay: Duration | None = None,
        run_at: datetime | float | None = None,
        tenant_id: str | None = None,
        priority: int = 0,
    ) -> list[Enqueued]:
        """Queue many runs of this job: one round trip per 1,000 inputs, every refusal
        before the first write, at most ``MAX_ENQUEUE_BATCH`` (10,000) inputs.

        Inside ``jobs.transaction()`` it commits or vanishes whole; outside one it is
        atomic per 1,000."""
        items = list(inputs)
        return await enqueue_inputs(
            self,
            items,
            run_ids=[None] * len(items),
            delay=delay,
            run_at=run_at,
            tenant_id=tenant_id,
            priority=priority,
            actor=_MISSING,
        )

    async def enqueue_as(
        self,
        actor: Actor | None,
        input: I,
        *,
        run_id: str | uuid.UUID | None = None,
        delay: Duration | None = None,
        run_at: datetime | float | None = None,
        priority: int = 0,
    ) -> Enqueued:
        """Queue a run on ``actor``'s behalf: the row's tenant is the actor's org.

        ``None``, or an actor with no org, leaves the tenant unset. It queues; it
        never runs inline."""
        return await enqueue_one(
            self,
            input,
            run_id=run_id,
            delay=delay,
            run_at=run_at,
            tenant_id=None,
            priority=priority,
            actor=actor,
        )


def _fault_paths(exc: BaseException) -> list[str]:
    paths: list[str] = []
    if isinstance(exc, cattrs.BaseValidationError):
        try:
            from cattrs import transform_error

            for line in transform_error(exc):
                # "invalid value for type, expected int @ $.org_id" -> "$.org_id"
                paths.append(line.rsplit("@", 1)[-1].strip())
        except Exception:
            return []
    return paths


# ---------------------------------------------------------------------- job()

if TYPE_CHECKING:
    from ._context import JobContext as _Ctx

    _Body = Callable[[_Ctx[I]], Awaitable[R]]


@overload
def job(
    *,
    idempotency_key: Callable[[I], str],
    input: type[I],
    tenant: Callable[[I], Any] | Literal["none"] = "none",
    name: str | None = None,
    queue: str = "default",
    retry: Retry | None = None,
    concurrency: int | Concurrency | None = None,
    timeout: Duration | None = None,
    step_timeout: Duration | None = None,
    event_poll: Duration | None = None,
    compensates: bool = False,
    on_settled: Callable[[Settled], Any] | None = None,
    on_settled_timeout: Duration = 30.0,
    sensitive: bool = False,
    debounce: Duration | None = None,
    unique_for: Duration | None = None,
) -> Callable[[Callable[[JobContext[I]], Awaitable[R]]], Job[I, R]]: ...


@overload
def job(
    *,
    idempotency_key: Callable[[None], str],
    input: None = None,
    tenant: Callable[[None], Any] | Literal["none"] = "none",
    name: str | None = None,
    queue: str = "default",
    retry: Retry | None = None,
    concurrency: int | Concurrency | None = None,
    timeout: Duration | None = None,
    step_timeout: Duration | None = None,
    event_poll: Duration | None = None,
    compensates: bool = False,
    on_settled: Callable[[Settled], Any] | None = None,
    on_settled_timeout: Duration = 30.0,
    sensitive: bool = False,
    debounce: Duration | None = None,
    unique_for: Duration | None = None,
) -> Callable[[Callable[[JobContext[None]], Awaitable[R]]], Job[None, R]]: ...


def job(
    *,
    idempotency_key: Any = _MISSING,
    input: Any = None,
    tenant: Any = "none",
    name: str | None = None,
    queue: str = "default",
    retry: Retry | None = None,
    concurrency: int | Concurrency | None = None,
    timeout: Duration | None = None,
    step_timeout: Duration | None = None,
    event_poll: Duration | None = None,
    compensates: bool = False,
    on_settled: Callable[[Settled], Any] | None = None,
    on_settled_timeout: Duration = 30.0,
    sensitive: bool = False,
    debounce: Duration | None = None,
    unique_for: Duration | None = None,
    **unknown: Any,
) -> Callable[[Callable[..., Any]], Job[Any, Any]]:
    """Declare a job. Decorate an ``async def body(ctx: JobContext[I])``.

    ``idempotency_key`` is required: a function of the input answering the dedupe
    key. Leaving it out is flagged by the type checker and raises
    ``JobsError("X_IDEMPOTENCY_REQUIRED")`` here, at import time.

    >>> @job(input=Onboard, idempotency_key=lambda i: f"onboard:{i.org_id}")
    ... async def onboard(ctx): ...
    """
    if idempotency_key is _MISSING or idempotency_key is None:
        raise JobDeclarationError(
            ErrorCode.X_IDEMPOTENCY_REQUIRED,
            'job() needs idempotency_key=: add idempotency_key=lambda input: f"<job>:{input.<id>}", '
            "derived from the input only (no time, no randomness)",
        )
    faults: list[str] = []
    if unknown:
        faults.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    if not callable(idempotency_key):
        faults.append("idempotency_key must be a function of the input answering a string")
    checked_input = _check_input(input, faults)
    if not (tenant == "none" or callable(tenant)):
        faults.append("tenant must be a function of the input or the string 'none'")
    if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > 200):
        faults.append("name must be a non-empty string of at most 200 characters")
    elif name is not None and (fault := text_fault(name)) is not None:
        faults.append(f"name cannot be stored: {fault}")
    if not isinstance(queue, str) or not _QUEUE_RE.fullmatch(queue):
        faults.append("queue must be 1-128 characters of letters, digits, '_', '.', ':' or '-'")
    resolved_retry = _check_retry(retry, faults)
    limit, key_fn, when_busy = _check_concurrency(concurrency, faults)
    timeout_s = _duration(timeout, "timeout", faults, default=None)
    step_timeout_s = _duration(step_timeout, "step_timeout", faults, default=None)
    event_poll_s = _duration(event_poll, "event_poll", faults, default=None)
    settled_timeout_s = _duration(on_settled_timeout, "on_settled_timeout", faults, default=30.0)
    if not isinstance(compensates, bool):
        faults.append("compensates must be True or False")
    if on_settled is not None and not callable(on_settled):
        faults.append("on_settled must be a function taking a Settled")
    if not isinstance(sensitive, bool):
        faults.append("sensitive must be True or False")
    debounce_s = _duration(debounce, "debounce", faults, default=None)
    unique_for_s = _duration(unique_for, "unique_for", faults, default=None)
    if debounce is not None and when_busy == "fail":
        faults.append(
            "debounce cannot go with concurrency when_busy='fail' (a collapsed run "
            "would be refused for a busy key it never saw); use when_busy='wait'"
        )

    def decorate(fn: Callable[..., Any]) -> Job[Any, Any]:
        body_faults = list(faults)
        if not callable(fn):
            body_faults.append("job() decorates a function: async def body(ctx)")
        else:
            try:
                params = [
                    p
                    for p in inspect.signature(fn).parameters.values()
                    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                    and p.default is p.empty
                ]
                if len(params) != 1:
                    body_faults.append("the job body takes exactly one argument, the JobContext")
            except (TypeError, ValueError):
                pass
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", None)
        if name is None and callable(fn) and not (isinstance(module, str) and qualname):
            body_faults.append(
                "name= is required for a body with no __module__/__qualname__ "
                "(a functools.partial or a callable object)"
            )
        if body_faults:
            raise JobDeclarationError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                "job declaration is invalid: " + "; ".join(body_faults),
                meta={"faults": body_faults},
            )
        job_name = name if name is not None else f"{module}.{qualname}"
        return Job(
            fn,
            name=job_name,
            input=checked_input,
            tenant=tenant,
            idempotency_key=idempotency_key,
            queue=queue,
            retry=resolved_retry,
            concurrency=limit,
            concurrency_key_fn=key_fn,
            when_busy=when_busy,
            timeout=timeout_s,
            step_timeout=step_timeout_s,
            event_poll=event_poll_s,
            compensates=compensates,
            on_settled=on_settled,
            on_settled_timeout=settled_timeout_s if settled_timeout_s is not None else 30.0,
            sensitive=sensitive,
            debounce=debounce_s,
            unique_for=unique_for_s,
        )

    if faults:
        # Refuse at the decorator call too, so a bad declaration fails at import
        # time even before the body is attached.
        raise JobDeclarationError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            "job declaration is invalid: " + "; ".join(faults),
            meta={"faults": faults},
        )
    return decorate


def check_job_list(jobs: Sequence[Job[Any, Any]]) -> dict[str, Job[Any, Any]]:
    """Index handles by name; two different handles with one name are refused."""
    by_name: dict[str, Job[Any, Any]] = {}
    faults: list[str] = []
    for handle in with_companions(jobs):
        if not isinstance(handle, Job):
            faults.append(f"jobs= takes job handles; got a {type(handle).__name__}")
            continue
        seen = by_name.get(handle.name)
        if seen is not None and seen is not handle:
            faults.append(f"two different jobs are named {handle.name!r}; give one a name=")
            continue
        by_name[handle.name] = handle
    if faults:
        raise JobDeclarationError(
            ErrorCode.X_JOB_DECLARATION_INVALID, "; ".join(faults), meta={"faults": faults}
        )
    return by_name


# ---------------------------------------------------------------------- factories
# The checks the factories over job() (backfill(), consumer()) share.


def takes(fn: Callable[..., Any], n: int) -> bool:
    """Whether ``fn`` can be called with ``n`` positional arguments (``True``
    when its signature cannot be read: the call will tell)."""
    try:
        inspect.signature(fn).bind(*([None] * n))
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def check_function(value: object, field: str, n: int, shape: str, faults: _faults_t) -> None:
    """A factory's required function argument: given, callable, taking ``n``
    positional arguments; ``shape`` shows how it is called."""
    if value is _MISSING or value is None:
        faults.append(f"{field}= is required: {shape}")
    elif not callable(value):
        faults.append(f"{field} must be a function: {shape}")
    elif not takes(value, n):
        count = ("no arguments", "one argument", "two arguments", "three arguments")[n]
        faults.append(f"{field} must take {count}: {shape}")


def check_factory_name(name: object, limit: int, why: str, faults: _faults_t) -> bool:
    """A factory's required ``name=`` (``why``: what it names); whether it is good."""
    if name is _MISSING or name is None:
        faults.append(f"name= is required: {why}")
    elif not isinstance(name, str) or not name.strip() or len(name) > limit:
        faults.append(f"name must be a non-empty string of at most {limit} characters")
    elif (fault := text_fault(name)) is not None:
        faults.append(f"name cannot be stored: {fault}")
    else:
        return True
    return False


def refuse_declaration(code: ErrorCode, what: str, faults: _faults_t) -> JobsError:
    """The one refusal naming every fault of a declaration (``what``: ``"task"``, ...)."""
    return error(code, f"{what} declaration is invalid: " + "; ".join(faults), faults=faults)


def with_companions(jobs: Sequence[Any]) -> list[Any]:
    """``jobs`` with each handle's companions after it (a consumer's supervisor
    task and arm job), in order."""
    out: list[Any] = []
    for handle in jobs:
        out.append(handle)
        if isinstance(handle, Job):
            out.extend(handle.companions)
    return out


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
