"""A real HTTP/1.1 server on 127.0.0.1 for the webhook tests (h11 over Trio
sockets, keep-alive): each path answers as its first segment says.

- ``/ok``: 200; ``/created``: 201
- ``/fail``: 500; ``/reject``: 400; ``/gone``: 410
- ``/redirect``: 302 to ``/ok`` (a client that followed it would show up there)
- ``/throttle``: 429 with ``Retry-After: 2``; ``/busy``: 503 with an HTTP-date
  ``Retry-After`` 3 s after its own ``Date``; ``/throttle-bare``: 429 without one;
  ``/busy-bare``: 503 without one
- ``/slow``: answers after 30 s (a client's timeout ends it first)
- ``/flaky/<n>``: 500 for the first ``n`` requests to that path, then 200
- ``/big``: 200 with a 1 MiB body

Every request is kept (``.requests``: method, path, headers lower-cased, body)
and counted per connection (``.connections``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from email.utils import formatdate

import attrs
import h11
import trio


@attrs.define
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@attrs.define
class Receiver:
    port: int = 0
    requests: list[Seen] = attrs.Factory(list)
    connections: int = 0
    hits: dict[str, int] = attrs.Factory(dict)
    #: The Date the server stamps (epoch seconds); None: the real now.
    date: float | None = None

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def to(self, path: str) -> list[Seen]:
        return [r for r in self.requests if r.path == path]

    def answer(self, path: str) -> tuple[int, list[tuple[str, str]], bytes, float]:
        """(status, headers, body, delay) for a request to ``path``."""
        head = path.split("?")[0].split("/")[1] if "/" in path else path
        self.hits[path] = self.hits.get(path, 0) + 1
        now = self.date if self.date is not None else _wall()
        date = [("date", formatdate(now, usegmt=True))]
        if head == "ok":
            return 200, date, b'{"ok":true}', 0.0
        if head == "created":
            return 201, date, b"", 0.0
        if head == "fail":
            return 500, date, b"boom", 0.0
        if head == "reject":
            return 400, date, b"bad", 0.0
        if head == "gone":
            return 410, date, b"", 0.0
        if head == "redirect":
            return 302, [*date, ("location", self.url("/ok"))], b"", 0.0
        if head == "throttle":
            return 429, [*date, ("retry-after", "2")], b"", 0.0
        if head == "busy":
            return 503, [*date, ("retry-after", formatdate(now + 3, usegmt=True))], b"", 0.0
        if head == "throttle-bare":
            return 429, date, b"", 0.0
        if head == "busy-bare":
            return 503, date, b"", 0.0
        if head == "slow":
            return 200, date, b"", 30.0
        if head == "flaky":
            n = int(path.split("/")[2])
            return (500 if self.hits[path] <= n else 200), date, b"", 0.0
        if head == "big":
            return 200, date, b"x" * (1 << 20), 0.0
        return 404, date, b"", 0.0

    async def serve_one(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request: h11.Request | None = None
                body = b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += bytes(event.data)
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                        return
                assert request is not None
                path = request.target.decode()  # routed without its query
                headers = {k.decode().lower(): v.decode("latin-1") for k, v in request.headers}
                self.requests.append(Seen(request.method.decode(), path, headers, body))
                status, extra, payload, delay = self.answer(path)
                if delay:
                    await trio.sleep(delay)
                head = [(k, v) for k, v in extra] + [("content-length", str(len(payload)))]
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=head)))
                await stream.send_all(conn.send(h11.Data(data=payload)))
                await stream.send_all(conn.send(h11.EndOfMessage()))
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            return
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()


def _wall() -> float:
    import time

    return time.time()


@contextlib.asynccontextmanager
async def open_receiver() -> AsyncIterator[Receiver]:
    """Serve a :class:`Receiver` on 127.0.0.1 (a free port) for the block."""
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, receiver.serve_one, 0, host="127.0.0.1")
        )
        receiver.port = listeners[0].socket.getsockname()[1]
        try:
            yield receiver
        finally:
            nursery.cancel_scope.cancel()
