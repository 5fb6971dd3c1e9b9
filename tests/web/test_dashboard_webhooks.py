"""The dashboard's webhooks page: the ledger of the facade's webhook jobs, each
endpoint's consecutive failures and disabled mark, each attempt, values escaped."""

from __future__ import annotations

from typing import Any

from asgi_client import AsgiClient

from trio_jobs import (
    ErrorCode,
    WebhookAttempt,
    memory_driver,
    memory_webhook_ledger,
    open_jobs,
    webhook,
)
from trio_jobs.web import create_app


async def test_the_webhooks_page_lists_endpoints_and_attempts(autojump_clock: Any) -> None:
    ledger = memory_webhook_ledger()
    deliver = webhook(
        name="partner.webhooks",
        tenant="none",
        endpoint=lambda d: None,
        event=lambda d: None,
        ledger=ledger,
    )
    async with open_jobs(memory_driver(), jobs=[deliver]) as jobs:
        client = AsgiClient(create_app(jobs))
        empty = (await client.get("/webhooks")).text
        now = jobs.driver.now()
        failed = ErrorCode.X_WEBHOOK_DELIVERY_FAILED
        for n in (1, 2):
            await ledger.record(
                WebhookAttempt("<b>e1</b>", "ev1", n, 500, failed, now - 60, 12.0), disable_after=2
            )
        await ledger.record(
            WebhookAttempt("e2", "ev1", 1, 200, None, now - 30, 8.0), disable_after=2
        )
        page = await client.get("/webhooks")
        overview = (await client.get("/")).text
    assert "No webhook attempt yet." in empty
    assert page.status == 200
    html = page.text
    assert "&lt;b&gt;e1&lt;/b&gt;" in html
    assert "<b>e1</b>" not in html
    assert '<td class="num">2</td><td><span class="badge s-disabled">disabled</span>' in html
    assert '<td class="mono">e2</td><td class="num">0</td><td><span class="muted">no</span>' in html
    assert f"<code>{failed}</code>" in html
    assert '<td class="num">500</td>' in html
    assert '<td class="num">200</td>' in html
    assert html.index('<td class="mono">e2</td><td class="mono">ev1</td>') < html.index(
        '&lt;b&gt;e1&lt;/b&gt;</td><td class="mono">ev1</td>'
    )  # attempts newest first
    assert '<a href="/webhooks" class="">Webhooks</a>' in overview


async def test_without_a_ledger_the_page_says_so(autojump_clock: Any) -> None:
    async with open_jobs(memory_driver(), jobs=[]) as jobs:
        page = await AsgiClient(create_app(jobs)).get("/webhooks")
    assert "X_NOT_IMPLEMENTED" in page.text
