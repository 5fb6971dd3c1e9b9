"""The outbound webhook's SSRF guard and its HTTP client (the httpx seam).

A webhook POSTs to a URL the app's data names, so a URL is untrusted input: a
host that is or resolves to a loopback, private, link-local, shared (CGNAT),
multicast, unspecified, reserved or cloud-metadata address is refused with
``X_WEBHOOK_ENDPOINT_INVALID`` before any byte is sent. The check runs twice:

- on the URL's host when it is an address literal, in every spelling
  ``inet_aton`` accepts (``127.1``, ``0x7f.1``, ``2130706433``, ``017700000001``)
  and every IPv6 form that embeds an IPv4 one (IPv4-mapped, -compatible, NAT64,
  6to4, Teredo), so a refused literal never reaches the resolver;
- **at connect time**, in the network backend httpcore connects through
  (:func:`guarded_backend`): the name is resolved once, *every* address it
  resolves to is checked, and the connection goes to a checked address. A name
  that resolves to a public address for a check and to a private one a moment
  later (DNS rebinding) cannot slip through: nothing resolves it again. TLS is
  still started with the URL's host name (httpcore passes the origin's host as
  ``server_hostname``: SNI and certificate checks unchanged) and the ``Host``
  header is the URL's.

Redirects are never followed (a 3xx is an answer, and following it would
re-POST a body signed for one host to wherever the receiver named) and the
environment's proxy settings are ignored (a proxy would resolve the name on its
side of the guard).

One :class:`httpx.AsyncClient` per Trio run and guard mode (a ``RunVar``): its
pool keeps connections alive across deliveries and slots. A client is never
shared with asyncio code.

This module is the one place that knows httpx's and httpcore's names; a test
(``tests/webhooks/test_http_seam.py``) pins each one it relies on.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import trio

from .errors import ErrorCode, JobsError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "EndpointRefused",
    "address_fault",
    "check_url",
    "client_for",
    "post",
    "guarded_backend",
    "resolve_checked",
    "literal_address",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Cloud metadata services, by address (AWS, GCP and Azure share the first;
#: ECS task metadata; AWS over IPv6; Alibaba; Oracle).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "100.100.100.200",
        "192.0.0.192",
    )
)
#: Names that answer cloud metadata (or this machine) wherever they resolve.
METADATA_NAMES = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_V4_COMPAT = ipaddress.ip_network("::/96")

#: The longest endpoint URL taken (longer is refused, never truncated).
MAX_URL = 2048


class EndpointRefused(Exception):
    """Raised by the guarded backend in place of a connection: the host resolved
    to a refused address. ``reason`` names the kind of address, never the URL."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------- addresses


def _part(text: str) -> int | None:
    """One part of an ``inet_aton`` spelling: decimal, ``0x`` hex or ``0`` octal."""
    if not text:
        return None
    lowered = text.lower()
    try:
        if lowered.startswith("0x"):
            return int(lowered[2:], 16) if len(lowered) > 2 else None
        if len(lowered) > 1 and lowered.startswith("0"):
            return int(lowered[1:], 8)
        return int(lowered, 10) if lowered.isdigit() else None
    except ValueError:
        return None


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``inet_aton`` reads ``text`` as (1 to 4 parts; the last
    fills the bytes left), or ``None`` when it is no such spelling."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(re.fullmatch(r"[0-9a-fA-FxX]+", p) for p in parts):
        return None
    values = [_part(p) for p in parts]
    if any(v is None for v in values):
        return None
    nums: list[int] = [v for v in values if v is not None]
    head, last = nums[:-1], nums[-1]
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    value = 0
    for v in head:
        value = value << 8 | v
    value = value << (8 * (4 - len(head))) | last
    return ipaddress.IPv4Address(value)


def literal_address(host: str) -> IPAddress | None:
    """The address a URL host spells, in any spelling a resolver would accept
    for a literal (see the module docstring), or ``None`` for a name."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    # A zone id (fe80::1%eth0, percent-encoded in a URL) does not change the address.
    text = text.replace("%25", "%").split("%", 1)[0]
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            return None
    return _inet_aton(text)


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64 or ip in _NAT64_LOCAL or (ip in _V4_COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_fault(ip: IPAddress) -> str | None:
    """Why a webhook may not connect to ``ip`` (a short noun phrase), or ``None``
    when it is a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return "an IPv4-mapped IPv6 address"
        inner = _embedded_v4(ip)
        if inner is not None:
            fault = address_fault(inner)
            if fault is not None:
                return f"{fault} (embedded in an IPv6 address)"
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "a shared (CGNAT) address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved or not ip.is_global:
        return "a reserved address"
    return None


