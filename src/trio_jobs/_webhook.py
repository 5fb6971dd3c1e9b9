"""``webhook()``: a job that delivers one event to one endpoint.

A webhook is a :class:`~trio_jobs.Job` (``kind == "webhook"``) whose input is a
:class:`WebhookDelivery` and whose idempotency key is built in:
``webhook:<endpoint_id>:<event_id>``. Each attempt is one POST:

1. the tenancy rule (an org-owned delivery names its org; see below);
2. ``endpoint(delivery)`` and ``event(delivery)`` are read, **per attempt and
   never checkpointed** (the endpoint carries its secret; a step's output is
   stored), and checked;
3. the endpoint's ``enabled`` flag and the ledger's disabled mark are asked
   before any socket;
4. the URL passes the SSRF guard (``_webhook_guard.py``) unless
   ``allow_private=True``, and the POST goes out signed
   (``_webhook_signature.py``), redirects not followed;
5. the answer is classified: 2xx done; 429/503 with a usable ``Retry-After``
   ``X_WEBHOOK_DELIVERY_THROTTLED`` (its ``meta["retry_after_seconds"]``
   replaces the backoff); another 3xx/4xx ``X_WEBHOOK_DELIVERY_REJECTED``; a
   5xx, a timeout or a connection error ``X_WEBHOOK_DELIVERY_FAILED``;
6. the attempt is written to the ledger **before** the verdict is raised (a
   failure the ledger cannot see would never count toward ``disable_after``).

``timeout`` bounds the whole attempt (the reads and the request inside it);
the request has no second timeout of its own. The ledger write after it has
the library's write budget, so the job's own ``timeout`` (what ``describe()``
shows and the worker enforces) is ``timeout`` plus that budget.
"""

from __future__ import annotations

import email.utils
import importlib.util
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._backfill import MAX_NAME
from ._context import WRITE_BUDGET, _call
from ._declare import Job, Retry, check_factory_name, job
from ._enqueue import _MISSING
from ._serialization import dumps, payload_form
from ._time import Duration, outside_call, parse_duration
from ._validate import text_fault
from ._webhook_guard import EndpointRefused, check_url, post
from ._webhook_ledger import WebhookAttempt, WebhookLedger
from ._webhook_signature import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TOPIC_HEADER,
    label_fault,
    signature_header,
)
from .errors import ErrorCode, JobDeclarationError, JobsError

if TYPE_CHECKING:
    from ._context import JobContext
    from ._settled import Settled

__all__ = [
    "DEFAULT_WEBHOOK_DISABLE_AFTER",
    "Endpoint",
    "WebhookDelivery",
    "WebhookEvent",
    "delivery_key",
    "webhook",
]

#: ``disable_after``'s default: consecutive failed attempts before the ledger
#: disables an endpoint.
DEFAULT_WEBHOOK_DISABLE_AFTER = 10
#: ``timeout``'s default.
DEFAULT_WEBHOOK_TIMEOUT = 10.0
#: The longest id a delivery names (an endpoint's or an event's).
MAX_ID = 200
#: The most bytes of an answer read (the rest is dropped with its connection).
MAX_ANSWER_BYTES = 64 * 1024
#: The most bytes of a body sent.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: The longest ``Retry-After`` honoured as such (a longer one is clamped by the
#: job's ``retry.max_delay`` anyway).
MAX_RETRY_AFTER = 86_400.0
#: The headers every delivery carries, as the transport takes them.
_STATIC_HEADERS = ((b"content-type", b"application/json"), (b"user-agent", b"trio-jobs-webhook"))
_ID_HEADER = ID_HEADER.encode("ascii")
_TOPIC_HEADER = TOPIC_HEADER.encode("ascii")
_SIGNATURE_HEADER = SIGNATURE_HEADER.encode("ascii")


@attrs.frozen
class WebhookDelivery:
    """A :func:`webhook` job's input: deliver event ``event_id`` to endpoint
    ``endpoint_id``; ``org_id`` names the org that owns the endpoint (required
    when the webhook's ``tenant`` reads it)."""

    endpoint_id: str
    event_id: str
    org_id: str | None = None


