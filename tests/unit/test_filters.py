"""``ListFilter`` and ``BulkFilter`` are validated once, where they are built:
the facade, the drivers, the CLI and the dashboard all rely on it (spec
"Operator surface": ``X_JOB_PAGE_INVALID``, ``X_INVARIANT``)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from trio_jobs import ErrorCode, JobsError, open_jobs
from trio_jobs.drivers import ALL_STATES, MAX_JOB_PAGE, BulkFilter, ListFilter, memory_driver

PAGE = f"limit must be between 1 and {MAX_JOB_PAGE}; page with .after for more"
STATE = f"state must be one of {ALL_STATES}"


@pytest.mark.parametrize("limit", [0, -1, MAX_JOB_PAGE + 1, True, 2.5, "5"], ids=repr)
def test_a_limit_outside_the_page_is_refused(limit: Any) -> None:
    with pytest.raises(JobsError) as caught:
        ListFilter(limit=limit)
    assert caught.value.code == ErrorCode.X_JOB_PAGE_INVALID
    assert caught.value.message == PAGE


@pytest.mark.parametrize("limit", [1, 50, MAX_JOB_PAGE])
def test_a_limit_within_the_page_is_taken(limit: int) -> None:
    assert ListFilter(limit=limit).limit == limit


def test_both_cursors_are_refused() -> None:
    with pytest.raises(JobsError) as caught:
        ListFilter(after="x", before="y")
    assert caught.value.code == ErrorCode.X_INVARIANT
    assert caught.value.message == "pass after or before, not both"
    assert ListFilter(after="x").after == "x"
    assert ListFilter(before="y").before == "y"


@pytest.mark.parametrize("cls", [ListFilter, BulkFilter])
def test_an_unknown_state_is_refused(cls: Any) -> None:
    with pytest.raises(JobsError) as caught:
        cls(state="finished")
    assert caught.value.code == ErrorCode.X_INVARIANT
    assert caught.value.message == STATE
    for state in ALL_STATES:
        assert cls(state=state).state == state


def test_evolve_validates_again() -> None:
    with pytest.raises(JobsError) as caught:
        attrs.evolve(ListFilter(), limit=0)
    assert caught.value.code == ErrorCode.X_JOB_PAGE_INVALID


async def test_the_facade_answers_the_filters_refusals() -> None:
    async with open_jobs(memory_driver(), jobs=[]) as jobs:
        with pytest.raises(JobsError) as caught:
            await jobs.list(limit=0)
        assert (caught.value.code, caught.value.message) == (ErrorCode.X_JOB_PAGE_INVALID, PAGE)
        with pytest.raises(JobsError) as caught:
            await jobs.list(state="finished")
        assert caught.value.code == ErrorCode.X_INVARIANT
        with pytest.raises(JobsError) as caught:
            await jobs.remove_many(state="finished")
        assert (caught.value.code, caught.value.message) == (ErrorCode.X_INVARIANT, STATE)