def _refused(endpoint_id: str, why: str, *, fix: str) -> JobsError:
    return JobsError(
        ErrorCode.X_WEBHOOK_ENDPOINT_INVALID,
        f"endpoint {endpoint_id!r}: {why}; nothing was sent ({fix})",
        meta={"endpoint_id": endpoint_id},
    )


#: URLs that passed :func:`check_url`, by (url, allow_private): the check is a
#: pure function of the two (no name is resolved here; that happens at connect
#: time), so an endpoint's URL is parsed once, not once per delivery. Bounded:
#: cleared when full.
_CHECKED: dict[tuple[str, bool], httpx.URL] = {}
MAX_CHECKED = 4096


def check_url(endpoint_id: str, url: object, *, allow_private: bool) -> httpx.URL:
    """The endpoint's URL, parsed and checked before any connection: ``https``
    (``http`` too under ``allow_private``), a host, no credentials, and, unless
    ``allow_private``, no refused address literal or name. The URL itself never
    appears in the error (a path may carry a token). A URL that passed is
    remembered (:data:`_CHECKED`); a refused one is checked again each time."""
    if isinstance(url, str):
        known = _CHECKED.get((url, allow_private))
        if known is not None:
            return known
    parsed = _check_url(endpoint_id, url, allow_private=allow_private)
    if len(_CHECKED) >= MAX_CHECKED:
        _CHECKED.clear()
    _CHECKED[(url, allow_private)] = parsed  # type: ignore[index]  # a str: _check_url said so
    return parsed


def _check_url(endpoint_id: str, url: object, *, allow_private: bool) -> httpx.URL:
    import httpx

    fix = "point the endpoint at a public https:// URL"
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise _refused(
            endpoint_id, f"its url must be a string of 1 to {MAX_URL} characters", fix=fix
        )
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise _refused(endpoint_id, "its url holds a space or a control character", fix=fix)
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        raise _refused(endpoint_id, "its url does not parse", fix=fix) from None
    schemes = ("https", "http") if allow_private else ("https",)
    if parsed.scheme not in schemes:
        raise _refused(
            endpoint_id,
            "its url must be https:// (http:// only with allow_private=True, for development)",
            fix=fix,
        )
    if not parsed.host:
        raise _refused(endpoint_id, "its url has no host", fix=fix)
    if parsed.userinfo:
        raise _refused(
            endpoint_id,
            "its url carries credentials (user:password@); the signature authenticates a delivery",
            fix="drop the credentials from the url",
        )
    if not allow_private:
        host = parsed.host.lower()
        literal = literal_address(host)
        if literal is not None:
            fault = address_fault(literal)
            if fault is not None:
                raise _refused(endpoint_id, f"its host is {fault}", fix=fix)
        elif host.rstrip(".") in METADATA_NAMES:
            raise _refused(
                endpoint_id, "its host names this machine or a metadata service", fix=fix
            )
    return parsed


# --------------------------------------------------------------------------- the network backend


async def resolve_checked(host: str, port: int) -> list[str]:
    """The checked addresses ``host`` resolves to, in the resolver's order;
    :class:`EndpointRefused` when one of them is refused (or none is found)."""
    literal = literal_address(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        if host.lower().rstrip(".") in METADATA_NAMES:
            raise EndpointRefused("a name of this machine or of a metadata service")
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        except OSError:
            raise EndpointRefused("a name that does not resolve") from None
        addresses = []
        for info in infos:
            ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            if ip not in addresses:
                addresses.append(ip)
    if not addresses:
        raise EndpointRefused("a name that resolves to no address")
    for ip in addresses:
        fault = address_fault(ip)
        if fault is not None:
            raise EndpointRefused(fault)
    return [str(ip) for ip in addresses]


@functools.cache
def _backend_class() -> type[Any]:
    import httpcore

    class GuardedBackend(httpcore.AsyncNetworkBackend):
        """httpcore's network backend with the guard at connect time: resolve
        once, check every address, connect to a checked one. ``guard=False``
        (the ``allow_private=True`` mode) connects as Trio's backend does."""

        def __init__(self, *, guard: bool) -> None:
            self._inner = httpcore.TrioBackend()
            self._guard = guard

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Iterable[Any] | None = None,
        ) -> Any:
            if not self._guard:
                return await self._inner.connect_tcp(
                    host, port, timeout, local_address, socket_options
                )
            last: Exception | None = None
            for address in await resolve_checked(host, port):
                try:
                    return await self._inner.connect_tcp(
                        address, port, timeout, local_address, socket_options
                    )
                except Exception as exc:  # the next checked address, if any
                    last = exc
            assert last is not None
            raise last

        async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
            raise EndpointRefused("a unix socket")

        async def sleep(self, seconds: float) -> None:
            await self._inner.sleep(seconds)

    return GuardedBackend