@attrs.frozen
class Endpoint:
    """Where a delivery goes, as ``endpoint(delivery)`` answers it: ``id`` (the
    delivery's ``endpoint_id``), ``url`` (``https://``), ``secret`` (str or
    bytes: the HMAC key) and ``enabled`` (``False``: nothing is sent,
    ``X_WEBHOOK_ENDPOINT_DISABLED``). Its ``repr`` hides the secret and the
    URL (a path may carry a token)."""

    id: str
    url: str = attrs.field(repr=False)
    secret: str | bytes = attrs.field(repr=False)
    enabled: bool = True


@attrs.frozen
class WebhookEvent:
    """What a delivery sends, as ``event(delivery)`` answers it: ``id`` (the
    delivery's ``event_id``), ``topic`` and ``body``: ``bytes`` or ``str`` sent
    as they are (the app's own JSON text), anything else sent as its JSON form.
    The content type is ``application/json``. Its ``repr`` hides the body."""

    id: str
    topic: str
    body: Any = attrs.field(repr=False)


def _id_fault(value: object) -> str | None:
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        return f"must be a string of 1 to {MAX_ID} characters"
    if ":" in value:
        return "must not hold ':' (it separates the parts of the delivery's key)"
    fault = text_fault(value)
    if fault is not None:
        return f"cannot be stored: {fault}"
    return None


def delivery_key(delivery: WebhookDelivery) -> str:
    """The built-in idempotency key: ``webhook:<endpoint_id>:<event_id>``.
    An id that cannot be part of it is ``X_JOB_INPUT_INVALID``, nothing queued."""
    faults = [
        f"{field} {fault}"
        for field, fault in (
            ("endpoint_id", _id_fault(delivery.endpoint_id)),
            ("event_id", _id_fault(delivery.event_id)),
        )
        if fault is not None
    ]
    if faults:
        raise JobsError(
            ErrorCode.X_JOB_INPUT_INVALID,
            "the webhook delivery is invalid: " + "; ".join(faults),
            meta={"faults": faults},
        )
    return f"webhook:{delivery.endpoint_id}:{delivery.event_id}"


def _org_tenant(tenant: Callable[[Any], Any], name: str) -> Callable[[Any], Any]:
    """The declared tenant, required to answer an org: a delivery naming none is
    refused (at the enqueue, and on a row queued before the rule)."""

    def org_of(delivery: Any) -> Any:
        org = tenant(delivery)
        if org is None:
            raise JobsError(
                ErrorCode.X_JOB_TENANT_MISMATCH,
                f"{name}: the delivery names no org for its tenant; pass "
                "WebhookDelivery(..., org_id=<the org that owns the endpoint>) (or declare "
                "tenant='none' for endpoints no org owns)",
                meta={"job": name},
            )
        return org

    return org_of


def _check_callable(value: object, field: str, shape: str, faults: list[str]) -> None:
    if value is _MISSING or value is None:
        faults.append(f"{field}= is required: {shape}")
    elif not callable(value):
        faults.append(f"{field} must be a function: {shape}")


