"""``Bucket.start``: the first instant of the bucket holding an instant, found on
the zone's wall clock, DST included (Jobs-And-Workflows.md, "Rollups": "in its
zone, DST included, so the first bucket upserted whole is read whole"). Pinned
by hand at the edges, then held against PostgreSQL's own ``date_trunc(unit, ts,
tz)`` (how a source groups its points) across every change of five zones."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pg_schemas import base_dsn
from trio_jobs import Bucket, ErrorCode, JobsError

PARIS = ZoneInfo("Europe/Paris")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("unit", "tz", "at", "start"),
    [
        # Paris, spring: the day of 2026-03-29 is 23 h long and starts at 00:00 CET
        ("day", "Europe/Paris", utc(2026, 3, 29, 21, 59), utc(2026, 3, 28, 23)),
        # Paris, autumn: the day of 2026-10-25 is 25 h long and starts at 00:00 CEST
        ("day", "Europe/Paris", utc(2026, 10, 25, 22, 59), utc(2026, 10, 24, 22)),
        # the first instant of the next day is its own start
        ("day", "Europe/Paris", utc(2026, 10, 25, 23), utc(2026, 10, 25, 23)),
        # the hour after the spring change: 03:00 CEST is one instant after 02:00 CET
        ("hour", "Europe/Paris", utc(2026, 3, 29, 1, 30), utc(2026, 3, 29, 1)),
        # the repeated hour of autumn: each pass is a bucket (02:30 CEST, then 02:30 CET)
        ("hour", "Europe/Paris", utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 0)),
        ("hour", "Europe/Paris", utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 1)),
        # a 30-minute offset: Kolkata's day and hour start on the half hour in UTC
        ("day", "Asia/Kolkata", utc(2026, 1, 1, 18, 29), utc(2025, 12, 31, 18, 30)),
        ("day", "Asia/Kolkata", utc(2026, 1, 1, 18, 30), utc(2026, 1, 1, 18, 30)),
        ("hour", "Asia/Kolkata", utc(2026, 1, 1, 0, 10), utc(2025, 12, 31, 23, 30)),
        # Santiago skips midnight (2022-09-11 00:00 -04 -> 01:00 -03): the day starts at the change
        ("day", "America/Santiago", utc(2022, 9, 11, 12), utc(2022, 9, 11, 4)),
        # Lord Howe moves by 30 minutes: 02:00 +10:30 -> 02:30 +11 on 2026-10-04
        ("hour", "Australia/Lord_Howe", utc(2026, 10, 3, 15, 45), utc(2026, 10, 3, 15, 30)),
        # and back (2026-04-05 02:00 +11 -> 01:30 +10:30): the hour 01:xx +10:30 is cut
        # short, it starts at the change
        ("hour", "Australia/Lord_Howe", utc(2026, 4, 4, 15, 10), utc(2026, 4, 4, 15)),
        ("week", "Europe/Paris", utc(2026, 3, 29, 12), utc(2026, 3, 22, 23)),  # Monday 23rd
        ("month", "Europe/Paris", utc(2026, 3, 31, 22, 30), utc(2026, 3, 31, 22)),  # April
        ("quarter", "Europe/Paris", utc(2026, 6, 30, 12), utc(2026, 3, 31, 22)),
        ("year", "Asia/Kolkata", utc(2026, 6, 1), utc(2025, 12, 31, 18, 30)),
        ("minute", "UTC", utc(2026, 6, 1, 12, 34, 56), utc(2026, 6, 1, 12, 34)),
    ],
)
def test_the_start_of_the_bucket_holding_an_instant(
    unit: str, tz: str, at: datetime, start: datetime
) -> None:
    got = Bucket(unit, tz).start(at)
    # timestamps: an aware datetime in a repeated hour never equals another zone's
    assert got.timestamp() == start.timestamp()
    assert got.tzinfo == ZoneInfo(tz)  # answered in the bucket's zone
    assert got <= at


@pytest.mark.parametrize("unit", ["minute", "hour", "day"])
def test_an_instant_given_in_the_zone_itself_is_the_same_instant(unit: str) -> None:
    # 02:20 CET, the second pass of the repeated hour, given as a Paris datetime (fold=1)
    at = datetime.fromtimestamp(utc(2026, 10, 25, 1, 20).timestamp(), PARIS)
    assert at.fold == 1
    bucket = Bucket(unit, "Europe/Paris")
    assert bucket.start(at).timestamp() == bucket.start(at.astimezone(UTC)).timestamp()
    assert bucket.start(at) <= at


def test_a_start_in_the_skipped_hour_is_read_as_the_change_itself() -> None:
    got = Bucket("day", "America/Santiago").start(utc(2022, 9, 11, 12))
    assert (got.hour, got.minute, got.utcoffset()) == (1, 0, timedelta(hours=-3))


def test_start_takes_an_aware_datetime_only() -> None:
    with pytest.raises(JobsError) as info:
        Bucket("day").start(datetime(2026, 1, 1))  # noqa: DTZ001 - the refused case
    assert info.value.code == ErrorCode.X_INVARIANT


@given(
    unit=st.sampled_from(["minute", "hour", "day", "week", "month", "quarter", "year"]),
    tz=st.sampled_from(["UTC", "Europe/Paris", "Asia/Kolkata", "America/Santiago"]),
    at=st.datetimes(
        min_value=datetime(2000, 1, 1),  # noqa: DTZ001 - hypothesis bounds are naive
        max_value=datetime(2037, 1, 1),  # noqa: DTZ001
        timezones=st.just(UTC),
    ),
    local=st.booleans(),
)
# a day whose midnight Santiago skipped: its bucket starts at 01:00 -03
@example(
    unit="day", tz="America/Santiago", at=datetime(2000, 10, 15, 10, 18, tzinfo=UTC), local=False
)
@example(
    unit="day", tz="America/Santiago", at=datetime(2000, 10, 15, 10, 18, tzinfo=UTC), local=True
)
def test_a_start_is_at_or_before_the_instant_and_starts_its_own_bucket(
    unit: str, tz: str, at: datetime, local: bool
) -> None:
    bucket = Bucket(unit, tz)
    if local:  # the same instant, given in the bucket's zone
        at = datetime.fromtimestamp(at.timestamp(), ZoneInfo(tz))
    start = bucket.start(at)
    # Compared as instants: two datetimes in one zone compare (and subtract) on
    # their wall clocks, and a wall clock skips and repeats at a change.
    assert start.timestamp() <= at.timestamp()
    assert bucket.start(start).timestamp() == start.timestamp()
    # the instant before it is in an earlier bucket (a step back in UTC: one on
    # the wall clock from 01:00 on a day whose midnight was skipped lands in the
    # skipped hour, which is read as after the change)
    before = start.astimezone(UTC) - timedelta(microseconds=1)
    assert bucket.start(before).timestamp() < start.timestamp()


# ---------------------------------------------------------------- against date_trunc

ZONES = [
    "Europe/Paris",
    "Asia/Kolkata",
    "America/Santiago",
    "Australia/Lord_Howe",
    "America/Havana",
]
UNITS = ["minute", "hour", "day", "week", "month"]


def _around_changes(tz: str) -> list[datetime]:
    """Every 10 minutes for 30 hours around each change of ``tz`` in 2022-2026
    (for a zone with none, such as Kolkata's: around each new year)."""
    zone = ZoneInfo(tz)
    changes: list[datetime] = []
    t = utc(2022, 1, 1)
    while t < utc(2027, 1, 1):
        nxt = t + timedelta(hours=1)
        if t.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            changes.append(t)
        t = nxt
    if not changes:
        changes = [utc(year, 1, 1) for year in range(2022, 2027)]
    base = [c - timedelta(hours=15) for c in changes]
    return [b + timedelta(minutes=10 * i, seconds=7) for b in base for i in range(180)]


@pytest.fixture(scope="module")
def pg() -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(base_dsn(), autocommit=True) as conn:
        yield conn


@pytest.mark.postgres
@pytest.mark.parametrize("tz", ZONES)
def test_since_is_where_date_trunc_starts_the_bucket_across_every_change(
    pg: psycopg.Connection[tuple[object, ...]], tz: str
) -> None:
    """For every instant near a change and every unit: ``date_trunc`` gives the
    bucket's start the same bucket as the instant (every row from ``since`` on
    that falls in the instant's bucket is read), and the microsecond before it
    another (``since`` is that bucket's first instant)."""
    ats = _around_changes(tz)
    assert len(ats) >= 180 * 5
    for unit in UNITS:
        bucket = Bucket(unit, tz)
        starts = [bucket.start(at) for at in ats]
        rows = pg.execute(
            """
            SELECT date_trunc(%(unit)s, a, %(tz)s) = date_trunc(%(unit)s, s, %(tz)s),
                   date_trunc(%(unit)s, s - interval '1 microsecond', %(tz)s)
                       <> date_trunc(%(unit)s, a, %(tz)s)
            FROM unnest(%(ats)s::timestamptz[], %(starts)s::timestamptz[]) AS u(a, s)
            """,
            {"unit": unit, "tz": tz, "ats": ats, "starts": starts},
        ).fetchall()
        bad = [(at, start, row) for at, start, row in zip(ats, starts, rows, strict=True)]
        bad = [b for b in bad if b[2] != (True, True)]
        assert not bad, f"{unit} in {tz}: {bad[:3]}"


@pytest.mark.postgres
@settings(max_examples=200, deadline=None)
@given(
    unit=st.sampled_from(["hour", "day", "week", "month", "quarter", "year"]),
    tz=st.sampled_from(ZONES),
    at=st.datetimes(
        min_value=datetime(1990, 1, 1),  # noqa: DTZ001 - hypothesis bounds are naive
        max_value=datetime(2037, 1, 1),  # noqa: DTZ001
        timezones=st.just(UTC),
    ),
)
def test_since_starts_date_truncs_bucket_at_any_instant(unit: str, tz: str, at: datetime) -> None:
    start = Bucket(unit, tz).start(at)
    with psycopg.connect(base_dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT date_trunc(%(u)s, %(a)s, %(tz)s) = date_trunc(%(u)s, %(s)s::timestamptz, %(tz)s),"
            " date_trunc(%(u)s, %(s)s::timestamptz - interval '1 microsecond', %(tz)s)"
            " <> date_trunc(%(u)s, %(a)s, %(tz)s)",
            {"u": unit, "a": at, "s": start, "tz": tz},
        ).fetchone()
    assert row == (True, True)
