"""The app the webhook tests deliver for: its endpoints and events tables, a
``webhook()`` over them, and a worker that runs it (real time: the receiver is
a real server on 127.0.0.1)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs

from jobs_support import running_worker, wait_state
from trio_jobs import (
    Endpoint,
    JobView,
    Retry,
    WebhookDelivery,
    WebhookEvent,
    memory_webhook_ledger,
    open_jobs,
    webhook,
)
from trio_jobs.drivers.memory import memory_driver

SECRET = "whsec_test_0123456789abcdef"


@attrs.define
class App:
    endpoints: dict[str, Endpoint] = attrs.Factory(dict)
    events: dict[str, WebhookEvent] = attrs.Factory(dict)
    endpoint_reads: int = 0
    event_reads: int = 0

    def endpoint(self, d: WebhookDelivery) -> Endpoint | None:
        self.endpoint_reads += 1
        return self.endpoints.get(d.endpoint_id)

    async def event(self, d: WebhookDelivery) -> WebhookEvent | None:
        self.event_reads += 1
        return self.events.get(d.event_id)

    def add(self, endpoint_id: str, url: str, **over: Any) -> Endpoint:
        found = Endpoint(endpoint_id, url, over.pop("secret", SECRET), **over)
        self.endpoints[endpoint_id] = found
        return found

    def publish(self, event_id: str, topic: str = "orders.paid", body: Any = None) -> WebhookEvent:
        found = WebhookEvent(event_id, topic, {"order": 42} if body is None else body)
        self.events[event_id] = found
        return found


def make(app: App, **over: Any) -> Any:
    fields: dict[str, Any] = {
        "name": "partner.webhooks",
        "tenant": "none",
        "endpoint": app.endpoint,
        "event": app.event,
        "ledger": memory_webhook_ledger(),
        "allow_private": True,  # the receiver is on 127.0.0.1 (test-only allowance)
        "timeout": "5s",
        "retry": Retry(attempts=3, base="10ms", max_delay="50ms", jitter=False),
    }
    fields.update(over)
    return webhook(**fields)


@contextlib.asynccontextmanager
async def running(*handles: Any, driver: Any = None) -> AsyncIterator[Any]:
    """A facade over ``handles`` (memory driver unless given) with a worker."""
    async with (
        open_jobs(driver if driver is not None else memory_driver(), jobs=list(handles)) as jobs,
        running_worker(jobs, poll_interval=0.01),
    ):
        yield jobs


async def settle(jobs: Any, job_id: str) -> JobView:
    return await wait_state(jobs, job_id, "done", "dead", "failed", "cancelled", timeout=30)
