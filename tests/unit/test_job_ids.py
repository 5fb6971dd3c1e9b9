"""Job ids at the operator surface: every facade call taking a ``job_id`` takes
the whole id or a unique prefix of at least 8 characters (the short id
``trio-jobs dev`` prints); a prefix several ids start with is
``X_ID_AMBIGUOUS`` (an addition to the spec's codes), and a value that is
neither is ``X_ID_INVALID`` before the driver is asked. ``preview_many`` is the
dry run of a bulk call."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_jobs import ErrorCode, JobsError, open_jobs
from trio_jobs._enqueue import job_ref
from trio_jobs.drivers import EnqueueRequest, memory_driver
from trio_jobs.drivers._protocol import MIN_ID_PREFIX, NackOptions

TWINS = ("6b63347c-1d2c-4c3b-9a8e-7f6d5c4b3a21", "6b63347c-9999-4c3b-9a8e-7f6d5c4b3a21")
LONE = "0191c6a2-6c1e-7a3b-9f0e-000000000001"


def _request(job_id: str, key: str, delay: float | None = None) -> EnqueueRequest:
    return EnqueueRequest(
        id=job_id,
        run_id=str(uuid.uuid4()),
        name="ids.job",
        queue="default",
        payload={"n": 1},
        idempotency_key=key,
        max_attempts=3,
        delay=delay,
    )


# --------------------------------------------------------------------------- the parser


@given(st.uuids())
def test_a_whole_id_in_any_form_uuid_reads_is_made_canonical(value: uuid.UUID) -> None:
    canonical = str(value)
    for form in (canonical, canonical.upper(), "{" + canonical + "}", value.hex, value):
        assert job_ref(form) == (canonical, False)


@given(st.uuids(), st.integers(MIN_ID_PREFIX, 35))
def test_the_start_of_a_canonical_id_is_a_prefix(value: uuid.UUID, n: int) -> None:
    prefix = str(value)[:n]
    assert job_ref(prefix) == (prefix, True)
    assert job_ref(prefix.upper()) == (prefix, True)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "6b63347",  # seven characters: too short to name one job
        "6b63347c1d2c",  # the dashes are part of an id's start
        "6b63347g",
        " 6b63347c",
        "6b63347c ",
        "nope",
        "x" * 36,
        "\x006b63347c",
        None,
        12345678,
        b"6b63347c",
    ],
    ids=repr,
)
def test_anything_else_is_x_id_invalid(value: Any) -> None:
    with pytest.raises(JobsError) as caught:
        job_ref(value)
    assert caught.value.code == ErrorCode.X_ID_INVALID
    assert "8 or more characters" in caught.value.message


# --------------------------------------------------------------------------- the facade


async def test_every_call_taking_an_id_takes_a_unique_prefix() -> None:
    driver = memory_driver()
    async with open_jobs(driver, jobs=[]) as jobs:
        await driver.enqueue_many([_request(LONE, "lone", delay=60.0)])
        assert (await jobs.show("0191c6a2")).id == LONE
        assert (await jobs.show("0191C6A2-6C1E")).id == LONE
        assert (await jobs.promote("0191c6a2")).state == "ready"
        claimed = (await driver.claim(_claim())).jobs[0]
        await driver.nack(claimed.id, NackOptions(fence=claimed.fence, state="dead"))
        assert (await jobs.requeue("0191c6a2")).state == "ready"
        assert (await jobs.cancel("0191c6a2", "a test")).state == "cancelled"
        with pytest.raises(JobsError) as caught:
            await jobs.resolve_step("0191c6a2", "pay", ran=False)
        assert caught.value.code == ErrorCode.X_INVARIANT  # it got to the job: no such step
        await jobs.remove("0191c6a2")
        with pytest.raises(JobsError) as caught:
            await jobs.show("0191c6a2")
        assert caught.value.code == ErrorCode.X_JOB_NOT_FOUND


async def test_an_ambiguous_prefix_is_refused_naming_the_jobs_and_a_longer_one_is_not() -> None:
    driver = memory_driver()
    async with open_jobs(driver, jobs=[]) as jobs:
        await driver.enqueue_many([_request(TWINS[0], "a"), _request(TWINS[1], "b")])
        for call in (jobs.show, jobs.remove, jobs.promote, jobs.requeue):
            with pytest.raises(JobsError) as caught:
                await call("6b63347c")
            assert caught.value.code == ErrorCode.X_ID_AMBIGUOUS
            assert caught.value.meta["matches"] == list(TWINS)
            assert "give more of the id" in caught.value.message
        assert (await jobs.show("6b63347c-9")).id == TWINS[1]
        assert (await jobs.show(TWINS[0])).id == TWINS[0]
        assert (await driver.stats())[0].ready == 2  # nothing moved


async def test_a_malformed_id_is_x_id_invalid_before_the_driver_is_asked() -> None:
    class Asked(Exception):
        pass

    driver = memory_driver()
    async with open_jobs(driver, jobs=[]) as jobs:
        intro = driver.introspect

        def refuse(*_args: Any, **_kw: Any) -> Any:
            raise Asked

        for member in ("show", "resolve_id", "cancel", "requeue", "remove", "promote"):
            setattr(intro, member, refuse)
        for value in ("6b63347", "not-an-id", "6b63347c1d2c", ""):
            with pytest.raises(JobsError) as caught:
                await jobs.show(value)
            assert caught.value.code == ErrorCode.X_ID_INVALID
            with pytest.raises(JobsError) as caught:
                await jobs.cancel(value, "why")
            assert caught.value.code == ErrorCode.X_ID_INVALID


async def test_a_whole_id_no_job_has_is_still_not_found() -> None:
    async with open_jobs(memory_driver(), jobs=[]) as jobs:
        with pytest.raises(JobsError) as caught:
            await jobs.show(str(uuid.uuid4()))
        assert caught.value.code == ErrorCode.X_JOB_NOT_FOUND


# --------------------------------------------------------------------------- preview_many


async def test_preview_many_checks_its_arguments_and_writes_nothing() -> None:
    driver = memory_driver()
    async with open_jobs(driver, jobs=[]) as jobs:
        await driver.enqueue_many([_request(i, f"k{n}", 60.0) for n, i in enumerate(TWINS)])
        preview = await jobs.preview_many("remove", state="delayed", sample=1)
        assert preview.count == 2
        assert [v.id for v in preview.sample] == [TWINS[0]]
        assert (await driver.stats())[0].delayed == 2
        for bad in (-1, 51, True, 2.0, "5"):
            with pytest.raises(JobsError) as caught:
                await jobs.preview_many("remove", state="delayed", sample=bad)
            assert caught.value.code == ErrorCode.X_INVARIANT
        with pytest.raises(JobsError) as caught:
            await jobs.preview_many("delete", state="delayed")  # type: ignore[arg-type]
        assert caught.value.code == ErrorCode.X_INVARIANT


def _claim() -> Any:
    from trio_jobs.drivers import ClaimOptions

    return ClaimOptions(worker_id="w", queues={"default": 5}, visibility_timeout=30.0)


async def test_resolve_id_answers_the_whole_id() -> None:
    driver = memory_driver()
    async with open_jobs(driver, jobs=[]) as jobs:
        await driver.enqueue_many([_request(LONE, "lone")])
        assert await jobs.resolve_id("0191c6a2") == LONE
        assert await jobs.resolve_id(LONE.upper()) == LONE
        absent = str(uuid.uuid4())
        assert await jobs.resolve_id(absent) == absent  # a whole id is not looked up
