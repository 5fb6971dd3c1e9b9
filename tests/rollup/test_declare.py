"""PYTHON-API.md, "Data jobs": ``rollup()``, ``refresh_view()`` and ``Bucket``
refused at declaration with ``X_JOB_ROLLUP_INVALID`` / ``X_JOB_REFRESH_VIEW_INVALID``
naming every fault (never a TypeError), the defaults the spec settles (input
``None``, the idempotency key, ``tenant="none"`` for a view), the kinds, and the
codes classified terminal."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_jobs import Bucket, ErrorCode, JobsError, refresh_view, rollup
from trio_jobs.errors import retry_class_of


def ok_rollup(**over: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": "signups.daily",
        "into": "daily_signups",
        "key": ["org_id", "day"],
        "lookback": "2d",
        "bucket": Bucket("day", "Europe/Paris"),
        "source": lambda tx, since, input: [],
        "map": lambda point, input: {},
    }
    fields.update(over)
    return fields


def refused(factory: Any, code: ErrorCode, **fields: Any) -> list[str]:
    with pytest.raises(JobsError) as info:
        factory(**fields)
    assert info.value.code == code
    faults: list[str] = info.value.meta["faults"]
    return faults


def test_a_rollup_is_a_job_of_kind_rollup_with_the_settled_defaults() -> None:
    handle = rollup(**ok_rollup())
    assert handle.kind == "rollup"
    assert handle.name == "signups.daily"
    assert handle.idempotency_key_for(None) == "signups.daily:null"
    assert handle.tenant_of(None) is None


@attrs.frozen
class Org:
    org_id: str


def test_the_default_key_is_the_name_plus_the_inputs_json_form() -> None:
    handle = rollup(**ok_rollup(input=Org, tenant=lambda i: i.org_id))
    assert handle.idempotency_key_for(Org("o-1")) == 'signups.daily:{"org_id":"o-1"}'
    assert handle.tenant_of(Org("o-1")) == "o-1"
    mine = rollup(**ok_rollup(input=Org, idempotency_key=lambda i: f"mine:{i.org_id}"))
    assert mine.idempotency_key_for(Org("o-1")) == "mine:o-1"


def test_a_refresh_view_is_a_job_of_kind_refresh_view_with_no_tenant() -> None:
    handle = refresh_view(name="totals.refresh", view="post_totals", concurrently=True)
    assert handle.kind == "refresh-view"
    assert handle.idempotency_key_for(None) == "totals.refresh:null"
    assert handle.tenant_of(None) is None
    with pytest.raises(JobsError) as info:
        refresh_view(name="x", view="v", tenant=lambda _: "t")  # type: ignore[call-arg]
    assert info.value.code == ErrorCode.X_JOB_REFRESH_VIEW_INVALID
    assert "unknown field(s): tenant" in info.value.message


def test_every_rollup_fault_is_named_in_one_refusal() -> None:
    faults = refused(
        rollup,
        ErrorCode.X_JOB_ROLLUP_INVALID,
        name="",
        into=3,
        key="day",
        lookback=-1,
        bucket="day",
        source=lambda tx: [],
        map=None,
        colour="red",
    )
    text = "; ".join(faults)
    for part in (
        "unknown field(s): colour",
        "name must be a non-empty string",
        "into must be the name of the table",
        "key must be a non-empty list of column names",
        "lookback",
        "bucket must be a Bucket(unit, tz)",
        "source must take 3 arguments",
        "map= is required",
    ):
        assert part in text, part
    assert len(faults) == 8


def test_a_rollup_with_nothing_names_every_required_field() -> None:
    faults = refused(rollup, ErrorCode.X_JOB_ROLLUP_INVALID)
    for field in ("name", "into", "key", "lookback", "bucket", "source", "map"):
        assert any(f.startswith(f"{field}= is required") for f in faults), field


@pytest.mark.parametrize("lookback", [0, -5, "0s", "-2d", "2 days", timedelta(0), True, "nan"])
def test_a_lookback_that_is_not_a_positive_duration_is_refused(lookback: Any) -> None:
    faults = refused(rollup, ErrorCode.X_JOB_ROLLUP_INVALID, **ok_rollup(lookback=lookback))
    assert len(faults) == 1
    assert faults[0].startswith("lookback")


@pytest.mark.parametrize("lookback", ["90m", "2d", 3600, timedelta(hours=6)])
def test_a_positive_lookback_is_accepted(lookback: Any) -> None:
    assert rollup(**ok_rollup(lookback=lookback)).kind == "rollup"


@pytest.mark.parametrize("key", [[], ["day", "day"], ["day", ""], [1], "day", None])
def test_a_bad_key_is_refused(key: Any) -> None:
    faults = refused(rollup, ErrorCode.X_JOB_ROLLUP_INVALID, **ok_rollup(key=key))
    assert len(faults) == 1
    assert faults[0].startswith("key")


def test_job_options_faults_join_the_rollups_own() -> None:
    faults = refused(
        rollup,
        ErrorCode.X_JOB_ROLLUP_INVALID,
        **ok_rollup(queue="bad queue!", tenant="everyone", into=None),
    )
    assert any(f.startswith("queue must") for f in faults)
    assert any(f.startswith("tenant must") for f in faults)
    assert any(f.startswith("into= is required") for f in faults)


def test_a_bucket_names_a_bad_unit_and_a_bad_zone_together() -> None:
    with pytest.raises(JobsError) as info:
        Bucket("fortnight", "Mars/Olympus_Mons")
    assert info.value.code == ErrorCode.X_JOB_ROLLUP_INVALID
    assert len(info.value.meta["faults"]) == 2
    assert "'fortnight' is not one of minute, hour, day, week, month, quarter, year" in (
        info.value.message
    )
    assert "'Mars/Olympus_Mons' is not an IANA zone name" in info.value.message


@pytest.mark.parametrize("tz", ["", "+02:00", "CET-1CEST", "../etc/passwd", "Europe/Paris\x00", 3])
def test_a_zone_that_is_not_iana_is_refused(tz: Any) -> None:
    with pytest.raises(JobsError) as info:
        Bucket("day", tz)
    assert info.value.code == ErrorCode.X_JOB_ROLLUP_INVALID
    assert "bucket zone" in info.value.message


@given(st.text(max_size=12))
def test_any_unit_outside_the_list_is_refused(unit: str) -> None:
    if unit in ("minute", "hour", "day", "week", "month", "quarter", "year"):
        assert Bucket(unit, "UTC").unit == unit
        return
    with pytest.raises(JobsError) as info:
        Bucket(unit, "UTC")
    assert info.value.code == ErrorCode.X_JOB_ROLLUP_INVALID


def test_a_bucket_defaults_to_utc_and_compares_by_unit_and_zone() -> None:
    assert Bucket("hour") == Bucket("hour", "UTC")
    assert Bucket("hour", "Asia/Kolkata") != Bucket("hour", "UTC")
    assert repr(Bucket("day", "Europe/Paris")) == "Bucket(unit='day', tz='Europe/Paris')"


def test_every_refresh_view_fault_is_named_in_one_refusal() -> None:
    faults = refused(
        refresh_view,
        ErrorCode.X_JOB_REFRESH_VIEW_INVALID,
        name=None,
        view="",
        concurrently="yes",
        retry=3,
    )
    text = "; ".join(faults)
    assert "name= is required" in text
    assert "view must be the name of the materialized view" in text
    assert "concurrently must be True or False" in text
    assert "retry" in text
    assert len(faults) == 4


def test_both_codes_are_terminal() -> None:
    assert retry_class_of(ErrorCode.X_JOB_ROLLUP_INVALID) == "terminal"
    assert retry_class_of(ErrorCode.X_JOB_REFRESH_VIEW_INVALID) == "terminal"
