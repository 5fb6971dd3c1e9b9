"""``postgres_webhook_ledger()`` on a real PostgreSQL (migration 0012): one row
per attempt, the endpoint's consecutive failures and disabled mark written by
the same statement, ``enable`` the app's, and the same behaviour as the memory
ledger for the same sequence of attempts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pg_schemas import throwaway_schema
from trio_jobs import (
    ErrorCode,
    JobsError,
    Retry,
    WebhookAttempt,
    WebhookDelivery,
    memory_webhook_ledger,
    open_jobs,
    postgres_driver,
    postgres_webhook_ledger,
)
from trio_jobs.drivers.memory import memory_driver

from .receiver import open_receiver
from .support import App, make, running, settle

pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn() -> Iterator[str]:
    with throwaway_schema("tj_hook") as found:
        yield found


def _attempt(endpoint: str, event: str, n: int, status: int | None, code: str | None, at: float):
    return WebhookAttempt(endpoint, event, n, status, code, at, 1.5)


SEQUENCE = [
    _attempt("e1", "ev1", 1, 500, ErrorCode.X_WEBHOOK_DELIVERY_FAILED, 10.0),
    _attempt("e1", "ev1", 2, 429, ErrorCode.X_WEBHOOK_DELIVERY_THROTTLED, 11.0),  # not counted
    _attempt("e1", "ev1", 3, 400, ErrorCode.X_WEBHOOK_DELIVERY_REJECTED, 12.0),
    _attempt("e2", "ev1", 1, 200, None, 12.5),
    _attempt("e1", "ev2", 1, None, ErrorCode.X_WEBHOOK_DELIVERY_FAILED, 13.0),  # disables (3)
    _attempt("e1", "ev3", 1, 200, None, 14.0),  # a late 2xx does not re-enable
]


async def test_the_postgres_ledger_matches_the_memory_ledger(dsn: str) -> None:
    async with open_jobs(postgres_driver(dsn), jobs=[]) as jobs:
        pg = postgres_webhook_ledger(jobs.driver)
        mem = memory_webhook_ledger()
        answers = []
        for ledger in (pg, mem):
            answers.append([await ledger.record(a, disable_after=3) for a in SEQUENCE])
        assert answers[0] == answers[1] == [False, False, False, False, True, True]
        for ledger in (pg, mem):
            assert await ledger.is_disabled("e1")
            assert not await ledger.is_disabled("e2")
            assert not await ledger.is_disabled("nobody")
        assert await pg.endpoints() == await mem.endpoints()
        [e1, _e2] = await pg.endpoints()
        assert (e1.endpoint_id, e1.disabled, e1.disabled_at, e1.last_attempt_at) == (
            "e1",
            True,
            13.0,
            14.0,
        )
        # A 2xx (a send that raced the disabling) resets the count, never the mark.
        assert e1.consecutive_failures == 0
        assert await pg.attempts() == await mem.attempts() == SEQUENCE
        assert await pg.attempts(endpoint_id="e1", event_id="ev1") == SEQUENCE[:3]
        assert await pg.attempts(event_id="ev1", limit=2) == SEQUENCE[2:4]
        await pg.enable("e1")
        await mem.enable("e1")
        assert not await pg.is_disabled("e1")
        assert await pg.endpoints() == await mem.endpoints()
        with pytest.raises(JobsError) as bad:
            await pg.attempts(limit=0)
        assert bad.value.code == ErrorCode.X_INVARIANT


async def test_a_webhook_on_postgres_records_disables_and_is_re_enabled(dsn: str) -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/fail"))
        app.publish("ev1")
        app.publish("ev2")
        ledger = postgres_webhook_ledger()  # unbound: the run's driver
        deliver = make(app, ledger=ledger, disable_after=2, retry=Retry(attempts=2, base="10ms"))
        async with running(deliver, driver=postgres_driver(dsn)) as jobs:
            first = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
            second = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev2"))).id)
            assert first.error_code == ErrorCode.X_WEBHOOK_DELIVERY_FAILED
            assert second.error_code == ErrorCode.X_WEBHOOK_ENDPOINT_DISABLED
            assert len(rx.to("/fail")) == 2
            # Outside a run, the unbound ledger reads through the ambient facade.
            rows = await ledger.attempts(endpoint_id="e1")
            assert [(a.event_id, a.attempt, a.status) for a in rows] == [
                ("ev1", 1, 500),
                ("ev1", 2, 500),
                ("ev2", 1, None),
            ]
            assert await ledger.is_disabled("e1")
            await ledger.enable("e1")
            app.add("e1", rx.url("/ok"))
            app.publish("ev3")
            done = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev3"))).id)
            assert done.state == "done"
            [state] = await ledger.endpoints()
            assert (state.consecutive_failures, state.disabled) == (0, False)


async def test_the_postgres_ledger_refuses_another_driver() -> None:
    async with open_jobs(memory_driver(), jobs=[]):
        with pytest.raises(JobsError) as refused:
            await postgres_webhook_ledger().attempts()
    assert refused.value.code == ErrorCode.X_CONFIG_INVALID
    assert "memory_webhook_ledger()" in refused.value.message


def test_the_webhooks_command_prints_the_ledger(dsn: str) -> None:
    import orjson
    import trio
    from click.testing import CliRunner

    from trio_jobs.cli import main

    async def fill() -> None:
        async with open_jobs(postgres_driver(dsn), jobs=[]) as jobs:
            ledger = postgres_webhook_ledger(jobs.driver)
            for a in SEQUENCE:
                await ledger.record(a, disable_after=3)

    trio.run(fill)
    out = CliRunner().invoke(main, ["webhooks", "--json", "--database-url", dsn])
    assert out.exit_code == 0, out.output
    body = orjson.loads(out.output)
    assert [e["endpoint_id"] for e in body["endpoints"]] == ["e1", "e2"]
    assert body["endpoints"][0]["disabled"] is True
    assert body["endpoints"][0]["disabled_at"] == 13.0
    assert [(a["event_id"], a["attempt"], a["status"]) for a in body["attempts"]] == [
        (a.event_id, a.attempt, a.status) for a in reversed(SEQUENCE)
    ]
    one = CliRunner().invoke(main, ["webhooks", "--json", "--event", "ev2", "--database-url", dsn])
    assert [a["code"] for a in orjson.loads(one.output)["attempts"]] == [
        ErrorCode.X_WEBHOOK_DELIVERY_FAILED
    ]
    text = CliRunner().invoke(main, ["webhooks", "--database-url", dsn])
    assert text.exit_code == 0
    assert "e1" in text.output
    assert "X_WEBHOOK_DELIVERY_REJECTED" in text.output


def test_the_webhooks_command_refuses_bad_arguments_before_any_io() -> None:
    from click.testing import CliRunner

    from trio_jobs.cli import main

    url = "postgresql://nobody@127.0.0.1:1/none"
    out = CliRunner().invoke(main, ["webhooks", "--limit", "0", "--database-url", url, "--json"])
    assert out.exit_code != 0
    assert "X_CONFIG_INVALID" in out.output
    out = CliRunner().invoke(main, ["webhooks", "--endpoint", "", "--database-url", url, "--json"])
    assert out.exit_code != 0
    assert "X_CONFIG_INVALID" in out.output
