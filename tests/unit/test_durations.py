"""Durations: ``parse_duration``.

PYTHON-API.md "Names and conventions": durations are accepted as ``"250ms"``,
``"30s"``, ``"1m"``, ``"2h"``, ``"3d"``, ``datetime.timedelta`` or a number of
seconds, and are stored and lifted as float seconds. The spec's fluent surface: a
non-positive ceiling is refused, because ``<= 0`` reads as "no ceiling".
"""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_jobs import ErrorCode, JobsError
from trio_jobs._time import MAX_DURATION, parse_duration

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _attempt(value: object) -> tuple[float | None, JobsError | None]:
    """parse_duration(value), or the JobsError it raised (any other type escapes)."""
    try:
        return parse_duration(value), None
    except JobsError as exc:
        return None, exc


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30.0),
        ("1m", 60.0),
        ("2h", 7200.0),
        ("3d", 259200.0),
        ("1.5s", 1.5),
        ("0.5m", 30.0),
        ("1ms", 0.001),
        (" 30s ", 30.0),
        ("30 s", 30.0),
    ],
)
def test_string_forms(text: str, seconds: float) -> None:
    got = parse_duration(text)
    assert type(got) is float
    assert got == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (timedelta(seconds=30), 30.0),
        (timedelta(milliseconds=250), 0.25),
        (timedelta(days=3), 259200.0),
        (5, 5.0),
        (0.25, 0.25),
        (86400, 86400.0),
    ],
)
def test_timedelta_and_number_forms(value: object, seconds: float) -> None:
    got = parse_duration(value)
    assert type(got) is float
    assert got == seconds


@pytest.mark.parametrize(
    "value",
    [
        "",
        "30",  # a string needs its unit; a bare number is passed as a number
        "s",
        "30x",
        "30 sec",
        "30S",
        "1w",
        "-1s",
        "+1s",
        ".5s",
        "5.s",
        "1e3s",
        "1_000ms",
        "inf s",
        "nans",
        "3d2h",
        "٣s",  # an Arabic-Indic digit: the grammar is ASCII
        "3\u00a0d",
    ],
)
def test_malformed_strings_are_refused(value: str) -> None:
    with pytest.raises(JobsError) as caught:
        parse_duration(value)
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


@pytest.mark.parametrize(
    "value",
    [
        0,
        0.0,
        "0s",
        "0ms",
        timedelta(0),
        -1,
        -0.5,
        timedelta(seconds=-1),
        float("nan"),
        float("inf"),
        float("-inf"),
        10**400,  # too large for a float
        True,
        False,
        None,
        Decimal("1"),
        [1],
        object(),
    ],
    # an id without the object's address: the same on every xdist worker
    ids=lambda v: "object()" if type(v) is object else repr(v),
)
def test_non_durations_and_non_positive_values_are_refused(value: object) -> None:
    with pytest.raises(JobsError) as caught:
        parse_duration(value)
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


def test_the_refusal_names_the_field() -> None:
    with pytest.raises(JobsError, match="step_timeout"):
        parse_duration("soon", field="step_timeout")
    with pytest.raises(JobsError, match=r"timeout.*positive"):
        parse_duration(0, field="timeout")


def test_allow_zero_admits_zero_but_never_a_negative() -> None:
    assert parse_duration(0, allow_zero=True) == 0.0
    assert parse_duration("0s", allow_zero=True) == 0.0
    assert parse_duration(timedelta(0), allow_zero=True) == 0.0
    with pytest.raises(JobsError):
        parse_duration(-1, allow_zero=True)
    with pytest.raises(JobsError):
        parse_duration(float("nan"), allow_zero=True)


# --------------------------------------------------------------------------- properties


@given(n=st.integers(min_value=1, max_value=10**9), unit=st.sampled_from(sorted(UNITS)))
def test_property_whole_strings_scale_by_their_unit(n: int, unit: str) -> None:
    got, refused = _attempt(f"{n}{unit}")
    if n * UNITS[unit] > MAX_DURATION:
        assert refused is not None
        assert "100 years" in refused.message
    else:
        assert got == pytest.approx(n * UNITS[unit])


@given(
    whole=st.integers(min_value=0, max_value=10**6),
    frac=st.integers(min_value=0, max_value=999),
    unit=st.sampled_from(sorted(UNITS)),
)
def test_property_decimal_strings(whole: int, frac: int, unit: str) -> None:
    text = f"{whole}.{frac:03d}{unit}"
    expected = float(f"{whole}.{frac:03d}") * UNITS[unit]
    if expected == 0 or expected > MAX_DURATION:
        with pytest.raises(JobsError):
            parse_duration(text)
    else:
        assert parse_duration(text) == pytest.approx(expected)


@given(st.timedeltas(min_value=timedelta(microseconds=1)))
def test_property_positive_timedeltas_are_their_total_seconds_up_to_a_century(
    value: timedelta,
) -> None:
    got, refused = _attempt(value)
    if value.total_seconds() > MAX_DURATION:
        assert refused is not None
        assert refused.code == ErrorCode.X_CONFIG_INVALID
    else:
        assert got == value.total_seconds()


@given(st.floats(min_value=1e-9, max_value=MAX_DURATION))
def test_property_positive_floats_up_to_a_century_are_themselves(value: float) -> None:
    assert parse_duration(value) == value


@given(st.floats(min_value=MAX_DURATION, exclude_min=True))
def test_property_a_duration_over_a_century_is_refused(value: float) -> None:
    # 1e300 seconds would make `now + delay` an instant no driver can show.
    with pytest.raises(JobsError) as caught:
        parse_duration(value, allow_zero=True)
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


@given(st.integers(min_value=1, max_value=2**1100))
def test_property_positive_ints_are_float_seconds_or_refused(value: int) -> None:
    got, refused = _attempt(value)
    if refused is not None:
        assert refused.code == ErrorCode.X_CONFIG_INVALID
        assert value > MAX_DURATION  # only a number over a century is refused
    else:
        assert got == float(value)


@given(
    st.one_of(
        st.integers(max_value=0), st.floats(max_value=0.0), st.timedeltas(max_value=timedelta(0))
    )
)
def test_property_non_positive_numbers_are_refused(value: object) -> None:
    with pytest.raises(JobsError) as caught:
        parse_duration(value)
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


ANYTHING = st.one_of(
    st.text(),
    st.text(alphabet="0123456789.msdh -+e_"),
    st.integers(),
    st.floats(),
    st.timedeltas(),
    st.booleans(),
    st.none(),
    st.binary(),
    st.lists(st.integers(), max_size=2),
    st.decimals(),
)


@given(ANYTHING)
def test_property_anything_is_a_positive_finite_float_or_x_config_invalid(value: object) -> None:
    got, refused = _attempt(value)
    if refused is not None:
        assert refused.code == ErrorCode.X_CONFIG_INVALID
        return
    assert type(got) is float
    assert math.isfinite(got)
    assert got > 0
    if isinstance(value, str):
        # only the ASCII grammar is accepted: digits, an optional fraction, a unit
        assert value.strip().rstrip("msdh").strip().replace(".", "", 1).isascii()
