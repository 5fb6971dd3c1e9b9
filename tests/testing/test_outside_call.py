"""A real call out of the seeded simulation (``outside_call``): virtual time
stands still while it is in flight, so a receiver's real latency is not read as
the simulation's jumps (which would time every delivery out), and the seed's
trace does not depend on how slow the outside world was."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from trio_jobs import (
    Endpoint,
    Retry,
    WebhookDelivery,
    WebhookEvent,
    job,
    memory_webhook_ledger,
    outside_call,
    webhook,
)
from trio_jobs.testing import simulate_jobs


class _Slow(http.server.ThreadingHTTPServer):
    daemon_threads = True
    delay = 0.0
    received: list[str]

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None


class _Hook(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Slow

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        time.sleep(self.server.delay)  # the outside world's latency, in real time
        self.server.received.append(self.headers.get("x-webhook-id") or "")
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def receiver() -> Iterator[_Slow]:
    server = _Slow(("127.0.0.1", 0), _Hook)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _hook(url: str, name: str) -> Any:
    return webhook(
        name=name,
        tenant="none",
        endpoint=lambda d: Endpoint(d.endpoint_id, url, "whsec_sim"),
        event=lambda d: WebhookEvent(d.event_id, "orders.paid", {"order": d.event_id}),
        ledger=memory_webhook_ledger(),
        allow_private=True,
        timeout="2s",
        retry=Retry(attempts=3),
    )


async def test_a_slow_receiver_is_answered_at_the_same_virtual_instant(receiver: _Slow) -> None:
    """0.3 s of real latency per POST: without the hold the workers' heartbeats and
    polls jump the clock past the 2 s timeout while the answer is on its way."""
    receiver.delay = 0.3
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    deliver = _hook(url, "app.slow-hook")
    inputs = [WebhookDelivery("e1", "ev1"), WebhookDelivery("e1", "ev2")]
    result = await simulate_jobs(jobs=[deliver], seed=3, scenario=[(deliver, i) for i in inputs])
    assert [(v.state, v.attempts) for v in result.world.jobs] == [("done", 1)] * 2
    assert sorted(receiver.received) == ["ev1", "ev2"]
    receiver.received.clear()
    receiver.delay = 0.05
    again = await simulate_jobs(jobs=[deliver], seed=3, scenario=[(deliver, i) for i in inputs])
    assert again.trace_bytes() == result.trace_bytes()  # latency is not in the trace


async def test_an_overrunning_call_lets_time_move_after_its_limit() -> None:
    """A call that outlives its limit stops holding the clock: the body's own
    virtual timeout fires then, so a hung peer cannot hang the simulation."""
    outcomes: list[str] = []
    release = threading.Event()

    @job(
        name="app.hung-peer",
        tenant="none",
        idempotency_key=lambda i: "hung",
        retry=Retry(attempts=1),
    )
    async def hung(ctx: Any) -> None:
        with trio.move_on_after(5) as scope:
            async with outside_call(0.2):
                await trio.to_thread.run_sync(release.wait, abandon_on_cancel=True)
        outcomes.append("timed out" if scope.cancelled_caught else "answered")

    started = time.monotonic()
    try:
        await simulate_jobs(jobs=[hung], seed=1, scenario=[(hung, None)])
    finally:
        release.set()
    assert outcomes == ["timed out"]
    assert time.monotonic() - started < 30


async def test_outside_the_simulation_it_changes_nothing() -> None:
    async with outside_call(0.0):
        await trio.sleep(0.01)  # Trio's own clock: no hold, no error