def webhook(
    *,
    name: Any = _MISSING,
    tenant: Any = _MISSING,
    endpoint: Any = _MISSING,
    event: Any = _MISSING,
    ledger: Any = _MISSING,
    disable_after: Any = DEFAULT_WEBHOOK_DISABLE_AFTER,
    timeout: Duration = DEFAULT_WEBHOOK_TIMEOUT,
    allow_private: Any = False,
    queue: str = "default",
    retry: Retry | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    **unknown: Any,
) -> Job[WebhookDelivery, dict[str, int]]:
    """Declare an outbound webhook: a job that POSTs one event to one endpoint.

    ``endpoint(delivery)`` answers the :class:`Endpoint` and ``event(delivery)``
    the :class:`WebhookEvent` (sync or async; ``None``: unknown), read on every
    attempt and never stored. ``ledger`` is a :class:`WebhookLedger`
    (:func:`postgres_webhook_ledger`, or :func:`memory_webhook_ledger` for
    development). ``tenant`` is a function of the delivery answering the org
    that owns the endpoint (``lambda d: d.org_id``), or ``"none"``.

    Each attempt is signed (``x-webhook-id``, ``x-webhook-topic``,
    ``x-webhook-signature: t=<unix seconds>,v1=<hex HMAC-SHA256>``; see
    :func:`verify_webhook_signature`), bounded by ``timeout``, never follows a
    redirect, and is refused before any connection when the URL's host is or
    resolves to a loopback, private, link-local, shared, multicast, unspecified
    or metadata address, unless ``allow_private=True`` (development and tests
    only: it also admits ``http://``). After ``disable_after`` consecutive failed
    attempts to one endpoint the ledger disables it: later deliveries fail
    terminally with ``X_WEBHOOK_ENDPOINT_DISABLED`` and send nothing, until the
    app calls ``await ledger.enable(endpoint_id)``.

    ``retry``, ``queue`` and ``on_settled`` are as for :func:`~trio_jobs.job`.
    Every argument is a keyword; a bad declaration is ``X_JOB_DECLARATION_INVALID``
    naming every fault. The run's result is ``{"status": <the 2xx status>}``.

    >>> deliver = webhook(
    ...     name="partner.webhooks",
    ...     tenant=lambda d: d.org_id,
    ...     endpoint=lambda d: endpoints[d.endpoint_id],
    ...     event=lambda d: events[d.event_id],
    ...     ledger=postgres_webhook_ledger(),
    ... )
    >>> await deliver.enqueue(WebhookDelivery(endpoint_id="e1", event_id="ev1", org_id="acme"))
    """
    faults: list[str] = []
    if unknown:
        faults.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    name_ok = check_factory_name(name, MAX_NAME, "the webhook's name, a durable queue key", faults)
    if tenant is _MISSING or tenant is None:
        faults.append(
            "tenant= is required: a function of the delivery answering the org that owns the "
            "endpoint (tenant=lambda d: d.org_id), or 'none'"
        )
    elif not (tenant == "none" or callable(tenant)):
        faults.append("tenant must be a function of the delivery or the string 'none'")
    _check_callable(endpoint, "endpoint", "endpoint(delivery) answering an Endpoint", faults)
    _check_callable(event, "event", "event(delivery) answering a WebhookEvent", faults)
    if ledger is _MISSING or ledger is None:
        faults.append(
            "ledger= is required: postgres_webhook_ledger(), or memory_webhook_ledger() in "
            "development"
        )
    elif not isinstance(ledger, WebhookLedger):
        faults.append("ledger must be a WebhookLedger (postgres_webhook_ledger(), ...)")
    if isinstance(disable_after, bool) or not isinstance(disable_after, int) or disable_after < 1:
        faults.append("disable_after must be a whole number, 1 or more")
    timeout_s: float | None = None
    try:
        timeout_s = parse_duration(timeout, field="timeout")
    except JobsError:
        faults.append(
            'timeout must be a positive duration ("10s", "500ms", a timedelta or seconds)'
        )
    if not isinstance(allow_private, bool):
        faults.append("allow_private must be True or False")
    if importlib.util.find_spec("httpx") is None:  # pragma: no cover - the extra is installed
        faults.append("webhook() sends with httpx: pip install 'trio-jobs[webhooks]'")
    job_name = name if name_ok else "webhook"
    declared_tenant: Any = "none"
    if callable(tenant):
        declared_tenant = _org_tenant(tenant, job_name)
    declare: Callable[[Callable[..., Any]], Job[Any, Any]] | None = None
    try:
        declare = job(
            name=job_name,
            input=WebhookDelivery,
            tenant=declared_tenant,
            idempotency_key=delivery_key,
            queue=queue,
            retry=retry,
            timeout=(timeout_s or DEFAULT_WEBHOOK_TIMEOUT) + WRITE_BUDGET,
            on_settled=on_settled,
        )
    except JobDeclarationError as exc:
        faults.extend(exc.meta.get("faults") or [exc.message])
    if faults or declare is None or timeout_s is None:
        raise JobDeclarationError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            "webhook declaration is invalid: " + "; ".join(faults),
            meta={"faults": faults},
        )
    spec = _Spec(
        name=job_name,
        tenant_declared=callable(tenant),
        endpoint=endpoint,
        event=event,
        ledger=ledger,
        disable_after=disable_after,
        timeout=timeout_s,
        guard=not allow_private,
    )
    handle = declare(spec.body())
    handle.kind = "webhook"
    handle.ledger = ledger  # type: ignore[attr-defined]
    handle.disable_after = disable_after  # type: ignore[attr-defined]
    handle.allow_private = allow_private  # type: ignore[attr-defined]
    handle.__doc__ = f"The webhook {job_name!r}: delivers one event to one endpoint per run."
    return handle


