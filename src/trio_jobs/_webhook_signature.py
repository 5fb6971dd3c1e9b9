"""The outbound webhook's signature: one format, signed here, verified here.

A delivery carries ``x-webhook-id`` (the event id), ``x-webhook-topic`` and
``x-webhook-signature: t=<unix seconds>,v1=<hex HMAC-SHA256>``, the mac taken
with the endpoint's secret over ``v1:<t>:<event id>:<topic>:<body bytes>``.

- The timestamp is inside the mac, so a captured delivery re-dated to slip back
  into a receiver's freshness window no longer verifies; it is the *send* time
  (a retry signs again), so the window measures the request, not the event.
- ``:`` is refused in an event id and a topic: one mac would otherwise
  authenticate two different id/topic splits of the same string.

:func:`verify_webhook_signature` is the receiving half: every candidate mac is
compared in constant time (``hmac.compare_digest``, no early exit across a
rotation list), a bad or missing signature is ``X_WEBHOOK_SIGNATURE_INVALID``,
a genuine one outside the tolerance window ``X_WEBHOOK_SIGNATURE_STALE``.
Neither message carries a secret, a mac or the body.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._time import Clock, Duration, SystemClock, parse_duration
from .errors import ErrorCode, JobsError

__all__ = [
    "ID_HEADER",
    "SIGNATURE_HEADER",
    "TOPIC_HEADER",
    "sign",
    "signature_header",
    "verify_webhook_signature",
]

ID_HEADER = "x-webhook-id"
TOPIC_HEADER = "x-webhook-topic"
SIGNATURE_HEADER = "x-webhook-signature"

#: The longest event id or topic a delivery carries (header-safe, printable ASCII).
MAX_LABEL = 256
_LABEL_RE = re.compile(r"[\x21-\x39\x3b-\x7e]{1,256}")  # printable ASCII, no ':' or space
_SIGNATURE_RE = re.compile(r"t=(\d{1,12}),v1=([0-9a-f]{64})((?:,v1=[0-9a-f]{64}){0,7})")


def label_fault(value: object) -> str | None:
    """Why ``value`` cannot be an event id or a topic, or ``None``."""
    if not isinstance(value, str):
        return f"it must be a string, not a {type(value).__name__}"
    if not _LABEL_RE.fullmatch(value):
        return (
            f"it must be 1 to {MAX_LABEL} printable ASCII characters without ':' or a space "
            "(':' separates the signed fields)"
        )
    return None


def _key(secret: str | bytes) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)


#: Bodies up to this size are signed in one call (``hmac.digest``: a third of
#: the cost of building an ``hmac.HMAC``); a longer one is fed to a streaming
#: mac, so it is never copied.
ONE_SHOT_BYTES = 64 * 1024


def sign(secret: str | bytes, timestamp: int, event_id: str, topic: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``v1:<timestamp>:<event_id>:<topic>:<body>``."""
    head = f"v1:{timestamp}:{event_id}:{topic}:".encode()
    if len(body) <= ONE_SHOT_BYTES:
        return hmac.digest(_key(secret), head + body, "sha256").hex()
    mac = hmac.new(_key(secret), digestmod=hashlib.sha256)
    mac.update(head)
    mac.update(body)
    return mac.hexdigest()


def signature_header(
    secret: str | bytes, timestamp: int, event_id: str, topic: str, body: bytes
) -> str:
    """The ``x-webhook-signature`` value: ``t=<timestamp>,v1=<hex mac>``."""
    return f"t={timestamp},v1={sign(secret, timestamp, event_id, topic, body)}"


def _secrets(secret: object) -> list[bytes]:
    candidates: Sequence[object]
    if isinstance(secret, str | bytes | bytearray):
        candidates = [secret]
    elif isinstance(secret, list | tuple):
        candidates = secret
    else:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "secret= takes the endpoint's secret (str or bytes), or a list of them during a "
            "rotation (the new one first)",
        )
    keys: list[bytes] = []
    for one in candidates:
        if not isinstance(one, str | bytes | bytearray) or len(one) == 0:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "secret= holds an empty or non-text entry; every secret is a non-empty str or "
                "bytes (an empty secret would accept a mac anyone can compute)",
            )
        keys.append(_key(one if not isinstance(one, bytearray) else bytes(one)))
    if not keys:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID, "secret= is an empty list; pass at least one secret"
        )
    return keys


