"""``trio-jobs webhooks``: the webhook ledger: every endpoint with its
consecutive failures and disabled mark, and the newest delivery attempts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .._webhook_ledger import (
    MAX_WEBHOOK_ROWS,
    WebhookAttempt,
    WebhookEndpointState,
    read_webhooks,
)
from ._args import check_webhook_id
from ._common import common_options, guarded
from ._operate import _console, _echo_json, _operate, _table, _text, _when

if TYPE_CHECKING:
    from .._facade import Jobs

__all__ = ["attempt_json", "endpoint_json", "webhooks_command"]


def endpoint_json(row: WebhookEndpointState) -> dict[str, Any]:
    """One endpoint as ``--json`` prints it: the fields of ``WebhookEndpointState``."""
    return {
        "endpoint_id": row.endpoint_id,
        "consecutive_failures": row.consecutive_failures,
        "disabled": row.disabled,
        "disabled_at": row.disabled_at,
        "last_attempt_at": row.last_attempt_at,
    }


def attempt_json(row: WebhookAttempt) -> dict[str, Any]:
    """One attempt as ``--json`` prints it: the fields of ``WebhookAttempt``."""
    return {
        "endpoint_id": row.endpoint_id,
        "event_id": row.event_id,
        "attempt": row.attempt,
        "status": row.status,
        "code": row.code,
        "at": row.at,
        "duration_ms": row.duration_ms,
    }


@click.command("webhooks")
@click.option(
    "--endpoint", "endpoint_id", default=None, metavar="ID", help="Only this endpoint's attempts."
)
@click.option("--event", "event_id", default=None, metavar="ID", help="Only this event's attempts.")
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=click.IntRange(1, MAX_WEBHOOK_ROWS),
    metavar="N",
    help=f"At most this many attempts, newest first (1 to {MAX_WEBHOOK_ROWS}).",
)
@common_options
@guarded
def webhooks_command(
    endpoint_id: str | None,
    event_id: str | None,
    limit: int,
    as_json: bool,
    database_url: str | None,
) -> None:
    """The webhook ledger (postgres_webhook_ledger()): every endpoint a
    webhook() job delivered to, with its consecutive failed attempts and
    whether it is disabled, then the newest delivery attempts with the HTTP
    status each got (none: refused before sending, or no answer) and the code
    it failed with. Re-enabling an endpoint is the app's:
    await ledger.enable(endpoint_id)."""
    check_webhook_id(endpoint_id, "--endpoint")
    check_webhook_id(event_id, "--event")

    async def go(
        jobs: Jobs,
    ) -> tuple[list[WebhookEndpointState], list[WebhookAttempt], float]:
        endpoints, attempts = await read_webhooks(
            jobs, endpoint_id=endpoint_id, event_id=event_id, limit=limit
        )
        return endpoints, attempts, float(jobs.driver.now())

    endpoints, attempts, now = _operate(go, database_url, as_json)
    if as_json:
        _echo_json(
            {
                "endpoints": [endpoint_json(e) for e in endpoints],
                "attempts": [attempt_json(a) for a in attempts],
            }
        )
        return
    if not endpoints:
        click.echo("no webhook attempt yet")
        return
    table = _table(
        f"{len(endpoints)} endpoint(s)",
        ("endpoint", "consecutive failures", "disabled", "last attempt"),
        whole=("endpoint",),
    )
    for e in endpoints:
        table.add_row(
            _text(e.endpoint_id),
            _text(e.consecutive_failures),
            _text(_when(e.disabled_at, now) if e.disabled_at is not None else "no"),
            _text(_when(e.last_attempt_at, now) if e.last_attempt_at is not None else ""),
        )
    _console().print(table)
    if not attempts:
        return
    rows = _table(
        f"{len(attempts)} attempt(s), newest first",
        ("endpoint", "event", "attempt", "status", "code", "at", "ms"),
        whole=("endpoint", "event"),
    )
    for a in attempts:
        rows.add_row(
            _text(a.endpoint_id),
            _text(a.event_id),
            _text(a.attempt),
            _text(a.status if a.status is not None else "-"),
            _text(a.code or ""),
            _text(_when(a.at, now)),
            _text(f"{a.duration_ms:.0f}"),
        )
    _console().print(rows)
