"""The write combiner (``drivers/_combine.py``), shared by the PostgreSQL and
Redis drivers: batching, one write of a row per call, cancellation and
failure, with a flush that records its calls."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_jobs.drivers._combine import Combiner


class Store:
    """A flush that records each call's items and lands all but ``refuse``."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.refuse: set[Any] = set()
        self.fail: Exception | None = None
        self.gate: trio.Event | None = None

    async def flush(self, items: list[Any]) -> set[int]:
        self.calls.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return {i for i, item in enumerate(items, start=1) if item not in self.refuse}


def closed() -> BaseException:
    return RuntimeError("closed")


async def test_writes_queued_during_a_call_share_the_next(autojump_clock: Any) -> None:
    store = Store()
    store.gate = trio.Event()
    combiner = Combiner(store.flush, lambda: None, closed)
    answers: dict[str, bool] = {}

    async def write(key: str) -> None:
        answers[key] = await combiner.submit(key, key)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(combiner.run)
        nursery.start_soon(write, "a")
        await trio.testing.wait_all_tasks_blocked()  # "a" is in flight, alone
        for key in "bcd":
            nursery.start_soon(write, key)
            await trio.testing.wait_all_tasks_blocked()  # queued in this order
        store.refuse = {"c"}
        store.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert store.calls == [["a"], ["b", "c", "d"]]
    assert answers == {"a": True, "b": True, "c": False, "d": True}
    assert combiner.flushes == 2


