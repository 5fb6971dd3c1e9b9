"""``webhook_receiver()``: a vendor's webhook, verified at the door, run as a job.

A receiver is a :class:`~trio_jobs.Job` (``kind == "webhook-receiver"``) whose
input is a :class:`ReceivedWebhook` and whose idempotency key is the event id
its ``verify`` read out of the signed bytes, so a vendor's redelivery of one
event while its run is live is one run. The HTTP door that feeds it lives in
``trio_jobs.web`` (``create_app`` and ``mount_receivers`` mount it): it reads
the raw bytes under ``max_bytes``, calls ``verify``, enqueues, and only then
answers 200. This module holds what needs no web framework: the declaration,
the records ``verify`` is given and answers, and :func:`verify_body_hmac`.

The stored payload is the job's input, so the handle is ``sensitive``: ``show``,
the CLI and the dashboard print ``[redacted]`` for it, and no log line carries it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from ._backfill import MAX_NAME
from ._context import _call as call
from ._declare import Concurrency, Job, Retry, check_factory_name, job
from ._enqueue import _MISSING
from ._time import Duration
from .errors import ErrorCode, JobDeclarationError, JobsError

if TYPE_CHECKING:
    from ._settled import Settled

__all__ = [
    "DEFAULT_WEBHOOK_BODY_LIMIT",
    "MAX_EVENT_ID",
    "MAX_WEBHOOK_BODY_LIMIT",
    "Answer",
    "Inbound",
    "ReceivedWebhook",
    "Verified",
    "WebhookReceiver",
    "call",
    "event_id_fault",
    "receivers_of",
    "verify_body_hmac",
    "webhook_receiver",
]

#: The most bytes a receiver reads of one request body unless its ``max_bytes``
#: says otherwise: 1 MiB.
DEFAULT_WEBHOOK_BODY_LIMIT = 1 << 20
#: The largest ``max_bytes`` a receiver takes: 64 MiB (the body is held in memory
#: while ``verify`` runs).
MAX_WEBHOOK_BODY_LIMIT = 64 << 20
#: The longest event id a receiver enqueues (printable ASCII characters).
MAX_EVENT_ID = 256
#: The longest ``path`` a receiver takes.
MAX_PATH = 1_000

# A path segment: literal characters a URL path holds unescaped, or one
# ``{name}`` parameter (an identifier) standing for a whole segment.
_LITERAL_SEGMENT = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@%-]+")
_PARAM_SEGMENT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HASHES: dict[str, Callable[[], Any]] = {
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha512": hashlib.sha512,
}


# --------------------------------------------------------------------------- records


@attrs.frozen
class Inbound:
    """What ``verify`` (and ``handshake``) is handed: the request as it came,
    nothing parsed.

    ``body`` is the exact bytes (at most the receiver's ``max_bytes``),
    ``headers`` a case-insensitive mapping (``headers.get("x-signature")``),
    ``params`` the path's ``{name}`` parameters, ``url`` the full URL as text
    (with its query), ``method`` ``"POST"`` (``"GET"`` for a handshake)."""

    body: bytes
    headers: Mapping[str, str]
    params: Mapping[str, str] = attrs.field(factory=dict)
    url: str = ""
    method: str = "POST"


@attrs.frozen
class Verified:
    """What ``verify`` answers for a genuine event: its id (the dedupe key: read
    it from the signed bytes, never from an unsigned header) and the payload to
    queue (JSON-able; stored as the job's input, sensitive).

    The event id must be 1 to 256 printable ASCII characters: the door answers
    ``422 X_WEBHOOK_EVENT_ID_INVALID`` otherwise, without echoing it."""

    event_id: str
    payload: Any = None


def _answer_body(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise JobsError(
        ErrorCode.X_WEBHOOK_RECEIVER_INVALID,
        f"Answer(body=...) takes bytes or str, not a {type(value).__name__}",
    )


def _answer_headers(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return dict(value)
    raise JobsError(
        ErrorCode.X_WEBHOOK_RECEIVER_INVALID,
        "Answer(headers=...) takes a mapping of header names to str values, or None",
    )


def _check_status(_instance: Any, _attribute: Any, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 200 <= value <= 599:
        raise JobsError(
            ErrorCode.X_WEBHOOK_RECEIVER_INVALID,
            "Answer(status=...) takes an HTTP status, a whole number from 200 to 599",
        )


@attrs.frozen
class Answer:
    """What ``verify`` answers instead of an event (a subscription challenge, a
    ping), and what ``handshake`` answers: sent as is, nothing queued.

    ``status`` is an HTTP status from 200 to 599; ``body`` is ``bytes`` or ``str``
    (sent as UTF-8); ``headers`` a mapping of names to values, or ``None``.
    A bad one is ``X_WEBHOOK_RECEIVER_INVALID``.

    >>> Answer(200, challenge, {"content-type": "text/plain"})"""

    status: int = attrs.field(validator=_check_status)
    body: bytes = attrs.field(default=b"", converter=_answer_body)
    headers: dict[str, str] = attrs.field(default=None, converter=_answer_headers)


@attrs.frozen
class ReceivedWebhook:
    """A receiver's job input, ``ctx.input`` in its ``handle``: the event id and
    payload ``verify`` answered, and the path's parameters."""

    event_id: str
    payload: Any = None
    params: dict[str, str] = attrs.field(factory=dict)


def event_id_fault(value: object) -> str | None:
    """Why ``value`` is no event id (1 to 256 printable ASCII characters), or
    ``None``. The reason never quotes the value."""
    if not isinstance(value, str):
        return f"the event id must be a str, not a {type(value).__name__}"
    if not 1 <= len(value) <= MAX_EVENT_ID:
        return f"the event id must be 1 to {MAX_EVENT_ID} characters long"
    if not all(" " <= ch <= "~" for ch in value):
        return "the event id must be printable ASCII (space to ~)"
    return None


# --------------------------------------------------------------------------- HMAC


def _secrets(secret: object) -> list[bytes]:
    items = list(secret) if isinstance(secret, list | tuple) else [secret]
    if not items:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "verify_body_hmac(secret=...) is empty: pass the signing secret (or a list of "
            "them, newest first, while rotating)",
        )
    keys: list[bytes] = []
    for item in items:
        if isinstance(item, str):
            item = item.encode("utf-8")
        if not isinstance(item, bytes) or not item:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "verify_body_hmac(secret=...): every secret must be a non-empty str or bytes "
                "(an unset environment variable in a rotation list is refused, not skipped)",
            )
        keys.append(item)
    return keys