def guarded_backend(*, guard: bool) -> Any:
    """An httpcore network backend that checks every address it connects to
    (``guard=True``), or Trio's own (``guard=False``)."""
    return _backend_class()(guard=guard)


# --------------------------------------------------------------------------- the transport and client


@functools.cache
def _transport_class() -> type[Any]:
    import httpcore
    import httpx

    class ResponseStream(httpx.AsyncByteStream):
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for part in self._stream:
                yield part

        async def aclose(self) -> None:
            close = getattr(self._stream, "aclose", None)
            if close is not None:
                await close()

    class GuardedTransport(httpx.AsyncBaseTransport):
        """httpx's transport over an httpcore pool that connects through
        :func:`guarded_backend` (HTTP/1.1, keep-alive, no proxy)."""

        def __init__(self, *, guard: bool) -> None:
            self.pool = httpcore.AsyncConnectionPool(
                ssl_context=httpx.create_ssl_context(),
                max_connections=None,
                max_keepalive_connections=256,
                keepalive_expiry=30.0,
                http1=True,
                http2=False,
                network_backend=guarded_backend(guard=guard),
            )

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            assert isinstance(request.stream, httpx.AsyncByteStream)
            sent = httpcore.Request(
                method=request.method,
                url=httpcore.URL(
                    scheme=request.url.raw_scheme,
                    host=request.url.raw_host,
                    port=request.url.port,
                    target=request.url.raw_path,
                ),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            )
            answer = await self.pool.handle_async_request(sent)
            return httpx.Response(
                status_code=answer.status,
                headers=answer.headers,
                stream=ResponseStream(answer.stream),
                extensions=answer.extensions,
            )

        async def aclose(self) -> None:
            await self.pool.aclose()

    return GuardedTransport


_clients: trio.lowlevel.RunVar[dict[bool, tuple[httpx.AsyncClient, Any]]] = trio.lowlevel.RunVar(
    "trio_jobs_webhook_clients"
)


def _client_and_transport(guard: bool) -> tuple[httpx.AsyncClient, Any]:
    try:
        clients = _clients.get()
    except LookupError:
        clients = {}
        _clients.set(clients)
    pair = clients.get(guard)
    if pair is None:
        import httpx

        transport = _transport_class()(guard=guard)
        client = httpx.AsyncClient(
            transport=transport,
            follow_redirects=False,
            trust_env=False,
            timeout=None,
        )
        pair = clients[guard] = (client, transport)
    return pair


def client_for(*, guard: bool) -> httpx.AsyncClient:
    """This Trio run's client for the guard mode (made on first use): no
    redirects, no environment proxies, no timeout of its own (the delivery's
    ``timeout`` bounds the attempt and the request inside it). Its transport
    (and so its pool of kept-alive connections) is the one :func:`post` sends
    through."""
    return _client_and_transport(guard)[0]


async def post(
    url: httpx.URL, headers: list[tuple[bytes, bytes]], body: bytes, *, guard: bool, cap: int
) -> tuple[int, list[tuple[bytes, bytes]]]:
    """POST ``body`` to ``url`` through this run's client's pool (its guarded
    backend, its kept-alive connections) and answer the status and the answer's
    headers; at most ``cap`` bytes of the answer are read (the rest is dropped
    with its connection). ``headers`` are sent as given, after ``Host`` (the
    URL's) and ``Content-Length``.

    The client's own request layer (cookies, auth, redirects, event hooks: none
    of which a delivery uses) is skipped: a delivery is one request the
    transport sends as the client would, so per-delivery cost stays with the
    connection and not with the models around it."""
    import httpcore

    transport = _client_and_transport(guard)[1]
    sent = httpcore.Request(
        b"POST",
        httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
        headers=[(b"host", url.netloc), (b"content-length", b"%d" % len(body)), *headers],
        content=body,
    )
    answer = await transport.pool.handle_async_request(sent)
    try:
        seen = 0
        async for chunk in answer.stream:
            seen += len(chunk)
            if seen > cap:
                break  # the rest is dropped with the connection
    finally:
        await answer.stream.aclose()
    return answer.status, answer.headers
