"""PYTHON-API.md, "Backfills — backfill()", on the memory driver: each page is one
step (``handle(items, input)`` then the checkpoint: at least once per page), a
killed run resumes at its page, and the ledger answers ``jobs.backfills()``.
The spec's rule: ``handle`` runs before its checkpoint, so an attempt cut short
between the two hands that page to the next one."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from jobs_support import jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import (
    Actor,
    BackfillRow,
    ErrorCode,
    JobsError,
    Retry,
    acting_as,
    backfill,
)
from trio_jobs.drivers.memory import MemoryDriver
from trio_jobs.testing import Faults, crash_proof, open_harness, simulate_jobs


@attrs.frozen
class Copy:
    table: str
    size: int = 3


class World:
    """An app table (``rows``: id -> table), the source it pages, and a log of
    every ``handle`` call (the page's first id)."""

    def __init__(self, n: int = 10) -> None:
        self.source_ids = list(range(1, n + 1))
        self.rows: dict[int, str] = {}
        self.handled: list[int] = []
        self.asked: list[Any] = []

    def reset(self) -> None:
        self.rows.clear()
        self.handled.clear()
        self.asked.clear()

    def page(self, input: Copy, cursor: Any) -> tuple[list[int], Any]:
        self.asked.append(cursor)
        after = 0 if cursor is None else cursor["after"]
        found = [i for i in self.source_ids if i > after][: input.size]
        if not found or found[-1] == self.source_ids[-1]:
            return found, None
        return found, {"after": found[-1]}

    def write(self, items: list[int], input: Copy) -> None:
        self.handled.append(items[0] if items else 0)
        for i in items:
            self.rows[i] = input.table  # an upsert: a second run changes nothing


def make(world: World, **over: Any) -> Any:
    fields: dict[str, Any] = {
        "name": "copy.rows",
        "input": Copy,
        "idempotency_key": lambda i: f"copy:{i.table}",
        "source": world.page,
        "handle": world.write,
        "retry": Retry(attempts=3, base="1s", jitter=False),
    }
    fields.update(over)
    return backfill(**fields)


@pytest.fixture
def world() -> World:
    return World()


async def test_every_page_is_one_step_handled_once_in_order(
    world: World, autojump_clock: Any
) -> None:
    copy = make(world)
    async with open_harness(jobs=[copy]) as h:
        trace = await h.run(copy, Copy("users"))
        rows = await h.jobs.backfills()
    assert trace.state == "done"
    assert trace.result == {"pages": 4, "items": 10}
    assert list(trace.steps) == ["page:1", "page:2", "page:3", "page:4"]
    assert all(s.executions == 1 and s.status == "completed" for s in trace.steps.values())
    assert trace.steps["page:2"].output == {"cursor": {"after": 6}, "items": 6}
    assert trace.steps["page:4"].output == {"cursor": None, "items": 10}
    assert world.asked == [None, {"after": 3}, {"after": 6}, {"after": 9}]
    assert world.handled == [1, 4, 7, 10]
    assert world.rows == dict.fromkeys(range(1, 11), "users")
    [row] = rows
    assert isinstance(row, BackfillRow)
    assert (row.name, row.job_id, row.pages, row.items, row.cursor) == (
        "copy.rows",
        trace.job_id,
        4,
        10,
        None,
    )
    assert row.finished_at is not None
    assert row.finished_at >= row.started_at


async def test_the_source_sees_the_stored_json_form_of_its_cursor(autojump_clock: Any) -> None:
    asked: list[Any] = []

    def pages(_: None, cursor: Any) -> tuple[list[str], Any]:
        asked.append(cursor)
        if cursor is None:
            return ["a"], ("2026-01-01", 7)  # a tuple: stored, and asked, as a list
        return ["b"], None

    tupled = backfill(
        name="tupled", idempotency_key=lambda _: "t", source=pages, handle=lambda i, _: None
    )
    async with open_harness(jobs=[tupled]) as h:
        trace = await h.run(tupled, None)
    assert trace.state == "done"
    assert asked == [None, ["2026-01-01", 7]]


async def test_source_and_handle_may_be_async(world: World, autojump_clock: Any) -> None:
    async def pages(input: Copy, cursor: Any) -> tuple[list[int], Any]:
        await trio.sleep(0.1)
        return world.page(input, cursor)

    async def write(items: list[int], input: Copy) -> None:
        await trio.sleep(0.1)
        world.write(items, input)

    copy = make(world, source=pages, handle=write)
    async with open_harness(jobs=[copy]) as h:
        trace = await h.run(copy, Copy("users", size=4))
    assert trace.result == {"pages": 3, "items": 10}
    assert world.handled == [1, 5, 9]


async def test_an_empty_source_is_one_empty_page(autojump_clock: Any) -> None:
    handled: list[list[Any]] = []
    empty = backfill(
        name="empty",
        idempotency_key=lambda _: "e",
        source=lambda _, cursor: ([], None),
        handle=lambda items, _: handled.append(items),
    )
    async with open_harness(jobs=[empty]) as h:
        trace = await h.run(empty, None)
        [row] = await h.jobs.backfills()
    assert trace.result == {"pages": 1, "items": 0}
    assert handled == [[]]
    assert (row.pages, row.items, row.cursor) == (1, 0, None)
    assert row.finished_at is not None


async def test_a_failed_page_retries_at_that_page_only(world: World, autojump_clock: Any) -> None:
    failures = {7: 1}

    def flaky(items: list[int], input: Copy) -> None:
        world.write(items, input)
        if failures.get(items[0]):
            failures[items[0]] -= 1
            raise ConnectionError("the target database went away")

    copy = make(world, handle=flaky)
    async with open_harness(jobs=[copy]) as h:
        trace = await h.run(copy, Copy("users"))
        [row] = await h.jobs.backfills()
    assert trace.state == "done"
    assert trace.attempts == 2
    # pages 1 and 2 were checkpointed: the second attempt replays them from
    # their records, asking the source nothing, and resumes at page 3
    assert world.handled == [1, 4, 7, 7, 10]
    assert world.asked == [None, {"after": 3}, {"after": 6}, {"after": 6}, {"after": 9}]
    assert trace.steps["page:3"].executions == 2
    assert trace.steps["page:1"].executions == 1
    assert (row.pages, row.items) == (4, 10)


async def test_a_dead_pass_requeued_by_an_operator_resumes_at_the_failed_page(
    world: World, autojump_clock: Any
) -> None:
    broken = {"on": True}

    def write(items: list[int], input: Copy) -> None:
        if items[0] == 4 and broken["on"]:
            raise ConnectionError("the target database went away")
        world.write(items, input)

    copy = make(world, handle=write, retry=Retry(attempts=1))
    async with open_harness(jobs=[copy]) as h:
        trace = await h.run(copy, Copy("users"))
        assert trace.state == "dead"
        [row] = await h.jobs.backfills()
        assert (row.pages, row.items, row.cursor, row.finished_at) == (1, 3, {"after": 3}, None)
        broken["on"] = False
        await h.jobs.requeue(trace.job_id)
        trace = await h.drain()
        [row] = await h.jobs.backfills()
    assert trace is not None
    assert trace.state == "done"
    assert world.handled == [1, 4, 7, 10]
    assert world.asked == [None, {"after": 3}, {"after": 3}, {"after": 6}, {"after": 9}]
    assert (row.pages, row.items, row.cursor) == (4, 10, None)
    assert row.finished_at is not None


async def test_crash_proof_at_every_boundary(world: World, autojump_clock: Any) -> None:
    copy = make(world)
    report = await crash_proof(
        copy, Copy("users"), observe=lambda: dict(world.rows), reset=world.reset
    )
    # before-step, after-fn and after-record of each of the 4 pages, and the settle
    assert report.boundaries == 4 * 3 + 1
    assert report.reference == dict.fromkeys(range(1, 11), "users")


async def test_a_killed_run_resumes_at_its_page(world: World, autojump_clock: Any) -> None:
    """Killed anywhere, the fresh worker hands ``handle`` only the page that was
    cut short again: a page is handled twice only when the kill fell between
    its ``handle`` and its checkpoint (``after-fn``)."""
    runs: list[list[int]] = []

    def reset() -> None:
        runs.append(list(world.handled))
        world.reset()

    copy = make(world)
    report = await crash_proof(copy, Copy("users"), observe=lambda: dict(world.rows), reset=reset)
    runs.append(list(world.handled))
    runs = runs[1:]  # the first reset is before the clean run
    clean, killed = runs[0], runs[1:]
    assert clean == [1, 4, 7, 10]
    assert len(killed) == len(report.points)
    for point, handled in zip(report.points, killed, strict=True):
        boundary, _, step = point.partition(":")
        if boundary == "after-fn":
            page = int(step.removeprefix("page:"))
            # that page once before the kill and once after it; no other again
            assert handled == [*clean[:page], *clean[page - 1 :]], point
        else:
            assert handled == clean, point


async def test_the_ledger_shows_a_pass_in_flight(world: World, autojump_clock: Any) -> None:
    gate = trio.Event()
    reached = trio.Event()

    async def write(items: list[int], input: Copy) -> None:
        if items[0] == 7:
            reached.set()
            await gate.wait()
        world.write(items, input)

    copy = make(world, handle=write)
    async with jobs_on_memory([copy]) as (jobs, _driver), running_worker(jobs) as _worker:
        enqueued = await copy.enqueue(Copy("users"))
        await reached.wait()
        [row] = await jobs.backfills()
        assert (row.job_id, row.pages, row.items, row.cursor) == (enqueued.id, 2, 6, {"after": 6})
        assert row.finished_at is None
        gate.set()
        await wait_state(jobs, enqueued.id, "done")
        [row] = await jobs.backfills()
        assert (row.pages, row.items, row.cursor) == (4, 10, None)
        assert row.finished_at is not None


async def test_a_pass_shows_before_its_first_page_is_done(autojump_clock: Any) -> None:
    gate = trio.Event()

    async def slow(_: None, cursor: Any) -> tuple[list[int], Any]:
        await gate.wait()
        return [1], None

    first = backfill(name="first", idempotency_key=lambda _: "f", source=slow, handle=print)
    async with jobs_on_memory([first]) as (jobs, _driver), running_worker(jobs):
        enqueued = await first.enqueue(None)
        rows = await wait_for(jobs.backfills, what="the pass's row")
        assert [(r.job_id, r.pages, r.items, r.cursor, r.finished_at) for r in rows] == [
            (enqueued.id, 0, 0, None, None)
        ]
        gate.set()
        await wait_state(jobs, enqueued.id, "done")


@pytest.mark.parametrize(
    ("answer", "fault"),
    [
        ([1, 2, 3], "source must answer a pair (items, next_cursor); it answered a list"),
        ("abc", "source must answer a pair (items, next_cursor); it answered a str"),
        (("secret-row", None), "must be a list (or another sequence) of items; it answered a str"),
        (({"id": "secret-row"}, None), "of items; it answered a dict"),
        ((7, None), "of items; it answered a int"),
    ],
)
async def test_a_source_answering_the_wrong_shape_stops_the_pass(
    answer: Any, fault: str, autojump_clock: Any
) -> None:
    handled: list[Any] = []
    bad = backfill(
        name="bad",
        idempotency_key=lambda _: "b",
        source=lambda _, cursor: answer,
        handle=lambda items, _: handled.append(items),
    )
    async with open_harness(jobs=[bad]) as h:
        trace = await h.run(bad, None)
    assert trace.state == "dead"
    assert trace.attempts == 1  # terminal: a retry would answer the same
    assert trace.error_code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert trace.last_error is not None
    assert fault in trace.last_error
    assert "secret-row" not in trace.last_error
    assert handled == []


async def test_a_cursor_with_no_json_form_stops_the_pass_before_its_page_is_handled(
    autojump_clock: Any,
) -> None:
    handled: list[Any] = []
    bad = backfill(
        name="bad",
        idempotency_key=lambda _: "b",
        source=lambda _, cursor: ([1], object()),
        handle=lambda items, _: handled.append(items),
    )
    async with open_harness(jobs=[bad]) as h:
        trace = await h.run(bad, None)
    assert (trace.state, trace.attempts) == ("dead", 1)
    assert trace.error_code == ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE
    assert handled == []


async def test_a_source_answering_the_cursor_it_was_asked_with_is_refused(
    autojump_clock: Any,
) -> None:
    handled: list[Any] = []

    def stuck(_: None, cursor: Any) -> tuple[list[int], Any]:
        return [1], 5

    bad = backfill(
        name="stuck",
        idempotency_key=lambda _: "s",
        source=stuck,
        handle=lambda items, _: handled.append(items),
    )
    async with open_harness(jobs=[bad]) as h:
        trace = await h.run(bad, None)
    assert (trace.state, trace.attempts) == ("dead", 1)
    assert trace.error_code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert trace.last_error is not None
    assert "would never end" in trace.last_error
    assert handled == [[1]]  # page 1 (cursor None -> 5) was handled; page 2 (5 -> 5) was not


async def test_one_live_pass_per_key(world: World, autojump_clock: Any) -> None:
    copy = make(world)
    async with open_harness(jobs=[copy]) as h:
        first = await copy.enqueue(Copy("users"))
        again = await copy.enqueue(Copy("users"))
        other = await copy.enqueue(Copy("orders"))
        await h.drain()
        rows = await h.jobs.backfills()
    assert again.deduped
    assert again.id == first.id
    assert sorted(r.job_id for r in rows) == sorted([first.id, other.id])


async def test_backfills_filters_by_name_and_limits(autojump_clock: Any) -> None:
    made = [
        backfill(
            name=f"bf.{n}",
            input=int,
            idempotency_key=lambda i: str(i),
            source=lambda _, cursor: ([], None),
            handle=lambda items, _: None,
        )
        for n in ("a", "b")
    ]
    async with open_harness(jobs=made) as h:
        for i in range(3):
            await h.run(made[0], i)
            h.clock.advance("1s")
            await h.run(made[1], i)
            h.clock.advance("1s")
        every = await h.jobs.backfills()
        only_a = await h.jobs.backfills(name="bf.a")
        two = await h.jobs.backfills(limit=2)
    assert [r.name for r in every] == ["bf.b", "bf.a"] * 3  # newest first
    assert [r.name for r in only_a] == ["bf.a"] * 3
    assert two == every[:2]


@pytest.mark.parametrize(
    ("kwargs", "fault"),
    [
        ({"limit": 0}, "limit is how many passes"),
        ({"limit": 1001}, "limit is how many passes"),
        ({"limit": True}, "limit is how many passes"),
        ({"limit": "5"}, "limit is how many passes"),
        ({"name": 5}, "name must be"),
        ({"name": "a\x00b"}, "the backfill name cannot be stored"),
    ],
)
async def test_backfills_refuses_bad_arguments(
    kwargs: dict[str, Any], fault: str, autojump_clock: Any
) -> None:
    async with open_harness() as h:
        with pytest.raises(JobsError) as err:
            await h.jobs.backfills(**kwargs)
    assert err.value.code == ErrorCode.X_INVARIANT
    assert fault in err.value.message


async def test_backfills_spans_every_org_so_an_orgs_actor_is_refused(autojump_clock: Any) -> None:
    async with open_harness() as h:
        with acting_as(Actor("u1", org_id="org-a")), pytest.raises(JobsError) as err:
            await h.jobs.backfills()
        assert err.value.code == ErrorCode.X_FORBIDDEN
        with acting_as(None):
            assert await h.jobs.backfills() == []


class NoLedger(MemoryDriver):
    def __init__(self) -> None:
        super().__init__()
        self.backfills = None


async def test_without_a_ledger_a_pass_runs_with_no_bookkeeping(
    world: World, autojump_clock: Any
) -> None:
    copy = make(world)
    async with jobs_on_memory([copy], NoLedger()) as (jobs, _driver):
        async with running_worker(jobs):
            enqueued = await copy.enqueue(Copy("users"))
            view = await wait_state(jobs, enqueued.id, "done")
        assert view.result == {"pages": 4, "items": 10}
        assert world.handled == [1, 4, 7, 10]
        with pytest.raises(JobsError) as err:
            await jobs.backfills()
    assert err.value.code == ErrorCode.X_NOT_IMPLEMENTED
    assert "keeps no backfill ledger" in err.value.message


class FlakyLedger:
    """Wraps a driver's ledger: ``record`` raises ``X_DRIVER_UNAVAILABLE`` for the
    next ``fail`` calls, or while ``down``, before reaching the store."""

    def __init__(self, driver: MemoryDriver) -> None:
        assert driver.backfills is not None
        self.real = driver.backfills.record
        self.fail = 0
        self.down = False
        self.calls = 0
        driver.backfills.record = self.record  # type: ignore[method-assign]

    async def record(self, page: Any) -> None:
        self.calls += 1
        if self.down or self.fail > 0:
            self.fail = max(0, self.fail - 1)
            raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "the database is away")
        await self.real(page)


