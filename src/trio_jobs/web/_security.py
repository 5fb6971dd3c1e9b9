"""Who may see the dashboard, and proof that a POST came from its own page.

Closed by default: without an ``auth`` hook only a loopback client, talking to
the app directly (no ``Forwarded`` / ``X-Forwarded-For`` / ``X-Real-IP``
header: a reverse proxy on the same host would make every visitor look local),
is served. With a hook, the hook alone decides who.

Which name the request was sent to is checked first, before the hook, the
cookie or the body (:class:`HostGuard`): a page on a rebinding domain
(``evil.example`` resolving to 127.0.0.1) reaches a loopback server from the
victim's own browser, as a loopback client, and only its ``Host`` gives it
away. Without an allow-list only ``localhost`` or a loopback address, on the
port the app is served on, is answered; ``allowed_hosts`` (with an auth hook)
names the others.

CSRF: a signed double-submit cookie. The cookie holds a random value; every
form carries ``HMAC(secret, value)``; a POST is served only when the two agree
(and, when the browser sends ``Origin`` or ``Sec-Fetch-Site``, only when they
say same-origin). A page on another site can neither read the cookie nor mint
the token.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import ipaddress
import secrets
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import attrs
from starlette.requests import Request

from ..errors import ErrorCode, JobsError

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "Auth",
    "HostGuard",
    "HostRules",
    "host_rules",
    "is_loopback_client",
    "is_loopback_host",
    "new_cookie_value",
    "new_secret",
    "same_origin",
    "token_for",
    "token_ok",
]


class Auth(Protocol):
    """The hook ``create_app(jobs, auth=...)`` takes: given the Starlette request,
    answer (or await) ``True`` to serve it; anything else is a 403.

    >>> def is_operator(request):
    ...     return request.headers.get("authorization") == f"Bearer {OPS_TOKEN}"
    """

    def __call__(self, request: Request) -> bool | Awaitable[bool]: ...


#: The cookie holding the random half of the signed double-submit CSRF token.
CSRF_COOKIE = "trio_jobs_csrf"
#: The form field every dashboard action carries: ``HMAC(secret, cookie)``.
CSRF_FIELD = "csrf"
_PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


def new_secret() -> bytes:
    # A process-local signing key: tokens stop verifying on restart, which costs
    # an operator one reload. Pass create_app(secret=...) to share one.
    return secrets.token_bytes(32)


def new_cookie_value() -> str:
    return secrets.token_urlsafe(32)


def token_for(secret: bytes, cookie_value: str) -> str:
    return hmac.new(secret, cookie_value.encode("ascii", "replace"), hashlib.sha256).hexdigest()


def token_ok(secret: bytes, cookie_value: str | None, token: str | None) -> bool:
    if not cookie_value or not token:
        return False
    return hmac.compare_digest(token_for(secret, cookie_value), token)


def is_loopback_host(host: str) -> bool:
    """Whether binding ``host`` only listens on this machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_loopback_client(client: tuple[str, int] | None, headers: Mapping[str, str]) -> bool:
    """A loopback peer that is not a proxy relaying someone else."""
    if client is None:
        return False
    if any(h in headers for h in _PROXY_HEADERS):
        return False
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def same_origin(headers: Mapping[str, str]) -> bool:
    """What the browser says about where a POST came from, when it says anything."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = headers.get("host")
    return host is not None and urlsplit(origin).netloc.lower() == host.lower()


async def allowed(request: Request, auth: Auth | None) -> bool:
    if auth is None:
        return is_loopback_client(request.scope.get("client"), request.headers)
    verdict = auth(request)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    return verdict is True


# --------------------------------------------------------------------------- Host


@attrs.frozen
class _Pattern:
    """One ``allowed_hosts`` entry: a name (``suffix``: any subdomain of it), and
    the port it must carry (``None``: any)."""

    name: str
    port: int | None
    suffix: bool = False

    def matches(self, name: str, port: int) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.suffix:
            return name.endswith("." + self.name)
        return name == self.name


@attrs.frozen
class HostRules:
    """Which ``Host`` values the app answers. ``patterns is None``: the loopback
    rule (``localhost`` or a loopback address, on the served port when the
    server says which); ``any_host``: every name (``"*"``, given explicitly)."""

    patterns: tuple[_Pattern, ...] | None = None
    any_host: bool = False

    def allows(self, host: str | None, scheme: str, served_port: int | None) -> bool:
        parsed = split_host(host, scheme)
        if parsed is None:
            return False
        if self.any_host:
            return True
        name, port = parsed
        if self.patterns is None:
            return is_loopback_name(name) and (served_port is None or port == served_port)
        return any(p.matches(name, port) for p in self.patterns)


#: The most characters of one Host value (a DNS name is at most 253).
_MAX_HOST = 300
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._")


def split_host(value: str | None, scheme: str = "http") -> tuple[str, int] | None:
    """A ``Host`` header as ``(name, port)``, lowercased, the port defaulting to
    the scheme's; ``None`` when it is missing or not a host (``[v6]:port`` for
    an IPv6 literal)."""
    if not value or len(value) > _MAX_HOST:
        return None
    value = value.lower()
    default = 443 if scheme in ("https", "wss") else 80
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        name = "[" + name + "]"
    else:
        name, colon, port_text = value.partition(":")
        rest = colon + port_text
        if not name or not set(name) <= _NAME_CHARS:
            return None
    if not rest:
        return name, default
    port_text = rest[1:]
    if rest[0] != ":" or not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5:
        return None
    port = int(port_text)
    if not 0 < port <= 65535:
        return None
    return name, port


def is_loopback_name(name: str) -> bool:
    """Whether a ``Host`` name (as :func:`split_host` answers it) can only mean
    this machine: ``localhost`` or a loopback address literal."""
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def _pattern(entry: str) -> _Pattern:
    bad = JobsError(
        ErrorCode.X_CONFIG_INVALID,
        "each allowed_hosts entry is a host name or address, optionally with a port "
        '("jobs.example.com", "jobs.example.com:8443", "10.0.0.5", "[2001:db8::1]:8765"), '
        '"*.example.com" for any subdomain, or "*" alone for any host; no scheme, path or '
        "spaces",
    )
    if not isinstance(entry, str):
        raise bad
    suffix = entry.startswith("*.")
    parsed = split_host(entry[2:] if suffix else entry)
    if parsed is None or "*" in entry[2 if suffix else 0 :]:
        raise bad
    name, port = parsed
    explicit = entry.endswith(f":{port}") and not entry.endswith("]")
    return _Pattern(name, port if explicit else None, suffix)


def host_rules(allowed_hosts: Iterable[str] | None, *, has_auth: bool) -> HostRules:
    """The :class:`HostRules` of ``create_app(allowed_hosts=...)``, or
    ``X_CONFIG_INVALID`` saying what is wrong (nothing is served meanwhile).

    ``None``: the loopback rule. A list takes effect only with an auth hook:
    without one only loopback names are ever answered."""
    if allowed_hosts is None:
        return HostRules()
    if isinstance(allowed_hosts, str | bytes) or not isinstance(allowed_hosts, Iterable):
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            'allowed_hosts takes a list of host names, e.g. ["jobs.example.com"], not a string',
        )
    entries = list(allowed_hosts)
    if not has_auth:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "allowed_hosts needs an auth hook: without one the dashboard answers only "
            "localhost and loopback addresses (pass auth=, or drop allowed_hosts)",
        )
    if not entries:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "allowed_hosts is empty: name at least one host, or leave it out for the loopback rule",
        )
    if "*" in entries:
        return HostRules(any_host=True)
    return HostRules(patterns=tuple(_pattern(e) for e in entries))


def _refusal(rules: HostRules) -> bytes:
    if rules.patterns is None and not rules.any_host:
        return (
            b"400 Bad Request: this dashboard answers only to localhost or a loopback address "
            b"(127.0.0.1, [::1]) on the port it is served on. Open it by that address; to "
            b"serve it under another name, configure an auth hook and allowed_hosts.\n"
        )
    return (
        b"400 Bad Request: this dashboard does not answer to that host name. Add it to "
        b"allowed_hosts if it is yours.\n"
    )


class HostGuard:
    """ASGI middleware: a request whose ``Host`` the rules do not allow is
    answered ``400`` with a plain message before the app sees it (nothing is
    read or written). Lifespan and other scopes pass through."""

    def __init__(self, app: Any, rules: HostRules) -> None:
        self.app = app
        self.rules = rules

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host: str | None = None
        for key, value in scope.get("headers", ()):
            if key == b"host":
                if host is not None:  # two Host headers: ambiguous, refused
                    host = None
                    break
                host = value.decode("latin-1")
        server = scope.get("server")
        port = server[1] if isinstance(server, tuple | list) and len(server) == 2 else None
        if self.rules.allows(host, str(scope.get("scheme", "http")), port):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = _refusal(self.rules)
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                    (b"x-content-type-options", b"nosniff"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