def _decode_given(given: str, encoding: str) -> bytes | None:
    try:
        if encoding == "hex":
            return bytes.fromhex(given)
        padded = given + "=" * (-len(given) % 4)
        if "-" in given or "_" in given:
            return base64.urlsafe_b64decode(padded)
        return base64.b64decode(padded, validate=True)
    except (ValueError, binascii.Error):
        return None


def verify_body_hmac(
    body: bytes,
    *,
    secret: str | bytes | Sequence[str | bytes],
    given: str | None,
    encoding: Literal["hex", "base64"] = "hex",
    prefix: str = "",
    algorithm: Literal["sha1", "sha256", "sha512"] = "sha256",
    message: bytes | None = None,
) -> str:
    """Check a vendor's HMAC of the body; answer the body as text (UTF-8).

    ``given`` is the signature header's value (``None``: it was missing);
    ``prefix`` what precedes the MAC in it (``"sha256="`` for a GitHub-like
    header); ``encoding`` how the MAC is written, ``"hex"`` or ``"base64"``;
    ``algorithm`` the hash (``"sha256"`` unless the vendor says otherwise).
    ``secret`` is the signing secret, or a list of them while rotating (a
    signature made with any of them passes). ``message`` is what the MAC covers
    when it is not the body alone (a Stripe-like ``f"{t}.".encode() + body``).

    The comparison is timing-safe (:func:`hmac.compare_digest`, against every
    secret). A missing, malformed or wrong signature is
    ``X_WEBHOOK_SIGNATURE_INVALID``; an empty secret (or an empty entry of the
    list) is ``X_CONFIG_INVALID``; a signed body that is not UTF-8 is
    ``X_WEBHOOK_INVALID``. No message quotes the body, the header or a secret.

    >>> text = verify_body_hmac(inbound.body, secret=[NEW, OLD], prefix="sha256=",
    ...                         given=inbound.headers.get("x-billing-signature"))
    """
    keys = _secrets(secret)
    if encoding not in ("hex", "base64"):
        raise JobsError(ErrorCode.X_CONFIG_INVALID, 'encoding is "hex" or "base64"')
    digest = _HASHES.get(algorithm)
    if digest is None:
        raise JobsError(ErrorCode.X_CONFIG_INVALID, 'algorithm is "sha1", "sha256" or "sha512"')
    if not isinstance(prefix, str):
        raise JobsError(ErrorCode.X_CONFIG_INVALID, "prefix is a str (empty for none)")
    if not isinstance(body, bytes | bytearray | memoryview):
        raise JobsError(ErrorCode.X_INVARIANT, "verify_body_hmac takes the body as bytes")
    signed = bytes(body) if message is None else message
    if not isinstance(signed, bytes):
        raise JobsError(ErrorCode.X_INVARIANT, "message= takes bytes")
    if not isinstance(given, str) or not given.strip():
        raise JobsError(
            ErrorCode.X_WEBHOOK_SIGNATURE_INVALID, "the request carries no signature header"
        )
    text = given.strip()
    if prefix and not text.startswith(prefix):
        raise JobsError(
            ErrorCode.X_WEBHOOK_SIGNATURE_INVALID,
            "the signature header does not start with the expected prefix",
        )
    mac = _decode_given(text[len(prefix) :], encoding)
    if mac is None:
        raise JobsError(
            ErrorCode.X_WEBHOOK_SIGNATURE_INVALID,
            f"the signature is not {encoding} text",
        )
    # Every secret is tried, so the time taken says nothing about which matched.
    matched = False
    for key in keys:
        expected = hmac.new(key, signed, digest).digest()
        matched |= hmac.compare_digest(expected, mac)
    if not matched:
        raise JobsError(
            ErrorCode.X_WEBHOOK_SIGNATURE_INVALID,
            "the signature does not match the body under any configured secret",
        )
    try:
        return bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        raise JobsError(ErrorCode.X_WEBHOOK_INVALID, "the signed body is not UTF-8 text") from None


