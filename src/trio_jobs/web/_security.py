"""Who may see the dashboard, and proof that a POST came from its own page.

Closed by default: without an ``auth`` hook only a loopback client, talking to
the app directly (no ``Forwarded`` / ``X-Forwarded-For`` / ``X-Real-IP``
header: a reverse proxy on the same host would make every visitor look local),
is served. With a hook, the hook alone decides.

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
from collections.abc import Awaitable, Mapping
from typing import Protocol
from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "Auth",
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
