"""A tiny ASGI client that calls an app directly from Trio.

Starlette's TestClient runs the app on asyncio, where the facade (and the
PostgreSQL driver) cannot run: this one awaits ``app(scope, receive, send)`` in
the test's own Trio task, so the app runs exactly as Hypercorn's Trio worker
would run it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlencode, urlsplit

import attrs

__all__ = ["AsgiClient", "Reply"]


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    cookies: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @property
    def location(self) -> str:
        return self.headers.get("location", "")

    def csrf(self) -> str:
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', self.text)
        assert found, "the page carries no CSRF token"
        return found.group(1)


class AsgiClient:
    """Keeps cookies like a browser; ``client`` is the peer address the app sees,
    ``host`` the ``Host`` header it sends (``None``: none), ``server`` the
    address the app is served on (ASGI's ``server``)."""

    def __init__(
        self,
        app: Any,
        *,
        client: tuple[str, int] = ("127.0.0.1", 50000),
        root_path: str = "",
        host: str | None = "localhost",
        server: tuple[str, int] | None = ("127.0.0.1", 80),
    ) -> None:
        self.app = app
        self.client = client
        self.root_path = root_path
        self.host = host
        self.server = server
        self.cookies: dict[str, str] = {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        form: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> Reply:
        split = urlsplit(path)
        raw_headers = [] if self.host is None else [(b"host", self.host.encode())]
        if self.cookies:
            jar = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            raw_headers.append((b"cookie", jar.encode()))
        if form is not None:
            body = urlencode(form).encode()
            raw_headers.append((b"content-type", b"application/x-www-form-urlencoded"))
        for key, value in (headers or {}).items():
            raw_headers.append((key.lower().encode(), value.encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": self.root_path + split.path,
            "raw_path": (self.root_path + split.path).encode(),
            "root_path": self.root_path,
            "query_string": split.query.encode(),
            "headers": raw_headers,
            "client": self.client,
            "server": self.server,
        }
        chunks = [body or b""]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if chunks:
                return {"type": "http.request", "body": chunks.pop(), "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        headers_out: dict[str, str] = {}
        cookies: dict[str, str] = {}
        for key, value in start["headers"]:
            name, text = key.decode().lower(), value.decode()
            if name == "set-cookie":
                parsed: SimpleCookie = SimpleCookie()
                parsed.load(text)
                for morsel in parsed.values():
                    cookies[morsel.key] = morsel.value
                    self.cookies[morsel.key] = morsel.value
            headers_out[name] = text
        payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return Reply(start["status"], headers_out, cookies, payload)

    async def get(self, path: str, **kw: Any) -> Reply:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, form: Mapping[str, str] | None = None, **kw: Any) -> Reply:
        return await self.request("POST", path, form=form, **kw)