async def test_two_writes_of_one_row_never_share_a_call(autojump_clock: Any) -> None:
    store = Store()
    store.gate = trio.Event()
    combiner = Combiner(store.flush, lambda: None, closed)

    async def write(key: str, item: str) -> None:
        assert await combiner.submit(key, item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(combiner.run)
        nursery.start_soon(write, "x", "first")
        await trio.testing.wait_all_tasks_blocked()
        for key, item in (("x", "second"), ("x", "third"), ("y", "other")):
            nursery.start_soon(write, key, item)
            await trio.testing.wait_all_tasks_blocked()  # queued in this order
        store.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    # One write of row x a call, in the order they came.
    assert store.calls == [["first"], ["second", "other"], ["third"]]


async def test_a_waiter_cancelled_before_its_call_leaves_the_queue(autojump_clock: Any) -> None:
    store = Store()
    store.gate = trio.Event()
    combiner = Combiner(store.flush, lambda: None, closed)
    outer = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(combiner.run)
        nursery.start_soon(combiner.submit, "a", "a")
        await trio.testing.wait_all_tasks_blocked()

        async def gives_up() -> None:
            with outer:
                await combiner.submit("b", "b")
                raise AssertionError("unreachable: cancelled")  # pragma: no cover

        async def stays() -> None:
            assert await combiner.submit("c", "c")

        nursery.start_soon(gives_up)
        nursery.start_soon(stays)
        await trio.testing.wait_all_tasks_blocked()
        outer.cancel()
        await trio.testing.wait_all_tasks_blocked()
        store.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert store.calls == [["a"], ["c"]]  # "b" was never sent


async def test_a_failed_call_fails_each_of_its_writes(autojump_clock: Any) -> None:
    store = Store()
    store.fail = ValueError("boom")
    combiner = Combiner(store.flush, lambda: None, closed)
    seen: list[BaseException] = []

    async def write(key: str) -> None:
        try:
            await combiner.submit(key, key)
        except ValueError as exc:
            seen.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(combiner.run)
        for key in "ab":
            nursery.start_soon(write, key)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert [str(e) for e in seen] == ["boom", "boom"]


@pytest.mark.parametrize("exit_error", [True, False])
async def test_closing_answers_the_call_in_flight_and_the_queue(
    autojump_clock: Any, exit_error: bool
) -> None:
    """The flusher cancelled mid-call: that call's writes hear ``in_flight_error``;
    the writes still queued hear ``exit_error`` (or wait for the driver's
    ``fail_pending``, the PostgreSQL driver's way)."""
    store = Store()
    store.gate = trio.Event()  # never set: the first call hangs
    combiner = Combiner(
        store.flush,
        lambda: None,
        lambda: RuntimeError("in flight"),
        exit_error=(lambda: RuntimeError("queued")) if exit_error else None,
    )
    heard: dict[str, str] = {}

    async def write(key: str) -> None:
        try:
            await combiner.submit(key, key)
        except RuntimeError as exc:
            heard[key] = str(exc)

    async with trio.open_nursery() as writers:
        async with trio.open_nursery() as service:
            service.start_soon(combiner.run)
            writers.start_soon(write, "a")
            await trio.testing.wait_all_tasks_blocked()
            writers.start_soon(write, "b")
            await trio.testing.wait_all_tasks_blocked()
            service.cancel_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        if exit_error:
            assert heard == {"a": "in flight", "b": "queued"}
        else:
            assert heard == {"a": "in flight"}
            combiner.fail_pending(RuntimeError("closed by the driver"))
            await trio.testing.wait_all_tasks_blocked()
            assert heard == {"a": "in flight", "b": "closed by the driver"}
    assert store.calls == [["a"]]


async def test_a_closed_driver_refuses_before_queueing() -> None:
    def check() -> None:
        raise RuntimeError("not open")

    store = Store()
    combiner = Combiner(store.flush, check, closed)
    with pytest.raises(RuntimeError, match="not open"):
        await combiner.submit("a", "a")
    assert store.calls == []


def stopped() -> BaseException:
    return RuntimeError("stopped")


def hung() -> BaseException:
    return RuntimeError("hung")


def shielded(store: Store, budget: float = 10.0) -> Combiner:
    return Combiner(
        store.flush, lambda: None, closed, exit_error=stopped, budget=budget, hung_error=hung
    )


async def test_a_shielded_write_outlives_a_cancel_of_its_waiter(autojump_clock: Any) -> None:
    store = Store()
    store.gate = trio.Event()
    combiner = shielded(store)
    seen: dict[str, list[object]] = {"a": [], "b": []}

    async def write(key: str) -> None:
        with trio.CancelScope() as scope:
            scope.cancel()  # cancelled before it even queues
            seen[key].append(await combiner.submit_shielded(key, key))
            seen[key].append("answered before the cancel")
            await trio.lowlevel.checkpoint()
            seen[key].append("unreachable")
        seen[key].append(scope.cancelled_caught)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(combiner.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(write, "a")
        nursery.start_soon(write, "b")
        await trio.testing.wait_all_tasks_blocked()
        assert seen == {"a": [], "b": []}  # both wait on, in the call, past their cancels
        store.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert sorted(item for call in store.calls for item in call) == ["a", "b"]
    assert seen == {key: [True, "answered before the cancel", True] for key in "ab"}


async def test_a_call_past_the_budget_answers_its_batch_hung(autojump_clock: Any) -> None:
    store = Store()
    store.gate = trio.Event()  # never set: the call hangs
    combiner = shielded(store, budget=3.0)
    errors: list[str] = []
    answered = trio.Event()

    async def write(key: str) -> None:
        try:
            await combiner.submit_shielded(key, key)
        except RuntimeError as exc:
            errors.append(str(exc))
        if len(errors) == 2:
            answered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(combiner.run)
        await trio.testing.wait_all_tasks_blocked()
        began = trio.current_time()
        nursery.start_soon(write, "a")
        nursery.start_soon(write, "b")
        await answered.wait()
        waited = trio.current_time() - began
        store.gate.set()
        # the flusher goes on: the next write lands
        assert await combiner.submit_shielded("c", "c")
        nursery.cancel_scope.cancel()
    assert errors == ["hung", "hung"]
    assert waited == 3.0  # MockClock time: the budget, not a hang


async def test_a_stopped_writer_answers_its_queue_and_refuses_new_shielded_writes(
    autojump_clock: Any,
) -> None:
    store = Store()
    store.gate = trio.Event()
    combiner = shielded(store)
    errors: list[str] = []

    async def write(key: str) -> None:
        try:
            await combiner.submit_shielded(key, key)
        except RuntimeError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        with pytest.raises(RuntimeError, match="closed"):
            await combiner.submit_shielded("early", "early")  # no flusher yet
        async with trio.open_nursery() as service:
            service.start_soon(combiner.run)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(write, "a")
            await trio.testing.wait_all_tasks_blocked()  # "a" is in flight
            nursery.start_soon(write, "b")
            await trio.testing.wait_all_tasks_blocked()  # "b" is queued
            service.cancel_scope.cancel()  # the flusher stops
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError, match="closed"):
            await combiner.submit_shielded("late", "late")
    assert sorted(errors) == ["closed", "stopped"]  # in flight, then queued