async def test_a_ledger_write_rides_out_a_short_outage(world: World, autojump_clock: Any) -> None:
    copy = make(world)
    async with jobs_on_memory([copy]) as (jobs, driver):
        flaky = FlakyLedger(driver)
        flaky.fail = 3  # the opening write, then page 1's, fail and are retried
        async with running_worker(jobs):
            enqueued = await copy.enqueue(Copy("users"))
            view = await wait_state(jobs, enqueued.id, "done")
        [row] = await jobs.backfills()
    assert (view.attempts, view.result) == (1, {"pages": 4, "items": 10})
    assert world.handled == [1, 4, 7, 10]  # no page handled again
    assert (row.pages, row.items) == (4, 10)


async def test_a_ledger_that_stays_away_hands_the_run_back_uncounted(
    world: World, autojump_clock: Any
) -> None:
    flaky: list[FlakyLedger] = []

    def write(items: list[int], input: Copy) -> None:
        world.write(items, input)
        if items[0] == 4 and world.handled.count(4) == 1:
            flaky[0].down = True  # page 2's ledger write, after its handle, never lands

    copy = make(world, handle=write)
    async with jobs_on_memory([copy]) as (jobs, driver):
        flaky.append(FlakyLedger(driver))
        async with running_worker(jobs):
            enqueued = await copy.enqueue(Copy("users"))
            await wait_for(lambda: flaky[0].down, what="page 2 to be handled")
            await trio.sleep(60)  # past the write budget, a few times over
            flaky[0].down = False
            view = await wait_state(jobs, enqueued.id, "done")
        [row] = await jobs.backfills()
    # each attempt that met the outage was handed back uncounted (a database
    # fault is not the job's failure) and resumed at page 2; none was counted
    assert view.attempts == 1
    outcomes = [(a.outcome, a.error_code) for a in view.attempt_log]
    assert outcomes[0] == ("handed-back", ErrorCode.X_DRIVER_UNAVAILABLE)
    assert outcomes[-1] == ("done", None)
    assert world.handled[:2] == [1, 4]
    assert world.handled[-2:] == [7, 10]
    assert set(world.handled[2:-2]) == {4}
    assert (row.pages, row.items, row.cursor) == (4, 10, None)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_pass_raced_under_faults_handles_every_row(seed: int, autojump_clock: Any) -> None:
    """Three workers race one pass on the seeded scheduler, with crashes, pauses,
    lost leases, driver errors and drains: it finishes, every row handled."""
    world = World(n=20)
    copy = make(world, retry=Retry(attempts=20, base="1s", jitter=False))

    def every_row_once_the_pass_is_done(sim: Any) -> None:
        [view] = sim.jobs  # checked once the simulation is quiet
        assert view.state == "done"
        assert world.rows == dict.fromkeys(range(1, 21), "users")
        assert view.result == {"pages": 7, "items": 20}

    result = await simulate_jobs(
        jobs=[copy],
        workers=3,
        seed=seed,
        scenario=[(copy, Copy("users"))],
        faults=Faults(crash=0.05, pause=0.05, lease_loss=0.02, driver_errors=0.05, drain=0.02),
        invariant=every_row_once_the_pass_is_done,
    )
    # the ledger's writes go through the simulation's gate (faults included)
    assert any(event[2:3] == ("backfills.record",) for event in result.trace)