# --------------------------------------------------------------------------- one attempt


class _Verdict(Exception):
    """How an attempt ended, before the ledger hears it: the status answered
    (if any) and the error to raise (``None``: delivered)."""

    def __init__(self, status: int | None, error: JobsError | None) -> None:
        super().__init__(error.code if error is not None else "delivered")
        self.status = status
        self.error = error


def _fail(code: ErrorCode, endpoint_id: str, message: str, **meta: Any) -> JobsError:
    return JobsError(code, message, meta={"endpoint_id": endpoint_id, **meta})


def retry_after_seconds(value: str | None, date: str | None, now: float) -> float | None:
    """A ``Retry-After`` header's wait: delta-seconds, or an HTTP-date read
    against the answer's own ``Date`` (else ``now``). ``None`` when absent,
    unreadable, zero or in the past (unstated)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        seconds = float(int(text[:12]))
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        base = now
        if date is not None:
            try:
                sent = email.utils.parsedate_to_datetime(date.strip())
                if sent is not None and sent.tzinfo is not None:
                    base = sent.timestamp()
            except (TypeError, ValueError, IndexError):
                pass
        seconds = when.timestamp() - base
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return min(seconds, MAX_RETRY_AFTER)


def _body_bytes(body: Any, event_id: str, endpoint_id: str) -> bytes:
    if isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
    elif isinstance(body, str):
        try:
            raw = body.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail(
                ErrorCode.X_WEBHOOK_EVENT_INVALID,
                endpoint_id,
                f"event {event_id!r}: its body is a str that is not valid text (a lone "
                "surrogate); send bytes or valid text",
                event_id=event_id,
            ) from None
    else:
        form = payload_form(
            body,
            what=f"the body of event {event_id!r}",
            code=ErrorCode.X_WEBHOOK_EVENT_INVALID,
        )
        raw = dumps(form)
    if len(raw) > MAX_BODY_BYTES:
        raise _fail(
            ErrorCode.X_WEBHOOK_EVENT_INVALID,
            endpoint_id,
            f"event {event_id!r}: its body is {len(raw)} bytes, over {MAX_BODY_BYTES}; send a "
            "reference the receiver fetches instead",
            event_id=event_id,
        )
    return raw


@attrs.frozen
class _Spec:
    name: str
    tenant_declared: bool
    endpoint: Callable[[WebhookDelivery], Any]
    event: Callable[[WebhookDelivery], Any]
    ledger: WebhookLedger
    disable_after: int
    timeout: float
    guard: bool

    def body(self) -> Callable[[JobContext[WebhookDelivery]], Any]:
        spec = self

        async def deliver(ctx: JobContext[WebhookDelivery]) -> dict[str, int]:
            return await spec.attempt(ctx)

        deliver.__name__ = deliver.__qualname__ = self.name
        return deliver

    def _check_tenancy(self, ctx: JobContext[WebhookDelivery]) -> None:
        d = ctx.input
        if not self.tenant_declared:
            return
        declared = ctx._state.handle.tenant_of(d)  # raises X_JOB_TENANT_MISMATCH for none
        if (
            ctx.tenant_id is None
            or declared != ctx.tenant_id
            or (d.org_id is not None and d.org_id != ctx.tenant_id)
        ):
            raise JobsError(
                ErrorCode.X_JOB_TENANT_MISMATCH,
                f"{self.name}: the delivery's org is not the run's org; refused before the "
                "endpoint or the event was read (re-enqueue it with its org_id)",
                meta={"job": self.name},
            )

    async def attempt(self, ctx: JobContext[WebhookDelivery]) -> dict[str, int]:
        d = ctx.input
        self._check_tenancy(ctx)
        driver = ctx._state.driver
        at = driver.now()
        started = trio.current_time()
        verdict: _Verdict
        with trio.move_on_after(self.timeout) as scope:
            try:
                status = await self._deliver(d, at)
                verdict = _Verdict(status, None)
            except _Verdict as ended:
                verdict = ended
        if scope.cancelled_caught:
            verdict = _Verdict(
                None,
                _fail(
                    ErrorCode.X_WEBHOOK_DELIVERY_FAILED,
                    d.endpoint_id,
                    f"endpoint {d.endpoint_id!r}: no answer within the webhook's timeout "
                    f"({self.timeout:g}s); retried",
                    cause="timeout",
                ),
            )
        error = verdict.error
        record = WebhookAttempt(
            endpoint_id=d.endpoint_id,
            event_id=d.event_id,
            attempt=ctx.attempt,
            status=verdict.status,
            code=None if error is None else error.code,
            at=at,
            duration_ms=max(0.0, (trio.current_time() - started) * 1000.0),
        )
        disabled = await self.ledger.record(record, disable_after=self.disable_after)
        if error is not None:
            if disabled and error.code in (
                ErrorCode.X_WEBHOOK_DELIVERY_FAILED,
                ErrorCode.X_WEBHOOK_DELIVERY_REJECTED,
            ):
                error.meta["endpoint_disabled"] = True
                error.message += (
                    f"; the endpoint is now disabled after {self.disable_after} consecutive "
                    "failed attempts (re-enable it with ledger.enable(endpoint_id))"
                )
            raise error
        assert verdict.status is not None
        return {"status": verdict.status}

    async def _read(self, d: WebhookDelivery) -> tuple[Endpoint, WebhookEvent]:
        """The endpoint and the event, checked (a refusal is a terminal verdict)."""
        eid = d.endpoint_id
        found = await _call(self.endpoint, d)
        if found is None:
            raise _Verdict(
                None,
                _fail(
                    ErrorCode.X_WEBHOOK_ENDPOINT_UNKNOWN,
                    eid,
                    f"endpoint {eid!r}: endpoint(delivery) answered None (no such endpoint); "
                    "nothing was sent",
                ),
            )
        if not isinstance(found, Endpoint):
            raise _Verdict(
                None,
                _fail(
                    ErrorCode.X_WEBHOOK_ENDPOINT_INVALID,
                    eid,
                    f"endpoint {eid!r}: endpoint(delivery) must answer an Endpoint, not a "
                    f"{type(found).__name__}; nothing was sent",
                ),
            )
        faults: list[str] = []
        if found.id != eid:
            faults.append("its id is not the delivery's endpoint_id")
        if not isinstance(found.secret, str | bytes) or len(found.secret) == 0:
            faults.append("its secret must be a non-empty str or bytes")
        if not isinstance(found.enabled, bool):
            faults.append("enabled must be True or False")
        if faults:
            raise _Verdict(
                None,
                _fail(
                    ErrorCode.X_WEBHOOK_ENDPOINT_INVALID,
                    eid,
                    f"endpoint {eid!r}: " + "; ".join(faults) + "; nothing was sent",
                ),
            )
        if found.enabled is False or await self.ledger.is_disabled(eid):
            why = (
                "the app disabled it (Endpoint.enabled=False)"
                if found.enabled is False
                else "the ledger disabled it after consecutive failures (re-enable it with "
                "ledger.enable(endpoint_id))"
            )
            raise _Verdict(
                None,
                _fail(
                    ErrorCode.X_WEBHOOK_ENDPOINT_DISABLED,
                    eid,
                    f"endpoint {eid!r} is disabled: {why}; nothing was sent",
                ),
            )
        event = await _call(self.event, d)
        if event is None:
            raise _Verdict(
                None,
                _fail(
                    ErrorCode.X_WEBHOOK_EVENT_UNKNOWN,
                    eid,
                    f"event {d.event_id!r}: event(delivery) answered None (no such event); "
                    "nothing was sent",
                    event_id=d.event_id,
                ),
            )
        problems: list[str] = []
        if not isinstance(event, WebhookEvent):
            problems.append(
                f"event(delivery) must answer a WebhookEvent, not a {type(event).__name__}"
            )
        else:
            if event.id != d.event_id:
                problems.append("its id is not the delivery's event_id")
            elif (fault := label_fault(event.id)) is not None:
                problems.append(f"its id: {fault}")
            if (fault := label_fault(event.topic)) is not None:
                problems.append(f"its topic: {fault}")
        if problems:
            raise _Verdict(
                None,
                _fail(
                    ErrorCode.X_WEBHOOK_EVENT_INVALID,
                    eid,
                    f"event {d.event_id!r}: " + "; ".join(problems) + "; nothing was sent",
                    event_id=d.event_id,
                ),
            )
        return found, event

    async def _deliver(self, d: WebhookDelivery, at: float) -> int:
        """One POST; answers the 2xx status or raises the attempt's :class:`_Verdict`."""
        endpoint, event = await self._read(d)
        eid = d.endpoint_id
        try:
            url = check_url(eid, endpoint.url, allow_private=not self.guard)
            body = _body_bytes(event.body, event.id, eid)
        except JobsError as refused:
            raise _Verdict(None, refused) from None
        stamp = int(at)
        # The id and the topic passed label_fault (printable ASCII): ASCII bytes.
        headers = [
            *_STATIC_HEADERS,
            (_ID_HEADER, event.id.encode("ascii")),
            (_TOPIC_HEADER, event.topic.encode("ascii")),
            (
                _SIGNATURE_HEADER,
                signature_header(endpoint.secret, stamp, event.id, event.topic, body).encode(
                    "ascii"
                ),
            ),
        ]
        try:
            async with outside_call(self.timeout):
                status, answered = await post(
                    url, headers, body, guard=self.guard, cap=MAX_ANSWER_BYTES
                )
        except EndpointRefused as refused:
            raise _Verdict(
                None,
                _fail(
                    ErrorCode.X_WEBHOOK_ENDPOINT_INVALID,
                    eid,
                    f"endpoint {eid!r}: its host resolves to {refused.reason}; nothing was sent "
                    "(point it at a public https:// URL)",
                ),
            ) from None
        except Exception as exc:  # any failure of the request: no answer to classify
            raise _Verdict(
                None,
                _fail(
                    ErrorCode.X_WEBHOOK_DELIVERY_FAILED,
                    eid,
                    f"endpoint {eid!r}: the request failed ({type(exc).__name__}); retried",
                    cause=type(exc).__name__,
                ),
            ) from None
        retry_after = date = None
        if 200 <= status < 300:
            return status
        for key, value in answered:
            lowered = key.lower()
            if lowered == b"retry-after":
                retry_after = value.decode("latin-1")
            elif lowered == b"date":
                date = value.decode("latin-1")
        return self._classify(eid, status, retry_after, date, at)

    def _classify(
        self, eid: str, status: int, retry_after: str | None, date: str | None, now: float
    ) -> int:
        if 200 <= status < 300:
            return status
        if status in (429, 503):
            wait = retry_after_seconds(retry_after, date, now)
            if wait is not None:
                raise _Verdict(
                    status,
                    _fail(
                        ErrorCode.X_WEBHOOK_DELIVERY_THROTTLED,
                        eid,
                        f"endpoint {eid!r} answered {status} with Retry-After {wait:g}s; the "
                        "delivery waits that long before its next attempt",
                        status=status,
                        retry_after_seconds=wait,
                    ),
                )
        if 300 <= status < 500:
            what = (
                "a redirect (not followed: the body is signed for this endpoint)"
                if status < 400
                else "a refusal"
            )
            raise _Verdict(
                status,
                _fail(
                    ErrorCode.X_WEBHOOK_DELIVERY_REJECTED,
                    eid,
                    f"endpoint {eid!r} answered {status}, {what}; retried",
                    status=status,
                ),
            )
        raise _Verdict(
            status,
            _fail(
                ErrorCode.X_WEBHOOK_DELIVERY_FAILED,
                eid,
                f"endpoint {eid!r} answered {status}; retried",
                status=status,
            ),
        )
