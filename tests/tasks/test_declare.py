"""Spec: "Scheduled tasks — task()" — the declaration, the schedule's pure parts
(``next_fire``, the catch-up decision, DST) and the built-in key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trio_jobs import ErrorCode, JobContext, JobsError, Occurrence, Retry, job, next_fire, task
from trio_jobs._task import MAX_CATCH_UP, Schedule, decide

PARIS = ZoneInfo("Europe/Paris")


async def _body(ctx: JobContext[Occurrence]) -> None:
    return None


def _faults(**kwargs: Any) -> list[str]:
    with pytest.raises(JobsError) as caught:
        task(**kwargs)(_body)
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    faults = caught.value.meta["faults"]
    assert caught.value.message == "task declaration is invalid: " + "; ".join(faults)
    return list(faults)


class TestDeclaration:
    def test_a_task_is_a_job_of_kind_task_with_the_schedule_lifted(self) -> None:
        nightly = task(cron="30 2 * * *", tz="Europe/Paris", catch_up="all", name="nightly")(_body)
        assert nightly.kind == "task"
        assert nightly.name == "nightly"
        assert nightly.input is Occurrence
        assert (nightly.cron, nightly.every, nightly.tz, nightly.catch_up) == (
            "30 2 * * *",
            None,
            "Europe/Paris",
            "all",
        )
        assert nightly.schedule.text == "30 2 * * *"
        assert nightly.retry == Retry()
        assert nightly.describe()["schedule"] == {
            "text": "30 2 * * *",
            "tz": "Europe/Paris",
            "catch_up": "all",
        }
        ticker = task(every="10s", queue="ticks", retry=Retry(attempts=1))(_body)
        assert ticker.schedule.text == "every:10"
        assert ticker.tz == "UTC"
        assert ticker.catch_up == "latest"
        assert ticker.queue == "ticks"
        assert ticker.retry.attempts == 1
        assert ticker.name.endswith("_body")

    def test_the_built_in_key_is_the_name_and_the_instant_in_utc(self) -> None:
        nightly = task(cron="30 2 * * *", tz="Europe/Paris", name="nightly")(_body)
        at = datetime(2026, 7, 1, 2, 30, tzinfo=PARIS)
        assert nightly.idempotency_key_for(Occurrence(at)) == "task:nightly:2026-07-01T00:30:00Z"

    def test_the_input_is_read_back_in_the_tasks_zone(self) -> None:
        nightly = task(cron="30 2 * * *", tz="Europe/Paris", name="nightly")(_body)
        parsed = nightly.parse({"at": "2026-07-01T00:30:00+00:00"})
        assert parsed.at == datetime(2026, 7, 1, 2, 30, tzinfo=PARIS)
        assert parsed.at.tzinfo == PARIS
        with pytest.raises(JobsError) as caught:
            nightly.parse({"at": "2026-07-01T00:30:00"})
        assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID

    def test_neither_or_both_of_cron_and_every_is_refused(self) -> None:
        assert _faults() == ["pass exactly one of cron= or every="]
        assert _faults(cron="* * * * *", every="1m") == ["pass exactly one of cron= or every="]

    def test_a_cron_that_does_not_parse_is_refused(self) -> None:
        [fault] = _faults(cron="61 * * * *")
        assert fault.startswith("cron does not parse")
        [fault] = _faults(cron="@daily")
        assert "five fields" in fault
        [fault] = _faults(cron="* * *")
        assert "it has 3" in fault

    def test_a_sixth_field_seconds_is_refused(self) -> None:
        [fault] = _faults(cron="0 30 2 * * *")
        assert "sixth field (seconds)" in fault

    def test_a_zone_that_is_not_iana_is_refused(self) -> None:
        for zone in ("Mars/Olympus", "+01:00", "../etc/passwd", "", 3):
            [fault] = _faults(every="1m", tz=zone)
            assert "IANA" in fault

    def test_every_under_one_second_or_fractional_is_refused(self) -> None:
        assert _faults(every="500ms") == ["every must be at least 1 s"]
        assert _faults(every=1.5) == ["every must be a whole number of seconds"]
        [fault] = _faults(every="soon")
        assert fault.startswith("every must be a duration")
        assert task(every=timedelta(minutes=5))(_body).every == 300

    def test_every_fault_is_named_at_once(self) -> None:
        faults = _faults(
            cron="0 30 2 * * *",
            every="10ms",
            tz="Nowhere/Else",
            catch_up="sometimes",
            queue="bad queue",
            retry=Retry(attempts=0),
            nonsense=True,
        )
        text = "; ".join(faults)
        for part in (
            "exactly one of cron= or every=",
            "sixth field",
            "every must be at least 1 s",
            "not an IANA zone",
            "catch_up must be",
            "queue must be",
            "retry.attempts",
            "unknown field(s): nonsense",
        ):
            assert part in text, part

    def test_a_task_is_listed_like_any_job(self) -> None:
        plain = job(idempotency_key=lambda _i: "k", name="plain")(_body)
        ticker = task(every="1m", name="ticker")(_body)
        assert {plain.kind, ticker.kind} == {"job", "task"}


class TestNextFire:
    def test_after_is_strict_and_the_answer_is_in_the_tasks_zone(self) -> None:
        nightly = task(cron="30 2 * * *", tz="Europe/Paris")(_body)
        at = datetime(2026, 7, 1, 2, 30, tzinfo=PARIS)
        assert next_fire(nightly, at - timedelta(seconds=1)) == at
        assert next_fire(nightly, at) == at + timedelta(days=1)
        assert next_fire(nightly, at.astimezone(UTC)).tzinfo == PARIS

    def test_every_counts_from_the_epoch(self) -> None:
        ticker = task(every="7s")(_body)
        got = next_fire(ticker, datetime(2026, 1, 1, tzinfo=UTC))
        assert got.timestamp() % 7 == 0
        assert 0 < got.timestamp() - datetime(2026, 1, 1, tzinfo=UTC).timestamp() <= 7

    def test_a_naive_after_or_a_plain_job_is_refused(self) -> None:
        ticker = task(every="7s")(_body)
        with pytest.raises(JobsError) as caught:
            next_fire(ticker, datetime(2026, 1, 1))  # noqa: DTZ001 - the point of the test
        assert caught.value.code == ErrorCode.X_INVARIANT
        plain = job(idempotency_key=lambda _i: "k")(_body)
        with pytest.raises(JobsError):
            next_fire(plain, datetime(2026, 1, 1, tzinfo=UTC))

    def test_a_local_time_that_does_not_happen_fires_once_at_the_next_valid_instant(self) -> None:
        nightly = task(cron="30 2 * * *", tz="Europe/Paris")(_body)
        # 2026-03-29: Paris skips from 02:00 to 03:00.
        first = next_fire(nightly, datetime(2026, 3, 28, 12, tzinfo=PARIS))
        assert first == datetime(2026, 3, 29, 3, 0, tzinfo=PARIS)
        assert next_fire(nightly, first) == datetime(2026, 3, 30, 2, 30, tzinfo=PARIS)

    def test_a_local_time_that_happens_twice_fires_once(self) -> None:
        nightly = task(cron="30 2 * * *", tz="Europe/Paris")(_body)
        # 2026-10-25: Paris runs 02:00-03:00 twice.
        start = datetime(2026, 10, 24, 12, tzinfo=PARIS).timestamp()
        end = datetime(2026, 10, 26, 12, tzinfo=PARIS).timestamp()
        fired, _more = nightly.schedule.newest(start, end, 10)
        assert [datetime.fromtimestamp(t, PARIS).strftime("%d %H:%M") for t in fired] == [
            "25 02:30",
            "26 02:30",
        ]

    @settings(max_examples=200, deadline=None)
    @given(
        every=st.integers(min_value=1, max_value=10**6),
        after=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    )
    def test_every_next_is_the_first_multiple_past(self, every: int, after: float) -> None:
        schedule = Schedule(f"every:{every}", "UTC", ZoneInfo("UTC"), every=every)
        got = schedule.next_after(after)
        assert got % every == 0
        assert after < got <= after + every

    @settings(max_examples=150, deadline=None)
    @given(
        minute=st.sampled_from(["*", "0", "*/15", "5,35", "59"]),
        hour=st.sampled_from(["*", "2", "0-6", "*/3"]),
        dom=st.sampled_from(["*", "1", "15", "L"]),
        dow=st.sampled_from(["*", "1-5", "0"]),
        zone=st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe"]),
        after=st.floats(min_value=1.6e9, max_value=2.2e9, allow_nan=False),
    )
    # Lord Howe's clocks go back 30 minutes at 02:00 on 2028-04-02: from 02:59 +11
    # the day before, cronsim's forward step alone answers 02:30 +10:30 (CI, 2026-12-03).
    @example(minute="*", hour="2", dom="*", dow="*", zone="Australia/Lord_Howe", after=1838131140.0)
    def test_cron_next_has_no_occurrence_before_it(
        self, minute: str, hour: str, dom: str, dow: str, zone: str, after: float
    ) -> None:
        text = f"{minute} {hour} {dom} * {dow}"
        schedule = Schedule(text, zone, ZoneInfo(zone), cron=text)
        got = schedule.next_after(after)
        assert got > after
        assert schedule.newest(after, got, 5) == ([got], False)


class TestCatchUp:
    SCHEDULE = Schedule("every:60", "UTC", ZoneInfo("UTC"), every=60)

    def test_nothing_due_writes_nothing(self) -> None:
        assert decide(self.SCHEDULE, "all", 600.0, 659.0) == ([], None, False)

    def test_latest_fires_only_the_most_recent(self) -> None:
        assert decide(self.SCHEDULE, "latest", 600.0, 900.0) == ([900.0], 900.0, False)

    def test_all_fires_each_oldest_first(self) -> None:
        assert decide(self.SCHEDULE, "all", 600.0, 900.0) == (
            [660.0, 720.0, 780.0, 840.0, 900.0],
            900.0,
            False,
        )

    def test_all_fires_at_most_the_newest_thousand(self) -> None:
        fire, through, capped = decide(self.SCHEDULE, "all", 0.0, 60.0 * 1500)
        assert len(fire) == MAX_CATCH_UP
        assert fire[0] == 60.0 * 501
        assert fire[-1] == through == 60.0 * 1500
        assert capped

    def test_none_fires_none_more_than_sixty_seconds_late(self) -> None:
        assert decide(self.SCHEDULE, "none", 600.0, 901.0) == ([900.0], 900.0, False)
        hourly = Schedule("every:3600", "UTC", ZoneInfo("UTC"), every=3600)
        assert decide(hourly, "none", 0.0, 3661.0) == ([], 3600.0, False), "a skip, decided"
        every10 = Schedule("every:10", "UTC", ZoneInfo("UTC"), every=10)
        assert decide(every10, "none", 0.0, 100.0)[0] == [40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]


@settings(max_examples=200, deadline=None)
@given(
    text=st.sampled_from(
        ["every:1", "every:7", "every:60", "*/5 * * * *", "30 2 * * *", "* * * * *"]
    ),
    watermark=st.floats(min_value=1.7e9, max_value=1.8e9, allow_nan=False),
    span=st.floats(min_value=0, max_value=20_000, allow_nan=False),
)
def test_latest_and_none_agree_with_the_full_list(text: str, watermark: float, span: float) -> None:
    """The rules read off every occurrence that fell due (a reference: all of
    them, oldest first), whatever shortcut each takes."""
    zone = ZoneInfo("Europe/Paris")
    schedule = (
        Schedule(text, "Europe/Paris", zone, every=int(text[6:]))
        if text.startswith("every:")
        else Schedule(text, "Europe/Paris", zone, cron=text)
    )
    now = watermark + span
    every, _more = schedule.newest(watermark, now, 100_000)
    through = every[-1] if every else None
    assert decide(schedule, "latest", watermark, now) == (every[-1:], through, False)
    late = [at for at in every if now - at <= 60.0]
    assert decide(schedule, "none", watermark, now) == (late, through, False)
    fired, moved, capped = decide(schedule, "all", watermark, now)
    assert fired == every[-1000:]
    assert moved == through
    assert capped == (len(every) > 1000)