# --------------------------------------------------------------------------- declaration

Verify = Callable[[Inbound], "Verified | Answer | Awaitable[Verified | Answer]"]
Handshake = Callable[[Inbound], "Answer | Awaitable[Answer]"]


class WebhookReceiver(Job[ReceivedWebhook, Any]):
    """The handle ``webhook_receiver()`` returns: a :class:`~trio_jobs.Job` with
    ``.kind == "webhook-receiver"``, its input a :class:`ReceivedWebhook`, keyed by
    the event id, ``sensitive``; the door lifted (``.path``, ``.verify``,
    ``.handshake``, ``.max_bytes``)."""

    kind = "webhook-receiver"

    def __init__(
        self,
        base: Job[Any, Any],
        *,
        path: str,
        verify: Verify,
        handshake: Handshake | None,
        max_bytes: int,
    ) -> None:
        self.__dict__.update(base.__dict__)
        self.path = path
        self.verify = verify
        self.handshake = handshake
        self.max_bytes = max_bytes

    def __repr__(self) -> str:
        return f"<webhook receiver {self.name!r} POST {self.path} queue={self.queue!r}>"

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["receiver"] = {
            "path": self.path,
            "max_bytes": self.max_bytes,
            "handshake": self.handshake is not None,
        }
        return out


def _path_faults(path: object) -> list[str]:
    shape = 'an absolute URL path such as "/hooks/billing/{account}"'
    if not isinstance(path, str):
        return [f"path must be {shape}"]
    if not path.startswith("/"):
        return [f"path is relative: it must be {shape}"]
    if len(path) > MAX_PATH:
        return [f"path must be at most {MAX_PATH} characters"]
    if path == "/" or path.endswith("/"):
        return [f"path must name a resource, without a trailing slash: {shape}"]
    faults: list[str] = []
    names: list[str] = []
    for segment in path[1:].split("/"):
        param = _PARAM_SEGMENT.fullmatch(segment)
        if param is not None:
            names.append(param.group(1))
        elif segment in ("", ".", ".."):
            faults.append("path must not hold an empty, '.' or '..' segment")
        elif not _LITERAL_SEGMENT.fullmatch(segment):
            faults.append(
                "each path segment is literal URL characters (letters, digits, -._~ and "
                "the like: no space, '?', '#', '{' or '}') or one whole {name} parameter"
            )
    if len(set(names)) != len(names):
        faults.append("path names one {parameter} twice")
    return faults


