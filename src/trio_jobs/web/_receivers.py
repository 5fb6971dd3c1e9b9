"""The door of a ``webhook_receiver()``: raw bytes in, a durable row, then 200.

One ASGI app per receiver (:class:`ReceiverDoor`), reached through
:class:`ReceiverDoors`, a middleware that sits outside every other one: a
receiver is a public door, so the dashboard's ``Host`` check, auth hook, CSRF
check and loopback rule never see its requests (the signature is its guard). In
the dashboard (``create_app``) the dashboard's own routes answer first; in an
app of one's own (``mount_receivers``) the receivers do.

The order of a request, each step refusing with JSON ``{"ok": false, "code":
...}`` and queueing nothing:

1. the body, read chunk by chunk and never past ``max_bytes`` (a declared
   ``Content-Length`` over it is refused before a byte is read): ``413
   X_BODY_INVALID``;
2. ``verify(inbound)``: a signature code is a 401, the receiver's own
   misconfiguration (``X_CONFIG_INVALID``, ``X_WEBHOOK_RECEIVER_INVALID``, an
   answer that is neither ``Verified`` nor ``Answer``) a 500, anything else a
   400 ``X_WEBHOOK_INVALID``; an ``Answer`` is sent as is;
3. the event id (1 to 256 printable ASCII characters): ``422
   X_WEBHOOK_EVENT_ID_INVALID``;
4. the enqueue, keyed by the event id: any failure is ``503`` with
   ``Retry-After: 30`` and ``X_WEBHOOK_RECEIVER_UNAVAILABLE``, so the vendor
   redelivers; success is ``200 {"ok": true, "event_id": ..., "deduped": ...}``
   once the row is durable.

No response and no log line carries anything of the request: messages are fixed
texts, and an exception ``verify`` raised is logged by its type and code only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.datastructures import URL, Headers
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import _ambient
from .._facade import Jobs
from .._receiver import (
    Answer,
    Inbound,
    ReceivedWebhook,
    Verified,
    WebhookReceiver,
    call,
    event_id_fault,
    receivers_of,
)
from ..errors import ErrorCode, JobsError
from ..logging import emit

__all__ = ["RETRY_AFTER", "ReceiverDoor", "ReceiverDoors", "mount_receivers", "receiver_routes"]

log = logging.getLogger("trio_jobs.web")

#: The ``Retry-After`` (seconds) of a 503 when the enqueue failed.
RETRY_AFTER = 30
_SIGNATURE_CODES = frozenset(
    {ErrorCode.X_WEBHOOK_SIGNATURE_INVALID, ErrorCode.X_WEBHOOK_SIGNATURE_STALE}
)
# Codes that say the receiver itself is misconfigured: the vendor is not at
# fault, so it is answered 500 (the vendor redelivers once it is fixed).
_OWN_FAULT_CODES = frozenset({ErrorCode.X_CONFIG_INVALID, ErrorCode.X_WEBHOOK_RECEIVER_INVALID})
_MESSAGES = {
    ErrorCode.X_WEBHOOK_SIGNATURE_INVALID: "the signature does not verify",
    ErrorCode.X_WEBHOOK_SIGNATURE_STALE: "the signature is too old",
    ErrorCode.X_WEBHOOK_INVALID: "the request was refused by the receiver's verify",
    ErrorCode.X_WEBHOOK_EVENT_ID_INVALID: (
        "the event id must be 1 to 256 printable ASCII characters"
    ),
    ErrorCode.X_WEBHOOK_RECEIVER_UNAVAILABLE: (
        "the event could not be queued; deliver it again after Retry-After"
    ),
    ErrorCode.X_WEBHOOK_RECEIVER_INVALID: "the receiver is misconfigured; deliver it again later",
    ErrorCode.X_CONFIG_INVALID: "the receiver is misconfigured; deliver it again later",
}
_JSON_HEADERS = [
    (b"content-type", b"application/json"),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
]


async def _send(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]], *, head: bool = False
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode("ascii"))],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else body})


async def _refuse(
    send: Send,
    status: int,
    code: ErrorCode,
    message: str,
    *,
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    body = orjson.dumps({"ok": False, "code": str(code), "message": message})
    await _send(send, status, body, [*_JSON_HEADERS, *extra])


class _TooLarge:
    """The body went past ``max_bytes`` (or said it would)."""


_TOO_LARGE = _TooLarge()


class ReceiverDoor:
    """The ASGI app of one receiver's path: ``POST`` (and ``GET`` for its
    handshake), on the facade ``jobs``."""

    def __init__(self, jobs: Jobs, handle: WebhookReceiver) -> None:
        self.jobs = jobs
        self.handle = handle
        self.methods = ["POST"] + (["GET", "HEAD"] if handle.handshake is not None else [])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The vendor is no user of the app: enqueue on this facade, as no actor,
        # in no transaction, whatever the serving task's context holds.
        facade = _ambient.facade_var.set(self.jobs)
        tx = _ambient.tx_var.set(None)
        actor = _ambient.actor_var.set(None)
        run = _ambient.run_var.set(None)
        try:
            method = scope.get("method", "")
            if method == "POST":
                await self._post(scope, receive, send)
            elif method in ("GET", "HEAD") and self.handle.handshake is not None:
                await self._handshake(scope, send, head=method == "HEAD")
            else:
                await self._refused(
                    send,
                    405,
                    ErrorCode.X_WEBHOOK_INVALID,
                    f"this door takes {' or '.join(self.methods[:2])}",
                    extra=[(b"allow", ", ".join(self.methods).encode("ascii"))],
                )
        finally:
            _ambient.run_var.reset(run)
            _ambient.actor_var.reset(actor)
            _ambient.tx_var.reset(tx)
            _ambient.facade_var.reset(facade)

    # ------------------------------------------------------------------ steps

    async def _read(self, scope: Scope, receive: Receive) -> bytes | _TooLarge | None:
        """The body, or ``_TOO_LARGE`` as soon as it would pass ``max_bytes`` (the
        rest is never read), or ``None`` when the client went away."""
        limit = self.handle.max_bytes
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                if not value.isdigit() or int(value) > limit:
                    return _TOO_LARGE
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return _TOO_LARGE
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _inbound(self, scope: Scope, body: bytes) -> Inbound:
        params = scope.get("path_params") or {}
        return Inbound(
            body=body,
            headers=Headers(scope=scope),
            params={str(k): str(v) for k, v in params.items()},
            url=str(URL(scope=scope)),
            method=str(scope.get("method", "")),
        )

    async def _post(self, scope: Scope, receive: Receive, send: Send) -> None:
        handle = self.handle
        body = await self._read(scope, receive)
        if body is None:
            return  # the client left: nobody to answer, nothing queued
        if isinstance(body, _TooLarge):
            await self._refused(
                send,
                413,
                ErrorCode.X_BODY_INVALID,
                f"the body is larger than this receiver's max_bytes ({handle.max_bytes} bytes)",
            )
            return
        inbound = self._inbound(scope, body)
        verdict = await self._ask(send, handle.verify, inbound, "verify", (Verified, Answer))
        if verdict is None:
            return
        if isinstance(verdict, Answer):
            await self._answer(send, verdict)
            return
        event_id = verdict.event_id
        if event_id_fault(event_id) is not None:
            await self._refused(
                send,
                422,
                ErrorCode.X_WEBHOOK_EVENT_ID_INVALID,
                _MESSAGES[ErrorCode.X_WEBHOOK_EVENT_ID_INVALID],
            )
            return
        received = ReceivedWebhook(event_id, verdict.payload, dict(inbound.params))
        try:
            enqueued = await handle.enqueue(received)
        except Exception as exc:
            code = exc.code if isinstance(exc, JobsError) else None
            await self._refused(
                send,
                503,
                ErrorCode.X_WEBHOOK_RECEIVER_UNAVAILABLE,
                _MESSAGES[ErrorCode.X_WEBHOOK_RECEIVER_UNAVAILABLE],
                extra=[(b"retry-after", str(RETRY_AFTER).encode("ascii"))],
                level=logging.ERROR,
                cause=f"{type(exc).__name__}" + (f" {code}" if code else ""),
            )
            return
        await _send(
            send,
            200,
            orjson.dumps({"ok": True, "event_id": event_id, "deduped": enqueued.deduped}),
            _JSON_HEADERS,
        )

    async def _handshake(self, scope: Scope, send: Send, *, head: bool) -> None:
        handshake = self.handle.handshake
        assert handshake is not None
        inbound = self._inbound(scope, b"")
        verdict = await self._ask(send, handshake, inbound, "handshake", (Answer,))
        if verdict is not None:
            await self._answer(send, verdict, head=head)

    async def _ask(
        self,
        send: Send,
        fn: Callable[[Inbound], Any],
        inbound: Inbound,
        what: str,
        answers: tuple[type[Any], ...],
    ) -> Any:
        """What ``fn(inbound)`` (``verify`` or ``handshake``) answers, when it is
        one of ``answers``; otherwise the refusal is sent and ``None`` answered."""
        try:
            verdict = await call(fn, inbound)
        except Exception as exc:
            await self._verify_failed(send, exc)
            return None
        if isinstance(verdict, answers):
            return verdict
        await self._refused(
            send,
            500,
            ErrorCode.X_WEBHOOK_RECEIVER_INVALID,
            _MESSAGES[ErrorCode.X_WEBHOOK_RECEIVER_INVALID],
            level=logging.ERROR,
            cause=f"{what} answered a {type(verdict).__name__}, not "
            + " or ".join(a.__name__ for a in answers),
        )
        return None

    async def _verify_failed(self, send: Send, exc: Exception) -> None:
        code = exc.code if isinstance(exc, JobsError) else None
        if code in _SIGNATURE_CODES:
            assert code is not None
            await self._refused(send, 401, ErrorCode(code), _MESSAGES[ErrorCode(code)])
        elif code in _OWN_FAULT_CODES:
            assert code is not None
            await self._refused(
                send,
                500,
                ErrorCode(code),
                _MESSAGES[ErrorCode(code)],
                level=logging.ERROR,
                cause=f"{type(exc).__name__} {code}",
            )
        else:
            # Never the exception's message: a parser's quotes a piece of the body.
            await self._refused(
                send,
                400,
                ErrorCode.X_WEBHOOK_INVALID,
                _MESSAGES[ErrorCode.X_WEBHOOK_INVALID],
                cause=type(exc).__name__ + (f" {code}" if code else ""),
            )

    async def _answer(self, send: Send, answer: Answer, *, head: bool = False) -> None:
        headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in answer.headers.items()
            if k.lower() != "content-length"
        ]
        await _send(send, answer.status, answer.body, headers, head=head)

    async def _refused(
        self,
        send: Send,
        status: int,
        code: ErrorCode,
        message: str,
        *,
        extra: Sequence[tuple[bytes, bytes]] = (),
        level: int = logging.INFO,
        cause: str | None = None,
    ) -> None:
        emit(
            log,
            level,
            "jobs.webhook.failed" if level >= logging.ERROR else "jobs.webhook.refused",
            receiver=self.handle.name,
            status=status,
            code=str(code),
            cause=cause,
        )
        await _refuse(send, status, code, message, extra=extra)


# --------------------------------------------------------------------------- routing

_PARAM = re.compile(r"\{[^}]*\}")


def receiver_routes(jobs: Jobs) -> list[Route]:
    """One route per receiver among the facade's jobs (``X_WEBHOOK_RECEIVER_INVALID``
    when two claim one path)."""
    routes: list[Route] = []
    seen: dict[str, str] = {}
    for handle in receivers_of(list(jobs.handles.values())):
        shape = _PARAM.sub("{}", handle.path)
        other = seen.get(shape)
        if other is not None:
            raise JobsError(
                ErrorCode.X_WEBHOOK_RECEIVER_INVALID,
                f"receivers {other!r} and {handle.name!r} claim the same path: give one "
                "another path",
            )
        seen[shape] = handle.name
        door = ReceiverDoor(jobs, handle)
        routes.append(Route(handle.path, door, methods=door.methods, name=f"webhook.{handle.name}"))
    return routes


class ReceiverDoors:
    """ASGI middleware: a request a receiver's route matches goes to its door,
    ahead of every middleware inside this one; the rest goes on to ``app``.

    ``shadow`` answers the routes that win over the receivers' (the dashboard's),
    ``None`` for none."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Sequence[Route],
        shadow: Callable[[], Iterable[BaseRoute]] | None = None,
    ) -> None:
        self.app = app
        self.routes = list(routes)
        self.shadow = shadow

    def _door(self, scope: Scope) -> tuple[Route, Scope] | None:
        """The receiver route this request goes to: the first whose path and
        method match, else the first whose path does (its door answers 405),
        unless a ``shadow`` route matches it whole."""
        found: tuple[Route, Scope] | None = None
        for route in self.routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                found = (route, child)
                break
            if match is Match.PARTIAL and found is None:
                found = (route, child)
        if found is None or self.shadow is None:
            return found
        for first in self.shadow():
            if first.matches(scope)[0] is Match.FULL:
                return None
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = self._door(scope)
            if found is not None:
                route, child = found
                door: ReceiverDoor = route.endpoint  # type: ignore[assignment]
                await door({**scope, **child}, receive, send)
                return
        await self.app(scope, receive, send)


def mount_receivers(app: Starlette, jobs: Jobs) -> None:
    """Serve every receiver among ``jobs``' handles from ``app``, an existing
    Starlette app, at its ``path``.

    The receivers answer ahead of the app's routes and middleware (a receiver is
    a public door: the app's auth and session middleware never see its
    requests; its signature is its guard). Call it while setting the app up,
    before it serves its first request (``X_CONFIG_INVALID`` after). Two
    receivers on one path are ``X_WEBHOOK_RECEIVER_INVALID``.

    >>> app = Starlette(routes=[...])
    >>> mount_receivers(app, jobs)
    """
    if not isinstance(app, Starlette):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID, "mount_receivers(app, jobs) takes a Starlette app"
        )
    if not isinstance(jobs, Jobs):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "mount_receivers(app, jobs) takes the facade open_jobs yielded",
        )
    routes = receiver_routes(jobs)
    if not routes:
        return
    try:
        app.add_middleware(ReceiverDoors, routes=routes)
    except RuntimeError:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "mount_receivers(app, jobs) must be called before the app serves its first request",
        ) from None
