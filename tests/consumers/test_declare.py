"""PYTHON-API.md, "Consumers — consumer()": the declaration. Every argument is a
keyword; a missing, forbidden or bad one is ``X_CONSUMER_INVALID`` naming every
fault (never a ``TypeError``); the handle is a ``Job`` with ``kind ==
"consumer"``, the spec's table built in (keyed concurrency 1 ``'wait'``, the key
``consumer:<name>:<key>``, no timeout), and its supervisor task and arm job
registered wherever it is listed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_jobs import ErrorCode, Job, JobsError, Retry, consumer, open_jobs
from trio_jobs._consumer import Consumer
from trio_jobs.drivers import memory_driver


def fields(**over: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": "sync-orders",
        "keys": lambda: ["acct-1"],
        "open": lambda key, cursor, signal: [],
        "handle": lambda batch: "",
        "load_cursor": lambda key, tx: None,
        "save_cursor": lambda key, cursor, tx: None,
    }
    out.update(over)
    return out


def refused(**over: Any) -> list[str]:
    with pytest.raises(JobsError) as caught:
        consumer(**fields(**over))
    assert caught.value.code == ErrorCode.X_CONSUMER_INVALID
    faults = caught.value.meta["faults"]
    assert isinstance(faults, list)
    assert all(f in caught.value.message for f in faults)
    return faults


def test_the_handle_is_a_job_of_kind_consumer_with_the_table_built_in() -> None:
    handle = consumer(**fields(retry=Retry(attempts=5), queue="integrations"))
    assert isinstance(handle, Consumer)
    assert isinstance(handle, Job)
    assert handle.kind == "consumer"
    assert handle.name == "sync-orders"
    assert handle.queue == "integrations"
    assert handle.retry.attempts == 5
    # one running body per key: concurrency keyed, limit 1, 'wait'
    assert handle.concurrency == 1
    assert handle.when_busy == "wait"
    assert handle.concurrency_key_for("acct-1") == "acct-1"
    # one live row per key
    assert handle.idempotency_key_for("acct-1") == "consumer:sync-orders:acct-1"
    # no timeout
    assert handle.timeout is None
    assert handle.step_timeout is None
    described = handle.describe()
    assert described["kind"] == "consumer"
    assert described["concurrency"] == {"limit": 1, "keyed": True, "when_busy": "wait"}
    assert described["consumer"]["rearm"] == "1m"
    assert described["consumer"]["batch"] == 100


def test_the_supervisor_task_and_the_arm_job_come_with_it() -> None:
    handle = consumer(**fields(rearm="15m", queue="q1"))
    assert handle.supervisor.name == "sync-orders.supervisor"
    assert handle.supervisor.kind == "task"
    assert handle.supervisor.cron == "*/15 * * * *"
    assert handle.supervisor.tz == "UTC"
    assert handle.supervisor.queue == "q1"
    assert handle.arm_job.name == "sync-orders.arm"
    assert handle.arm_job.queue == "q1"
    hourly = consumer(**fields(name="hourly", rearm="60m"))
    assert hourly.supervisor.cron == "0 * * * *"


async def test_listing_the_consumer_registers_its_companions(autojump_clock: Any) -> None:
    handle = consumer(**fields())
    async with open_jobs(memory_driver(), jobs=[handle]) as jobs:
        assert set(jobs.handles) == {"sync-orders", "sync-orders.supervisor", "sync-orders.arm"}
        assert jobs.handles["sync-orders.supervisor"] is handle.supervisor


def test_every_fault_is_named_in_one_refusal() -> None:
    faults = refused(
        load_cursor=None,
        save_cursor=_MISSING_SENTINEL,
        timeout="30s",
        batch=0,
        rearm="7m",
        tenant="acme",
    )
    text = " | ".join(faults)
    assert "load_cursor= is required" in text
    assert "save_cursor must be a function" in text
    assert "timeout= is refused" in text
    assert "batch must be a whole number" in text
    assert "rearm must be whole minutes dividing an hour" in text
    assert "tenant must be 'none' or a function of the key" in text
    assert len(faults) == 6


_MISSING_SENTINEL = "not a function"


def test_positional_missing_forbidden_and_unknown_arguments_are_jobs_errors() -> None:
    with pytest.raises(JobsError) as caught:
        consumer("sync-orders")  # type: ignore[misc]
    assert caught.value.code == ErrorCode.X_CONSUMER_INVALID
    assert "keyword arguments only" in caught.value.message
    assert "name= is required" in caught.value.message
    assert "handle= is required" in caught.value.message
    with pytest.raises(JobsError) as caught:
        consumer()
    assert caught.value.code == ErrorCode.X_CONSUMER_INVALID
    for what in ("name", "keys", "open", "handle", "load_cursor", "save_cursor"):
        assert f"{what}= is required" in caught.value.message
    for forbidden in ("timeout", "step_timeout", "concurrency", "idempotency_key"):
        assert any(f.startswith(f"{forbidden}= is refused") for f in refused(**{forbidden: 1}))
    assert refused(colour="red") == ["unknown argument(s): colour"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10", None])
def test_batch_must_be_a_whole_number_of_one_or_more(bad: Any) -> None:
    assert refused(batch=bad) == [
        "batch must be a whole number, 1 or more (the most items per batch)"
    ]


@pytest.mark.parametrize(
    "good",
    ["1m", "2m", "3m", "4m", "5m", "6m", "10m", "12m", "15m", "20m", "30m", "60m", 300, "1h"],
)
def test_rearm_takes_whole_minutes_dividing_an_hour(good: Any) -> None:
    assert consumer(**fields(rearm=good)).rearm * 60 in (
        60,
        120,
        180,
        240,
        300,
        360,
        600,
        720,
        900,
        1200,
        1800,
        3600,
    )


@pytest.mark.parametrize("bad", ["30s", "90s", "7m", "45m", "2h", 0, -60, "soon", None, True])
def test_a_bad_rearm_is_refused(bad: Any) -> None:
    [fault] = refused(rearm=bad)
    assert fault.startswith("rearm must be whole minutes dividing an hour")


@given(st.integers(min_value=-10_000, max_value=10_000))
def test_rearm_in_seconds_is_accepted_exactly_when_it_is_whole_minutes_dividing_an_hour(
    seconds: int,
) -> None:
    ok = 0 < seconds <= 3600 and seconds % 60 == 0 and 60 % (seconds // 60) == 0
    try:
        handle = consumer(**fields(rearm=seconds))
    except JobsError as exc:
        assert exc.code == ErrorCode.X_CONSUMER_INVALID
        assert not ok
    else:
        assert ok
        assert handle.rearm == seconds // 60


def test_callables_of_the_wrong_shape_are_refused() -> None:
    faults = refused(
        keys=lambda account: [account],
        open=lambda key: [],
        handle=lambda: "",
        load_cursor=lambda key: None,
        save_cursor=lambda key, cursor: None,
        lag=lambda: 0,
    )
    assert [f.split(" ", 1)[0] for f in faults] == [
        "keys",
        "open",
        "handle",
        "load_cursor",
        "save_cursor",
        "lag",
    ]
    assert all("must take" in f for f in faults)


def test_job_faults_join_the_refusal() -> None:
    faults = refused(queue="bad queue!", retry=Retry(attempts=0), name="x" * 190)
    text = " | ".join(faults)
    assert "queue must be" in text
    assert "retry.attempts" in text
    assert "name must be a non-empty string of at most 189 characters" in text


def test_tenant_is_none_or_a_function_of_the_key() -> None:
    handle = consumer(**fields(tenant=lambda key: key.split("/")[0]))
    assert handle.tenant_of("acme/acct-1") == "acme"
    assert consumer(**fields()).tenant_of("acct-1") is None