def _header_map(headers: object) -> dict[str, str]:
    """Lower-cased header names to their (last) value, from a mapping or pairs."""
    pairs: Iterable[Any]
    if isinstance(headers, Mapping):
        pairs = headers.items()
    elif hasattr(headers, "items") and callable(headers.items):
        pairs = headers.items()
    elif isinstance(headers, Iterable) and not isinstance(headers, str | bytes):
        pairs = headers
    else:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "headers must be the request's headers: a mapping or a list of (name, value) pairs",
        )
    found: dict[str, str] = {}
    for pair in pairs:
        try:
            name, value = pair
        except (TypeError, ValueError):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID, "headers must hold (name, value) pairs"
            ) from None
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(name, str) and isinstance(value, str):
            found[name.lower()] = value
    return found


def _invalid(why: str) -> JobsError:
    return JobsError(
        ErrorCode.X_WEBHOOK_SIGNATURE_INVALID,
        f"the webhook signature does not verify: {why}; refuse the request (401)",
    )


def verify_webhook_signature(
    headers: Any,
    body: bytes | str,
    *,
    secret: str | bytes | Sequence[str | bytes],
    tolerance: Duration = "5m",
    clock: Clock | None = None,
) -> str:
    """Verify a delivery of :func:`~trio_jobs.webhook` (the receiving half) and
    answer its event id, read from the verified ``x-webhook-id``.

    ``headers`` is the request's headers (a mapping, case-insensitive, or a list
    of ``(name, value)`` pairs), ``body`` the exact bytes received. ``secret`` is
    the endpoint's secret, or a list of secrets while one is rotated (each is
    tried, every comparison in constant time). ``tolerance`` is how far the
    signed timestamp may be from now, either way. ``clock`` (tests) answers now
    in epoch seconds.

    Raises ``X_WEBHOOK_SIGNATURE_INVALID`` for a missing, malformed or wrong
    signature (or a missing id/topic header), ``X_WEBHOOK_SIGNATURE_STALE`` for
    a genuine one outside the window, ``X_CONFIG_INVALID`` for an empty secret.

    >>> event_id = verify_webhook_signature(request.headers, raw_body, secret=[NEW, OLD])
    """
    keys = _secrets(secret)
    window = parse_duration(tolerance, field="tolerance")
    if isinstance(body, str):
        body = body.encode("utf-8")
    if not isinstance(body, bytes | bytearray | memoryview):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID, "body must be the exact bytes received (bytes or str)"
        )
    raw = bytes(body)
    found = _header_map(headers)
    given = found.get(SIGNATURE_HEADER)
    event_id = found.get(ID_HEADER)
    topic = found.get(TOPIC_HEADER)
    if given is None:
        raise _invalid(f"the request has no {SIGNATURE_HEADER} header")
    if event_id is None or topic is None:
        raise _invalid(f"the request lacks {ID_HEADER} or {TOPIC_HEADER} (both are signed)")
    if label_fault(event_id) is not None or label_fault(topic) is not None:
        raise _invalid(f"{ID_HEADER} or {TOPIC_HEADER} is not a signed label")
    match = _SIGNATURE_RE.fullmatch(given.strip())
    if match is None:
        raise _invalid(f"{SIGNATURE_HEADER} is not of the form t=<unix seconds>,v1=<hex>")
    timestamp = int(match.group(1))
    candidates = [match.group(2), *re.findall(r"[0-9a-f]{64}", match.group(3))]
    ok = False
    for key in keys:
        expected = sign(key, timestamp, event_id, topic, raw).encode("ascii")
        for candidate in candidates:
            # No early exit: every pair is compared, each in constant time.
            ok |= hmac.compare_digest(expected, candidate.encode("ascii"))
    if not ok:
        raise _invalid("no secret gives the mac it carries")
    now = (clock if clock is not None else SystemClock()).now()
    if abs(now - timestamp) > window:
        raise JobsError(
            ErrorCode.X_WEBHOOK_SIGNATURE_STALE,
            f"the webhook signature is genuine but its timestamp is {abs(now - timestamp):.0f}s "
            f"from now, outside the {window:.0f}s tolerance; refuse the request (a replay, or "
            "a clock that drifted: check the receiver's time)",
            meta={"age_seconds": round(now - timestamp, 3), "tolerance_seconds": window},
        )
    return event_id
