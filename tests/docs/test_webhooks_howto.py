"""docs/how-to/send-webhooks.md on PostgreSQL: the page's fan-out job enqueues one
delivery per subscriber of the event's topic, each is POSTed signed to a real
receiver on 127.0.0.1 (the page's webhook with the test-only allow_private=True
it documents), the receiving half verifies them, a failing endpoint is disabled
after disable_after attempts and re-enabled by the page's own function."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ._pages import load_page

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs_support import wait_for
from pg_schemas import throwaway_schema
from webhooks.receiver import open_receiver

PAGE = "docs/how-to/send-webhooks.md"
pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn() -> Iterator[str]:
    with throwaway_schema("tj_docs_hooks") as found:
        yield found


async def test_the_fan_out_delivers_one_signed_post_per_subscriber(dsn: str) -> None:
    from trio_jobs import (
        ErrorCode,
        Retry,
        Worker,
        open_jobs,
        postgres_driver,
        postgres_webhook_ledger,
        webhook,
    )

    page = load_page(PAGE)
    page.deliver = webhook(  # the page's declaration, with the test-only allowance
        name="partner.webhooks",
        tenant=lambda d: d.org_id,
        endpoint=page.endpoint_of,
        event=page.event_of,
        ledger=postgres_webhook_ledger(),
        disable_after=2,
        retry=Retry(attempts=1),
        allow_private=True,
    )
    async with open_receiver() as rx:
        page.ENDPOINTS["e-acme"] = page.Endpoint("e-acme", rx.url("/ok"), "whsec_acme")
        page.ENDPOINTS["e-globex"] = page.Endpoint("e-globex", rx.url("/created"), "whsec_globex")
        page.ENDPOINTS["e-down"] = page.Endpoint("e-down", rx.url("/fail"), "whsec_down")
        page.SUBSCRIPTIONS.extend(
            [
                page.Subscription("e-acme", "acme", "orders.paid"),
                page.Subscription("e-globex", "globex", "orders.paid"),
                page.Subscription("e-down", "initech", "orders.paid"),
                page.Subscription("e-acme", "acme", "orders.refunded"),
            ]
        )
        async with open_jobs(postgres_driver(dsn), jobs=[page.announce, page.deliver]) as jobs:
            worker = Worker(jobs, poll_interval="20ms")
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                for n in (1, 2, 3):
                    page.EVENTS[f"ev{n}"] = page.WebhookEvent(f"ev{n}", "orders.paid", {"n": n})
                    await page.announce.enqueue(page.Announce(f"ev{n}"))
                    # One event at a time: the disable mark is asked before each send,
                    # so deliveries already in flight to one endpoint are not stopped.
                    await wait_for(
                        lambda n=n: _attempts_at_least(page, 3 * n), timeout=30, step=0.05
                    )
                await worker.drain()
            ledger = page.deliver.ledger
            assert await ledger.is_disabled("e-down")
            codes = [a.code for a in await ledger.attempts(endpoint_id="e-down")]
            assert codes == [
                ErrorCode.X_WEBHOOK_DELIVERY_FAILED,
                ErrorCode.X_WEBHOOK_DELIVERY_FAILED,
                ErrorCode.X_WEBHOOK_ENDPOINT_DISABLED,
            ]
            await page.partner_fixed_their_endpoint("e-down")
            assert not await ledger.is_disabled("e-down")
            views = (await jobs.list(name="partner.webhooks")).rows
            assert {v.tenant_id for v in views} == {"acme", "globex", "initech"}
        assert len(rx.to("/fail")) == 2  # the third sent nothing
    to_acme = rx.to("/ok")
    assert [r.headers["x-webhook-id"] for r in to_acme] == ["ev1", "ev2", "ev3"]
    secrets = ["whsec_new", "whsec_acme"]  # mid-rotation: the old secret still verifies
    for r in to_acme:
        assert page.receive(r.headers, r.body, secrets) == r.headers["x-webhook-id"]


async def _attempts_at_least(page: object, n: int) -> bool:
    return len(await page.deliver.ledger.attempts()) >= n  # type: ignore[attr-defined]
