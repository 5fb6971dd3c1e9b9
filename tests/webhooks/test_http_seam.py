"""The httpx/httpcore names ``_webhook_guard.py`` relies on (STYLE.md: a test
pins every outside name a seam uses), with the signatures it calls them by."""

from __future__ import annotations

import inspect

import httpcore
import httpx


def test_the_httpcore_names_the_guard_uses() -> None:
    for name in ("AsyncNetworkBackend", "TrioBackend", "AsyncConnectionPool", "Request", "URL"):
        assert name in httpcore.__all__
    params = inspect.signature(httpcore.AsyncConnectionPool).parameters
    for name in (
        "ssl_context",
        "max_connections",
        "max_keepalive_connections",
        "keepalive_expiry",
        "http1",
        "http2",
        "network_backend",
    ):
        assert name in params
    connect = inspect.signature(httpcore.AsyncNetworkBackend.connect_tcp).parameters
    assert list(connect) == ["self", "host", "port", "timeout", "local_address", "socket_options"]
    assert callable(httpcore.AsyncConnectionPool.handle_async_request)


def test_the_httpx_names_the_guard_uses() -> None:
    for name in (
        "AsyncBaseTransport",
        "AsyncByteStream",
        "AsyncClient",
        "Response",
        "URL",
        "InvalidURL",
        "create_ssl_context",
    ):
        assert name in httpx.__all__
    params = inspect.signature(httpx.AsyncClient).parameters
    for name in ("transport", "follow_redirects", "trust_env", "timeout"):
        assert name in params
    url = httpx.URL("https://partner.example:8443/hook?x=1")
    assert (url.raw_scheme, url.raw_host, url.port, url.raw_path) == (
        b"https",
        b"partner.example",
        8443,
        b"/hook?x=1",
    )
