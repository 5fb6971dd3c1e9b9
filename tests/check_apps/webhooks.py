"""An outbound webhook the gate checks: deliveries to a receiver this module
serves on 127.0.0.1 (a thread of its own, so it answers under the gate's
virtual clock too), ``allow_private=True`` for that loopback address. Each
delivery is at least once; the receiver keeps the event ids it was sent, and
the observation is the set of them (a repeat is allowed, a loss is not)."""

from __future__ import annotations

import http.server
import threading
from typing import Any

from trio_jobs import (
    Endpoint,
    Retry,
    WebhookDelivery,
    WebhookEvent,
    memory_webhook_ledger,
    webhook,
)

received: set[str] = set()


class _Hook(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        received.add(self.headers.get("x-webhook-id") or "")
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # a connection the gate's run dropped mid-way: nothing to say


_server = _Server(("127.0.0.1", 0), _Hook)
threading.Thread(target=_server.serve_forever, daemon=True).start()
URL = f"http://127.0.0.1:{_server.server_address[1]}/hook"

deliver = webhook(
    name="app.partner-webhooks",
    tenant="none",
    endpoint=lambda d: Endpoint(d.endpoint_id, URL, "whsec_check"),
    event=lambda d: WebhookEvent(d.event_id, "orders.paid", {"order": d.event_id}),
    ledger=memory_webhook_ledger(),
    allow_private=True,
    retry=Retry(attempts=10),
)

trio_jobs_examples = {
    "app.partner-webhooks": [WebhookDelivery("e1", "ev1"), WebhookDelivery("e2", "ev2")]
}


def trio_jobs_observe() -> list[str]:
    return sorted(received)


def trio_jobs_reset() -> None:
    received.clear()
