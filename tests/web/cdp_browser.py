"""A small, synchronous Chrome DevTools Protocol client over ``--remote-debugging-pipe``.

It drives Debian's ``chromium`` (nothing downloaded, no websocket library):
the browser reads CDP messages on fd 3 and writes them on fd 4, each a JSON
object ended by a NUL byte. Enough for the dashboard's end-to-end tests:
navigate, evaluate, click a button (accepting a ``confirm()``), screenshot.

Run it in a thread (``trio.to_thread.run_sync``): the app under test is served
by the Trio thread meanwhile.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["Browser", "chromium_path", "open_browser"]

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--mute-audio",
    "--password-store=basic",
    "--force-device-scale-factor=1",
    "--remote-debugging-pipe",
)


def chromium_path() -> str | None:
    """Debian's chromium (``apt-get install chromium``), or ``$CHROMIUM``."""
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """One headless browser with one page (a flattened CDP session)."""

    def __init__(self, binary: str, *, width: int = 1280, height: int = 900) -> None:
        self._profile = tempfile.mkdtemp(prefix="trio-jobs-chromium-")
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # Park the child's ends above 10 so the dup2 onto 3 and 4 cannot clobber them.
        child_in = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        child_out = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def wire() -> None:  # runs in the child, before exec
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                *FLAGS,
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire,
            pass_fds=(3, 4),
        )
        os.close(child_in)
        os.close(child_out)
        self._w = to_child_w
        self._r = from_child_r
        self._buf = b""
        self._next = 0
        self._events: list[dict[str, Any]] = []
        self.dialogs: list[str] = []
        self.width, self.height = width, height
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    # ------------------------------------------------------------------ protocol

    def _write(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            n = os.write(self._w, data)
            data = data[n:]

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError("timed out waiting for the browser")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 16)
                if not chunk:
                    raise CDPError("the browser closed its pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        if message.get("method") == "Page.javascriptDialogOpening":
            # Accept every confirm(): the test clicked the button on purpose.
            self.dialogs.append(message["params"].get("message", ""))
            self._write(
                {
                    "id": self._bump(),
                    "method": "Page.handleJavaScriptDialog",
                    "params": {"accept": True},
                    "sessionId": message.get("sessionId"),
                }
            )
        return message

    def _bump(self) -> int:
        self._next += 1
        return self._next

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float = 20.0,
    ) -> dict[str, Any]:
        ident = self._bump()
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._write(message)
        deadline = time.monotonic() + timeout
        while True:
            got = self._read(deadline)
            if got.get("id") == ident:
                if "error" in got:
                    raise CDPError(f"{method}: {got['error']}")
                result: dict[str, Any] = got.get("result", {})
                return result
            if "method" in got:
                self._events.append(got)

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call(method, params, session=self.session)

    def wait_event(self, method: str, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for index, event in enumerate(self._events):
                if event.get("method") == method:
                    del self._events[index]
                    return event
            got = self._read(deadline)
            if "method" in got:
                self._events.append(got)

    # ------------------------------------------------------------------ page

    def goto(self, url: str) -> None:
        self._events.clear()
        result = self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CDPError(f"navigating to {url}: {result['errorText']}")
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise CDPError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def text(self, selector: str = "body") -> str:
        return str(
            self.evaluate(
                f"(document.querySelector({json.dumps(selector)}) || {{}}).innerText || ''"
            )
        )

    def status_of(self, url: str) -> int:
        """The HTTP status of ``url`` as fetched by the page (same origin)."""
        return int(
            self.evaluate(
                f"fetch({json.dumps(url)}, {{credentials: 'same-origin'}}).then(r => r.status)"
            )
        )

    def click_and_wait(self, selector: str) -> None:
        """Click the element (a form's submit button) and wait for the next page."""
        self._events.clear()
        found = self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
            " if (!el) return false; el.click(); return true; })()"
        )
        if not found:
            raise CDPError(f"nothing matches {selector}")
        self.wait_event("Page.loadEventFired")

    def screenshot(self, path: str | os.PathLike[str], *, full_page: bool = True) -> bytes:
        height = self.height
        if full_page:
            metrics = self.send("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
            height = max(self.height, min(int(size.get("height", self.height)), 6000))
            self.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": self.width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
        shot = self.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "clip": {"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1},
            },
        )
        if full_page:
            self.send(
                "Emulation.setDeviceMetricsOverride",
                {
                    "width": self.width,
                    "height": self.height,
                    "deviceScaleFactor": 1,
                    "mobile": False,
                },
            )
        data = base64.b64decode(shot["data"])
        with open(path, "wb") as out:
            out.write(data)
        return data

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)


@contextlib.contextmanager
def open_browser(binary: str, **options: Any) -> Iterator[Browser]:
    browser = Browser(binary, **options)
    try:
        yield browser
    finally:
        browser.close()