def webhook_receiver(
    *,
    name: Any = _MISSING,
    path: Any = _MISSING,
    verify: Any = _MISSING,
    handle: Any = _MISSING,
    tenant: Any = "none",
    max_bytes: Any = DEFAULT_WEBHOOK_BODY_LIMIT,
    handshake: Any = None,
    queue: str = "default",
    retry: Retry | None = None,
    timeout: Duration | None = None,
    step_timeout: Duration | None = None,
    concurrency: int | Concurrency | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    **unknown: Any,
) -> WebhookReceiver:
    """Declare an inbound webhook: a door at ``path`` and the job behind it.

    ``trio_jobs.web.create_app(jobs)`` (or ``mount_receivers(app, jobs)``)
    mounts ``POST path`` for every receiver among the facade's jobs. A request's
    raw body (at most ``max_bytes``, enforced while it streams: ``413
    X_BODY_INVALID``) goes to ``verify(inbound)`` (an :class:`Inbound`, sync or
    async), which answers :class:`Verified` (``event_id``, ``payload``) or an
    :class:`Answer` to send instead. The payload is enqueued keyed by the event
    id, and only then does the door answer ``200 {"ok": true, "event_id": ...,
    "deduped": ...}``: a redelivery while the run is live answers ``deduped:
    true``. ``verify`` raising ``X_WEBHOOK_SIGNATURE_INVALID`` / ``_STALE`` is a
    401, anything else it raises a 400 ``X_WEBHOOK_INVALID``; an event id outside
    1 to 256 printable ASCII characters a 422 ``X_WEBHOOK_EVENT_ID_INVALID``; a
    failed enqueue a 503 with ``Retry-After: 30``. Nothing is queued for a
    refused request, and no response or log line quotes the request.

    ``handle(ctx)`` is the job's body: ``ctx.input`` is a :class:`ReceivedWebhook`
    (``event_id``, ``payload``, ``params``); it never re-verifies, and runs **at
    least once** per event id. ``handshake(inbound)``, when given, answers
    ``GET path`` with an :class:`Answer` (a vendor's subscription check).

    ``name``, ``path`` (absolute, ``{name}`` segments for parameters),
    ``verify`` and ``handle`` are required. ``tenant`` (``"none"`` or a function
    of the :class:`ReceivedWebhook`), ``queue``, ``retry``, ``timeout``,
    ``step_timeout``, ``concurrency`` and ``on_settled`` are as for
    :func:`~trio_jobs.job`; the payload is stored ``sensitive``. A bad
    declaration is ``X_WEBHOOK_RECEIVER_INVALID`` naming every fault.

    >>> billing_events = webhook_receiver(
    ...     name="billing.events", path="/hooks/billing/{account}",
    ...     verify=verify, handle=handle_event)
    """
    faults: list[str] = []
    if unknown:
        faults.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    name_ok = check_factory_name(
        name, MAX_NAME, "the receiver's job name (a durable queue key)", faults
    )
    if path is _MISSING or path is None:
        faults.append('path= is required: where the door is, e.g. "/hooks/billing/{account}"')
    else:
        faults.extend(_path_faults(path))
    if verify is _MISSING or verify is None:
        faults.append("verify= is required: verify(inbound) answering Verified(...) or Answer(...)")
    elif not callable(verify):
        faults.append("verify must be a function: verify(inbound) answering Verified or Answer")
    if handle is _MISSING or handle is None:
        faults.append("handle= is required: async def handle(ctx), ctx.input a ReceivedWebhook")
    elif not callable(handle):
        faults.append("handle must be a function: async def handle(ctx)")
    if handshake is not None and not callable(handshake):
        faults.append("handshake must be a function: handshake(inbound) answering an Answer")
    if (
        isinstance(max_bytes, bool)
        or not isinstance(max_bytes, int)
        or not 1 <= max_bytes <= MAX_WEBHOOK_BODY_LIMIT
    ):
        faults.append(
            f"max_bytes must be a whole number of bytes from 1 to {MAX_WEBHOOK_BODY_LIMIT} "
            f"(default {DEFAULT_WEBHOOK_BODY_LIMIT})"
        )
    base: Job[Any, Any] | None = None
    try:
        declare = job(
            name=name if name_ok else "webhook-receiver",
            input=ReceivedWebhook,
            tenant=tenant,
            idempotency_key=_event_key,
            queue=queue,
            retry=retry,
            timeout=timeout,
            step_timeout=step_timeout,
            concurrency=concurrency,
            on_settled=on_settled,
            sensitive=True,
        )
        if callable(handle):
            base = declare(handle)
    except JobDeclarationError as exc:
        faults.extend(exc.meta.get("faults") or [exc.message])
    if faults or base is None:
        raise JobDeclarationError(
            ErrorCode.X_WEBHOOK_RECEIVER_INVALID,
            "webhook_receiver declaration is invalid: " + "; ".join(faults),
            meta={"faults": faults},
        )
    return WebhookReceiver(
        base, path=path, verify=verify, handshake=handshake, max_bytes=int(max_bytes)
    )


def _event_key(received: ReceivedWebhook) -> str:
    return received.event_id


def receivers_of(handles: Sequence[Job[Any, Any]]) -> list[WebhookReceiver]:
    """The receiver handles among ``handles``, by path (then name)."""
    return sorted(
        (h for h in handles if isinstance(h, WebhookReceiver)), key=lambda h: (h.path, h.name)
    )
