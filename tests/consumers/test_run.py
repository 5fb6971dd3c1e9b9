"""PYTHON-API.md, "Consumers — consumer()", on the memory driver: one run per key
reads its stream from the committed cursor in batches of at most ``batch``; a
part-filled batch commits after 50 ms without a next item; ``handle`` and
``save_cursor`` commit or fail together (the memory driver refuses
``tx.execute``); ``arm()`` and the supervisor enqueue one run per key; a drain
stops at a batch boundary uncounted; ``handle`` or ``open`` enqueuing the
consumer itself is terminal ``X_CONSUMER_SELF_ENQUEUE``; ``jobs.show(id)``
answers ``.consumer``. Delivery is at least once."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
import trio

from jobs_support import jobs_on_memory, running_worker, wait_for
from trio_jobs import ConsumerBatch, ErrorCode, JobContext, JobsError, Retry, job
from trio_jobs.testing import crash_proof, open_harness

from .world import Stream, TxStream


@attrs.frozen
class Marker:
    key: str
    last: int


@job(input=Marker, idempotency_key=lambda m: f"marker:{m.key}:{m.last}")
async def marker(ctx: JobContext[Marker]) -> None:
    return None


async def test_a_run_reads_its_stream_in_batches_and_saves_each_cursor(
    autojump_clock: Any,
) -> None:
    stream = Stream(a=list(range(10)))
    sync = stream.consumer()
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "a")
        view = await h.jobs.show(trace.job_id)
    assert trace.state == "done"
    assert trace.result == {"batches": 3, "items": 10}
    assert stream.batches == [
        ("a", [0, 1, 2, 3], None),
        ("a", [4, 5, 6, 7], "3"),
        ("a", [8, 9], "7"),
    ]
    assert stream.cursors == {"a": "9"}
    assert stream.opened == [("a", None)]
    # one rolling step record: the last batch's
    assert list(trace.steps) == ["batch"]
    assert trace.steps["batch"].executions == 3
    assert trace.steps["batch"].output == {"cursor": "9", "batches": 3, "items": 10}
    assert view.idempotency_key == "consumer:sync:a"
    assert view.concurrency_key == "a"
    assert view.consumer is not None
    assert view.consumer["key"] == "a"
    assert view.consumer["lag"] is None
    assert view.consumer["last_batch_at"] == view.steps[0].ended_at
    assert view.consumer["last_batch_at"] is not None


async def test_a_part_filled_batch_commits_after_50_ms_without_a_next_item(
    autojump_clock: Any,
) -> None:
    stream = Stream(a=list(range(9)))
    stream.gaps = {3: 0.051, 4: 0.049, 5: 0.049, 6: 1.0, 7: 0.01}
    sync = stream.consumer(batch=10)
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "a")
    assert trace.state == "done"
    assert [items for _k, items, _c in stream.batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


async def test_a_new_run_starts_at_the_committed_cursor(autojump_clock: Any) -> None:
    stream = Stream(a=list(range(10)))
    stream.cursors["a"] = "5"
    sync = stream.consumer()
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "a")
    assert trace.result == {"batches": 1, "items": 4}
    assert stream.opened == [("a", "5")]
    assert stream.batches == [("a", [6, 7, 8, 9], "5")]


async def test_a_failed_handle_commits_nothing_of_its_batch_and_it_is_delivered_again(
    autojump_clock: Any,
) -> None:
    stream = Stream(a=list(range(10)))
    failed: list[int] = []

    async def handle(batch: ConsumerBatch) -> str:
        await marker.enqueue(Marker(batch.key, batch.items[-1]))  # joins batch.tx
        if 4 in batch.items and not failed:
            failed.append(4)
            raise RuntimeError("the warehouse API said no")
        return await stream.handle(batch)

    sync = stream.consumer(handle=handle)
    async with open_harness(jobs=[sync, marker]) as h:
        trace = await h.run(sync, "a")
        page = await h.jobs.list(name=marker.name)
    assert trace.state == "done"
    assert trace.attempts == 2
    assert stream.cursors == {"a": "9"}
    # the second attempt resumed at the committed cursor: the failed batch again
    assert stream.opened == [("a", None), ("a", "3")]
    assert stream.handled == list(range(10))
    # the failed batch's enqueue rolled back with it: one marker per committed batch
    assert sorted(v.payload["last"] for v in page.rows) == [3, 7, 9]


async def test_a_failed_save_rolls_back_what_handle_staged(autojump_clock: Any) -> None:
    stream = Stream(a=list(range(8)))
    saves: list[str] = []

    async def handle(batch: ConsumerBatch) -> str:
        await marker.enqueue(Marker(batch.key, batch.items[-1]))
        return await stream.handle(batch)

    def save(key: str, cursor: str, tx: Any) -> None:
        saves.append(cursor)
        if len(saves) == 2:
            raise RuntimeError("the cursor table is locked")
        stream.save_cursor(key, cursor, tx)

    sync = stream.consumer(handle=handle, save_cursor=save)
    async with open_harness(jobs=[sync, marker]) as h:
        trace = await h.run(sync, "a")
        page = await h.jobs.list(name=marker.name)
    assert trace.state == "done"
    assert saves == ["3", "7", "7"]
    assert stream.cursors == {"a": "7"}
    assert sorted(v.payload["last"] for v in page.rows) == [3, 7]
    assert [items for _k, items, _c in stream.batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]]


async def test_the_memory_driver_refuses_tx_execute(autojump_clock: Any) -> None:
    stream = Stream(a=[1])

    async def handle(batch: ConsumerBatch) -> str:
        await batch.tx.execute("insert into orders values (%s)", (1,))
        return "1"

    sync = stream.consumer(handle=handle, retry=Retry(attempts=1))
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "a")
    assert trace.state == "dead"
    assert trace.error_code == ErrorCode.X_NOT_IMPLEMENTED
    assert stream.cursors == {}


@pytest.mark.parametrize("where", ["handle", "open", "arm"])
async def test_enqueuing_the_consumer_itself_is_terminal(where: str, autojump_clock: Any) -> None:
    stream = Stream(a=[1, 2])
    holder: list[Any] = []

    async def handle(batch: ConsumerBatch) -> str:
        if where == "arm":
            await holder[0].arm()
        else:
            await holder[0].enqueue(batch.key)
        return "2"

    async def open_(key: str, cursor: str | None, signal: Any) -> Any:
        if where == "open":
            await holder[0].enqueue("b")
        return stream.open(key, cursor, signal)

    sync = stream.consumer(handle=handle, open=open_)
    holder.append(sync)
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "a")
        page = await h.jobs.list(name=sync.name)
    assert trace.state == "dead"
    assert trace.attempts == 1  # terminal: not retried
    assert trace.error_code == ErrorCode.X_CONSUMER_SELF_ENQUEUE
    assert stream.cursors == {}
    assert len(page.rows) == 1


async def test_arm_enqueues_one_run_per_key_and_a_running_key_dedupes(
    autojump_clock: Any,
) -> None:
    stream = Stream(a=[1, 2], b=[5], c=[])
    sync = stream.consumer(keys=lambda: ["a", "b", "c", "a"])
    async with open_harness(jobs=[sync]) as h:
        first = await sync.arm()
        again = await sync.arm()
        assert [e.deduped for e in first] == [False, False, False]
        assert [e.deduped for e in again] == [True, True, True]
        assert [e.id for e in again] == [e.id for e in first]
        await h.drain()
        views = [await h.jobs.show(e.id) for e in first]
    assert [v.state for v in views] == ["done", "done", "done"]
    assert [v.payload for v in views] == ["a", "b", "c"]
    assert stream.cursors == {"a": "2", "b": "5"}


async def test_keys_that_cannot_run_arm_nothing(autojump_clock: Any) -> None:
    stream = Stream(a=[1])
    sync = stream.consumer(keys=lambda: ["a", "", 7, "x" * 201, "b\x00"])
    async with open_harness(jobs=[sync]) as h:
        with pytest.raises(JobsError) as caught:
            await sync.arm()
        page = await h.jobs.list(name=sync.name)
    assert caught.value.code == ErrorCode.X_CONSUMER_INVALID
    assert [f.split(" ", 2)[1] for f in caught.value.meta["faults"]] == ["1", "2", "3", "4"]
    assert page.rows == []
    not_a_list = stream.consumer(name="other", keys=lambda: "acct-1")
    async with open_harness(jobs=[not_a_list]):
        with pytest.raises(JobsError) as caught:
            await not_a_list.arm()
    assert caught.value.code == ErrorCode.X_CONSUMER_INVALID


async def test_the_supervisor_arms_every_key_at_each_rearm(autojump_clock: Any) -> None:
    stream = Stream(a=[0, 1], b=[0])
    sync = stream.consumer(rearm="5m")
    start = datetime(2026, 3, 2, 9, 0, 30, tzinfo=UTC)
    async with open_harness(jobs=[sync], start=start) as h:
        await h.drain()
        assert stream.batches == []  # nothing due before 09:05 UTC
        h.clock.advance("5m")
        await h.drain()
        assert stream.cursors == {"a": "1", "b": "0"}
        arms = (await h.jobs.list(name=sync.arm_job.name)).rows
        assert [v.state for v in arms] == ["done"]
        assert arms[0].result == 2
        # new items: the next arm restarts each key at its cursor
        stream.items["a"] += [2, 3]
        h.clock.advance("5m")
        await h.drain()
        runs = (await h.jobs.list(name=sync.name)).rows
    assert stream.cursors == {"a": "3", "b": "0"}
    assert sorted(stream.opened[-2:]) == [("a", "1"), ("b", "0")]
    assert sorted(v.payload for v in runs) == ["a", "a", "b", "b"]
    assert all(v.state == "done" for v in runs)


async def test_a_drain_stops_at_a_batch_boundary_uncounted(autojump_clock: Any) -> None:
    stream = Stream(a=list(range(6)))
    stream.live = True  # after its items the stream waits for more
    sync = stream.consumer()
    async with jobs_on_memory([sync]) as (jobs, _driver):
        enqueued = await sync.enqueue("a")
        async with running_worker(jobs) as worker:
            await wait_for(lambda: stream.cursors.get("a") == "5")
            again = await sync.enqueue("a")
            assert again.deduped  # one live row per key
            await worker.drain()
        view = await jobs.show(enqueued.id)
    assert view.state == "ready"
    assert view.attempts == 0  # the drained attempt is not counted
    assert stream.cursors == {"a": "5"}
    assert stream.batches == [("a", [0, 1, 2, 3], None), ("a", [4, 5], "3")]


async def test_a_drain_in_the_middle_of_handle_rolls_its_batch_back(autojump_clock: Any) -> None:
    stream = Stream(a=list(range(8)))
    started = trio.Event()

    async def handle(batch: ConsumerBatch) -> str:
        await marker.enqueue(Marker(batch.key, batch.items[-1]))
        if 4 in batch.items:
            started.set()
            await trio.sleep_forever()
        return await stream.handle(batch)

    sync = stream.consumer(handle=handle)
    async with jobs_on_memory([sync, marker]) as (jobs, _driver):
        enqueued = await sync.enqueue("a")
        async with running_worker(jobs, queues=["default"]) as worker:
            await started.wait()
            await worker.drain()
        view = await jobs.show(enqueued.id)
        markers = (await jobs.list(name=marker.name)).rows
    assert (view.state, view.attempts) == ("ready", 0)
    assert stream.cursors == {"a": "3"}
    assert [m.payload["last"] for m in markers] == [3]


async def test_lag_is_the_runs_progress(autojump_clock: Any) -> None:
    stream = Stream(a=list(range(10)))
    seen: list[tuple[str, str | None]] = []

    def lag(key: str, cursor: str | None) -> int:
        seen.append((key, cursor))
        return 9 - int(cursor or -1)

    sync = stream.consumer(lag=lag)
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "a")
        view = await h.jobs.show(trace.job_id)
    assert seen == [("a", "3"), ("a", "7"), ("a", "9")]
    assert view.progress is not None
    assert (view.progress.done, view.progress.total) == (10, 10)
    assert view.consumer is not None
    assert view.consumer["lag"] == 0


async def test_a_failing_lag_only_informs(autojump_clock: Any, caplog: Any) -> None:
    stream = Stream(a=list(range(3)))

    def lag(key: str, cursor: str | None) -> int:
        raise RuntimeError("the vendor's count endpoint is down")

    sync = stream.consumer(lag=lag)
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "a")
        view = await h.jobs.show(trace.job_id)
    assert trace.state == "done"
    assert view.progress is None
    assert view.consumer is not None
    assert view.consumer["lag"] is None
    [record] = [r for r in caplog.records if getattr(r, "event", "") == "jobs.consumer.lag-failed"]
    assert "endpoint" not in record.getMessage()


@pytest.mark.parametrize(
    ("answer", "what"), [(3, "handle"), (None, "handle"), (b"3", "handle"), ("a\x00b", "handle")]
)
async def test_a_cursor_that_is_not_text_is_terminal(
    answer: Any, what: str, autojump_clock: Any
) -> None:
    stream = Stream(a=[1])
    sync = stream.consumer(handle=lambda batch: answer)
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "a")
    assert (trace.state, trace.attempts) == ("dead", 1)
    assert trace.error_code == ErrorCode.X_CONSUMER_INVALID
    assert stream.cursors == {}


async def test_a_stored_cursor_that_is_not_text_is_terminal(autojump_clock: Any) -> None:
    stream = Stream(a=[1])
    sync = stream.consumer(load_cursor=lambda key, tx: 5)
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "a")
    assert (trace.state, trace.error_code) == ("dead", ErrorCode.X_CONSUMER_INVALID)


async def test_open_may_answer_a_plain_iterable_and_callables_may_be_async(
    autojump_clock: Any,
) -> None:
    stream = Stream(a=[1, 2, 3])

    async def load(key: str, tx: Any) -> str | None:
        return None

    async def keys() -> list[str]:
        return ["a"]

    sync = stream.consumer(open=lambda key, cursor, signal: [7, 8, 9], load_cursor=load, keys=keys)
    async with open_harness(jobs=[sync]) as h:
        await sync.arm()
        await h.drain()
    assert stream.cursors == {"a": "9"}
    bad = stream.consumer(name="bad", open=lambda key, cursor, signal: 42, retry=Retry(attempts=1))
    async with open_harness(jobs=[bad]) as h:
        trace = await h.run(bad, "a")
    assert (trace.state, trace.error_code) == ("dead", ErrorCode.X_CONSUMER_INVALID)


async def test_the_tenant_is_a_function_of_the_key(autojump_clock: Any) -> None:
    stream = Stream(**{"acme/1": [1]})
    sync = stream.consumer(tenant=lambda key: key.split("/")[0])
    async with open_harness(jobs=[sync]) as h:
        trace = await h.run(sync, "acme/1")
        view = await h.jobs.show(trace.job_id)
    assert view.tenant_id == "acme"
    assert stream.cursors == {"acme/1": "1"}


async def test_a_killed_run_at_every_boundary_ends_with_every_item_and_the_same_cursor(
    autojump_clock: Any,
) -> None:
    stream = Stream(a=list(range(10)))
    sync = stream.consumer()
    report = await crash_proof(
        sync,
        "a",
        observe=lambda: (sorted(set(stream.handled)), dict(stream.cursors)),
        reset=stream.reset,
    )
    assert report.boundaries >= 9  # three batches, three boundaries each


async def test_crash_proof_catches_a_cursor_saved_apart_from_its_batch(
    autojump_clock: Any,
) -> None:
    from trio_jobs._planted import planted

    stream = TxStream(a=list(range(10)))
    sync = stream.consumer()
    report = await crash_proof(sync, "a", observe=stream.committed)
    assert report.boundaries >= 9
    with planted("cursor-apart"), pytest.raises(JobsError) as caught:
        await crash_proof(sync, "a", observe=stream.committed)
    assert caught.value.code == ErrorCode.X_JOB_CRASH_DIVERGED
    assert "after-fn" in caught.value.message
