"""One validation, every driver: what the facade refuses before any driver sees it.

Each value below was once accepted by one driver and crashed or corrupted
another (issue 15): PostgreSQL stored ``run_at=nan`` as a row that never came
due and that ``show`` then could not render, raised a raw ``DataError`` on a NUL
character and ``NumericValueOutOfRange`` on a priority past 2**31; Redis wrote
half a row before its script failed; memory accepted everything. Every case is
refused at the facade with its code, on every driver, and nothing is written:
the driver's counts and rows (and, on Redis, its keys) are what they were, and
the operator surface (``show``, ``list``, the dashboard) still answers.

:class:`RefusalConformance` is mixed into each driver's conformance class
(``tests/drivers/conformance/test_memory.py``, ``postgres/test_conformance.py``,
``redis/test_conformance.py``), over the same ``target`` fixture.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import attrs
import pytest

from trio_jobs import (
    Concurrency,
    ErrorCode,
    JobContext,
    Jobs,
    JobsError,
    job,
    open_jobs,
    publish_event,
)
from trio_jobs.testing.conformance import Target

SECRET = "s3cr3t-value"


@attrs.frozen
class Item:
    key: str
    group: str = "g"
    org: str | None = None


@job(
    name="refusals.plain",
    input=Item,
    idempotency_key=lambda i: f"k:{i.key}",
    tenant=lambda i: i.org,
)
async def plain(ctx: JobContext[Item]) -> None:
    return None


@job(
    name="refusals.capped",
    input=Item,
    idempotency_key=lambda i: f"c:{i.key}",
    concurrency=Concurrency(limit=1, key=lambda i: i.group),
)
async def capped(ctx: JobContext[Item]) -> None:
    return None


@job(name="refusals.nested", input=list, idempotency_key=lambda i: f"n:{len(i)}")
async def nested(ctx: JobContext[list[Any]]) -> None:
    return None


JOBS = [plain, capped, nested]


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


@attrs.frozen
class Refusal:
    """One bad call: the code it is refused with and a phrase of the message."""

    label: str
    code: ErrorCode
    phrase: str
    call: Callable[[Jobs], Awaitable[Any]]


def _enqueue(**options: Any) -> Callable[[Jobs], Awaitable[Any]]:
    return lambda _jobs: plain.enqueue(Item("ok"), **options)


REFUSALS = [
    # run_at: NaN, infinities, and instants a timestamp does not hold.
    Refusal("run_at=nan", ErrorCode.X_JOB_INPUT_INVALID, "NaN", _enqueue(run_at=math.nan)),
    Refusal("run_at=inf", ErrorCode.X_JOB_INPUT_INVALID, "9999", _enqueue(run_at=math.inf)),
    Refusal("run_at=-inf", ErrorCode.X_JOB_INPUT_INVALID, "1970", _enqueue(run_at=-math.inf)),
    Refusal("run_at=1e20", ErrorCode.X_JOB_INPUT_INVALID, "9999", _enqueue(run_at=1e20)),
    Refusal("run_at=-1", ErrorCode.X_JOB_INPUT_INVALID, "1970", _enqueue(run_at=-1.0)),
    Refusal("run_at=10**400", ErrorCode.X_JOB_INPUT_INVALID, "9999", _enqueue(run_at=10**400)),
    Refusal(
        "run_at naive datetime",
        ErrorCode.X_JOB_INPUT_INVALID,
        "aware",
        _enqueue(run_at=datetime(2030, 1, 1)),  # noqa: DTZ001 — the fault under test
    ),
    Refusal("run_at='soon'", ErrorCode.X_JOB_INPUT_INVALID, "epoch", _enqueue(run_at="soon")),
    # delay: NaN, infinity, negative, past a century.
    Refusal("delay=nan", ErrorCode.X_JOB_INPUT_INVALID, "finite", _enqueue(delay=math.nan)),
    Refusal("delay=inf", ErrorCode.X_JOB_INPUT_INVALID, "finite", _enqueue(delay=math.inf)),
    Refusal("delay=-1", ErrorCode.X_JOB_INPUT_INVALID, "positive", _enqueue(delay=-1)),
    Refusal("delay=1e300", ErrorCode.X_JOB_INPUT_INVALID, "100 years", _enqueue(delay=1e300)),
    # priority: a 32-bit signed integer.
    Refusal("priority=2**31", ErrorCode.X_JOB_INPUT_INVALID, "32-bit", _enqueue(priority=2**31)),
    Refusal(
        "priority=-2**31-1",
        ErrorCode.X_JOB_INPUT_INVALID,
        "32-bit",
        _enqueue(priority=-(2**31) - 1),
    ),
    Refusal("priority=1.5", ErrorCode.X_JOB_INPUT_INVALID, "int", _enqueue(priority=1.5)),
    # Text no driver can store whole: NUL (PostgreSQL text), a lone surrogate.
    Refusal(
        "tenant_id with NUL",
        ErrorCode.X_JOB_INPUT_INVALID,
        "NUL",
        _enqueue(tenant_id=f"{SECRET}\x00"),
    ),
    Refusal(
        "idempotency key with NUL",
        ErrorCode.X_JOB_DECLARATION_INVALID,
        "NUL",
        lambda _jobs: plain.enqueue(Item(f"{SECRET}\x00")),
    ),
    Refusal(
        "idempotency key with NUL, input 1500 of a batch",
        ErrorCode.X_JOB_DECLARATION_INVALID,
        "NUL",
        lambda _jobs: plain.enqueue_many(
            [Item(f"b{i}") if i != 1500 else Item(f"{SECRET}\x00") for i in range(2000)]
        ),
    ),
    Refusal(
        "concurrency key with NUL",
        ErrorCode.X_JOB_DECLARATION_INVALID,
        "NUL",
        lambda _jobs: capped.enqueue(Item("c", group=f"{SECRET}\x00")),
    ),
    Refusal(
        "tenant(input) answering NUL",
        ErrorCode.X_JOB_DECLARATION_INVALID,
        "NUL",
        lambda _jobs: plain.enqueue(Item("t", org=f"{SECRET}\x00")),
    ),
    Refusal(
        "tenant_id with a lone surrogate",
        ErrorCode.X_JOB_INPUT_INVALID,
        "surrogate",
        _enqueue(tenant_id=f"{SECRET}\ud800"),
    ),
    # A payload nested past the limit (100,000 levels, past every recursion limit).
    Refusal(
        "a 100,000-deep list",
        ErrorCode.X_JOB_INPUT_INVALID,
        "nested too deep: more than 64 levels",
        lambda _jobs: nested.enqueue(_deep(100_000)),
    ),
    Refusal(
        "a 100-deep list",
        ErrorCode.X_JOB_INPUT_INVALID,
        "nested too deep: more than 64 levels",
        lambda _jobs: nested.enqueue(_deep(100)),
    ),
    # Events.
    Refusal(
        "an event name with NUL",
        ErrorCode.X_INVARIANT,
        "NUL",
        lambda _jobs: publish_event(f"{SECRET}\x00", {"n": 1}),
    ),
    Refusal(
        "an event payload 100,000 deep",
        ErrorCode.X_JOB_EVENT_INVALID,
        "nested too deep",
        lambda _jobs: publish_event("paid", _deep(100_000)),
    ),
    # The operator surface: refused at the facade, before a driver (or its
    # missing introspection) is asked.
    Refusal(
        "a cancel reason with NUL",
        ErrorCode.X_INVARIANT,
        "NUL",
        lambda jobs: jobs.cancel("00000000-0000-4000-8000-000000000000", f"{SECRET}\x00"),
    ),
    Refusal(
        "a queue filter with NUL",
        ErrorCode.X_INVARIANT,
        "NUL",
        lambda jobs: jobs.list(queue=f"{SECRET}\x00"),
    ),
    Refusal(
        "a bulk tenant filter with NUL",
        ErrorCode.X_INVARIANT,
        "NUL",
        lambda jobs: jobs.remove_many(state="done", tenant_id=f"{SECRET}\x00"),
    ),
    Refusal(
        "a queue to pause with NUL",
        ErrorCode.X_INVARIANT,
        "NUL",
        lambda jobs: jobs.pause_queue(f"{SECRET}\x00"),
    ),
    Refusal(
        "created_from=nan",
        ErrorCode.X_INVARIANT,
        "NaN",
        lambda jobs: jobs.list(created_from=math.nan),
    ),
]


async def _rows(jobs: Jobs) -> list[tuple[Any, ...]] | None:
    if jobs.driver.introspect is None:
        return None
    page = await jobs.list(limit=200)
    return [(r.id, r.state, r.run_at, r.priority, r.tenant_id) for r in page.rows]


async def _dashboard_answers(jobs: Jobs, job_id: str) -> None:
    """The dashboard's overview, jobs list and the job's page render (200)."""
    try:
        from trio_jobs.web import create_app
    except ImportError:  # the `web` extra is absent: tests/web says so
        return
    from web.asgi_client import AsgiClient

    client = AsgiClient(create_app(jobs))
    for path in ("/", "/jobs", f"/{job_id}"):
        reply = await client.get(path)
        assert reply.status == 200, (path, reply.status)


class RefusalConformance:
    """Mix into a driver's conformance class (it provides ``target``)."""

    async def written(self, target: Target) -> object:
        """What the driver holds beyond the facade's view (Redis: its keys)."""
        return None

    async def _snapshot(self, jobs: Jobs, target: Target) -> object:
        return (await jobs.stats(), await _rows(jobs), await self.written(target))

    @pytest.mark.parametrize("case", REFUSALS, ids=lambda c: c.label)
    async def test_refused_at_the_facade_with_nothing_written(
        self, target: Target, case: Refusal
    ) -> None:
        async with open_jobs(target.driver, jobs=JOBS) as jobs:
            first = await plain.enqueue(Item("seed"), delay=60)
            before = await self._snapshot(jobs, target)
            with pytest.raises(JobsError) as caught:
                await case.call(jobs)
            assert caught.value.code == case.code, caught.value
            assert case.phrase in caught.value.message, caught.value.message
            assert SECRET not in str(caught.value)  # the value is never echoed
            assert await self._snapshot(jobs, target) == before
            # The caller's fixed retry is a fresh row, not deduped onto a leftover.
            again = await plain.enqueue(Item("after"))
            assert not again.deduped
            if jobs.driver.introspect is not None:
                assert (await jobs.show(first.id)).state == "delayed"
                assert (await jobs.show(again.id)).state == "ready"
                assert {r.id for r in (await jobs.list()).rows} >= {first.id, again.id}
                await _dashboard_answers(jobs, again.id)

    async def test_the_edges_of_each_range_are_accepted(self, target: Target) -> None:
        async with open_jobs(target.driver, jobs=JOBS) as jobs:
            got = [
                await plain.enqueue(Item("e0"), run_at=0),
                await plain.enqueue(Item("e1"), run_at=253_402_300_799),
                await plain.enqueue(Item("e2"), priority=2**31 - 1),
                await plain.enqueue(Item("e3"), priority=-(2**31)),
                await plain.enqueue(Item("e4"), delay=100 * 365 * 86_400),
                await nested.enqueue(_deep(63)),  # 64 levels with the outermost list
                await plain.enqueue(Item("e5", org="tenant-é"), tenant_id="tenant-é"),
            ]
            assert not any(g.deduped for g in got)
            if jobs.driver.introspect is not None:
                views = [await jobs.show(g.id) for g in got]
                assert [v.run_at for v in views[:2]] == [0.0, 253_402_300_799.0]
                assert [v.priority for v in views[2:4]] == [2**31 - 1, -(2**31)]
                assert views[6].tenant_id == "tenant-é"
                await _dashboard_answers(jobs, got[1].id)

    async def test_a_dict_of_the_declared_shape_is_structured_like_the_instance(
        self, target: Target
    ) -> None:
        """The choice (docs/explanation/design-choices.md): a plain dict where an
        attrs input is declared is structured by the converter, as the worker
        structures the stored payload; a wrong shape is refused."""
        async with open_jobs(target.driver, jobs=JOBS) as jobs:
            from_dict = await plain.enqueue({"key": "d", "org": "o1"})  # type: ignore[arg-type]
            same = await plain.enqueue(Item("d", org="o1"))
            assert same.deduped  # one key: the dict was the same input
            assert same.id == from_dict.id
            for wrong in ({"key": 1}, {"key": "d", "extra": 1}, {"org": "o1"}):
                with pytest.raises(JobsError) as caught:
                    await plain.enqueue(wrong)  # type: ignore[arg-type]
                assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
            if jobs.driver.introspect is not None:
                view = await jobs.show(from_dict.id)
                assert view.payload == {"key": "d", "group": "g", "org": "o1"}
                assert view.tenant_id == "o1"
