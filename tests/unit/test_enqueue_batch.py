"""``enqueue_many`` stages its inputs as columns (``EnqueueBatch``): the
PostgreSQL driver reads the columns, every other driver reads the batch as the
``Sequence[EnqueueRequest]`` the driver protocol names. That view must be
exactly the requests a row-by-row staging (``stage_one`` per input) makes, ids
included from a seeded source, and a batch must refuse what the first refused
row refuses (benchmarks/README.md, issue 13 part 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest

from trio_jobs import (
    Actor,
    Concurrency,
    JobContext,
    JobsError,
    _ambient,
    job,
    memory_driver,
    open_jobs,
)
from trio_jobs._enqueue import _MISSING, stage_one, stage_requests
from trio_jobs._time import UuidSource
from trio_jobs.drivers import EnqueueRequest, EnqueueResult
from trio_jobs.drivers._protocol import EnqueueBatch
from trio_jobs.drivers.memory import MemoryDriver


@attrs.frozen
class Order:
    org_id: str
    n: int = 0


async def _noop(ctx: JobContext[Any]) -> None:
    return None


plain = job(name="batch.plain", input=int, idempotency_key=lambda i: f"k{i}")(_noop)
flags = job(name="batch.flags", input=bool, idempotency_key=lambda b: f"f{b}")(_noop)
texts = job(name="batch.text", input=str, idempotency_key=lambda s: f"t{s}")(_noop)
orders = job(
    name="batch.orders",
    input=Order,
    tenant=lambda o: o.org_id,
    idempotency_key=lambda o: f"o{o.n}",
    concurrency=Concurrency(1, key=lambda o: f"c{o.n % 2}"),
)(_noop)
sensitive = job(
    name="batch.sensitive", input=int, idempotency_key=lambda i: f"s{i}", sensitive=True
)(_noop)
HANDLES = [plain, flags, texts, orders, sensitive]

ORG_A = [Order("org-a", n) for n in range(5)]
MIXED_ORGS = [Order("org-a", 1), {"org_id": "org-b", "n": 2}, Order("org-a", 1)]
RUN_ID = "0191c6a2-6c1e-4a3b-9f0e-0123456789ab"

#: (handle, inputs, run ids or None, options): batches of each shape the
#: staging takes (the all-native fast path, parsed inputs, tenants, concurrency
#: keys, run ids, per-call options, an actor).
CASES: list[tuple[Any, list[Any], list[Any] | None, dict[str, Any]]] = [
    (plain, list(range(7)), None, {}),
    (plain, [3, 3, 4], None, {}),  # a shared key: two rows, one job
    (plain, [-(2**63), 2**64 - 1, 0], None, {}),
    (plain, list(range(4)), None, {"delay": "90s", "priority": 3}),
    (plain, list(range(4)), None, {"run_at": 1_900_000_000.5}),
    (plain, list(range(3)), [None, RUN_ID, None], {}),
    (plain, list(range(3)), None, {"tenant_id": "org-z"}),
    (plain, list(range(3)), None, {"actor": Actor("u1", org_id="org-q")}),
    (plain, list(range(3)), None, {"actor": None}),
    (flags, [True, False, True], None, {}),
    (texts, ["a", "héllo \u2603", ""], None, {}),
    (orders, ORG_A, None, {}),
    (orders, MIXED_ORGS, None, {}),
    (orders, ORG_A, None, {"tenant_id": "org-a"}),
    (sensitive, list(range(3)), None, {}),
]


def _options(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "delay": options.get("delay"),
        "run_at": options.get("run_at"),
        "tenant_id": options.get("tenant_id"),
        "priority": options.get("priority", 0),
        "actor": options.get("actor", _MISSING),
    }


def _staged(handle: Any, inputs: list[Any], run_ids: list[Any] | None, options: Any) -> Any:
    facade = _ambient.facade_var.get()
    assert facade is not None
    rids = run_ids if run_ids is not None else [None] * len(inputs)
    return stage_requests(facade, handle, inputs, run_ids=rids, **_options(options))


def _row_by_row(
    handle: Any, inputs: list[Any], run_ids: list[Any] | None, options: Any
) -> list[EnqueueRequest]:
    facade = _ambient.facade_var.get()
    assert facade is not None
    rids = run_ids if run_ids is not None else [None] * len(inputs)
    return [
        stage_one(facade, handle, raw, run_id=rid, **_options(options))
        for raw, rid in zip(inputs, rids, strict=True)
    ]


@pytest.mark.parametrize(("handle", "inputs", "run_ids", "options"), CASES)
async def test_the_batch_reads_as_the_requests_a_row_by_row_staging_makes(
    handle: Any, inputs: list[Any], run_ids: list[Any] | None, options: dict[str, Any]
) -> None:
    # Seeded: the ids must be the same draws too (the simulation's traces
    # depend on which draw each id is).
    async with open_jobs(memory_driver(), jobs=HANDLES, ids=UuidSource(11)):
        want = _row_by_row(handle, inputs, run_ids, options)
    async with open_jobs(memory_driver(), jobs=HANDLES, ids=UuidSource(11)):
        batch = _staged(handle, inputs, run_ids, options)
    assert isinstance(batch, EnqueueBatch)
    assert isinstance(batch, Sequence)
    assert len(batch) == len(want)
    assert list(batch) == want
    assert [batch[i] for i in range(len(batch))] == want
    assert batch[-1] == want[-1]
    assert batch == want
    for part in (slice(1, None), slice(None, 2), slice(None, None, 2), slice(5, 9)):
        piece = batch[part]
        assert isinstance(piece, EnqueueBatch)
        assert list(piece) == want[part]
        assert len(piece) == len(want[part])
    assert batch.index(want[1]) == 1
    assert want[0] in batch


@pytest.mark.parametrize(("handle", "inputs", "run_ids", "options"), CASES)
async def test_unseeded_the_batch_differs_from_row_by_row_only_in_its_fresh_ids(
    handle: Any, inputs: list[Any], run_ids: list[Any] | None, options: dict[str, Any]
) -> None:
    # Unseeded: the common batch takes the staging's fast path (ids from one
    # draw, native inputs as their own payloads).
    async with open_jobs(memory_driver(), jobs=HANDLES):
        want = _row_by_row(handle, inputs, run_ids, options)
        batch = _staged(handle, inputs, run_ids, options)
    fresh = batch.ids + [
        r
        for r, given in zip(batch.run_ids, run_ids or [None] * len(batch), strict=True)
        if given is None
    ]
    assert len(set(fresh)) == len(fresh)
    for staged, one, given in zip(batch, want, run_ids or [None] * len(batch), strict=True):
        assert attrs.evolve(staged, id=one.id, run_id=one.run_id) == one
        if given is not None:
            assert staged.run_id == one.run_id == given


def test_the_requests_are_made_once_and_a_slice_keeps_them() -> None:
    batch = EnqueueBatch(
        ids=["a", "b", "c"],
        run_ids=["ra", "rb", "rc"],
        payloads=[1, 2, 3],
        idempotency_keys=["k1", "k2", "k3"],
        tenant_ids=None,
        concurrency_keys=None,
        name="n",
        queue="q",
        max_attempts=3,
        priority=0,
        run_at=None,
        delay=None,
        actor=None,
        trace_context=None,
        sensitive=False,
        debounce=None,
        unique_for=None,
    )
    first = batch[0]
    assert batch[0] is first
    assert next(iter(batch)) is first
    assert batch[0:2][0] is first
    assert batch[1:][0] is batch[1]
    assert list(reversed(batch)) == [batch[2], batch[1], batch[0]]
    assert batch[0] == EnqueueRequest(
        id="a", run_id="ra", name="n", queue="q", payload=1, idempotency_key="k1", max_attempts=3
    )
    assert batch[1:] != batch
    assert len(batch[3:]) == 0
    assert not batch[3:]
    with pytest.raises(IndexError):
        batch[3]


#: Batches refused at one row: the refusal must be that row's, as staging row by
#: row raises it (the fast path included: native inputs, no options).
REFUSED: list[tuple[Any, list[Any]]] = [
    (plain, [1, 2, 2**64, 3]),
    (plain, [1, True, 2]),
    (plain, [1, "2", 2**64]),
    (flags, [True, 1]),
    (texts, ["a", "b\ud800", "c"]),
    (orders, [Order("org-a", 1), {"org_id": "org-a", "n": "x"}]),
]


@pytest.mark.parametrize(("handle", "inputs"), REFUSED)
async def test_a_refused_batch_raises_its_first_refused_rows_error(
    handle: Any, inputs: list[Any]
) -> None:
    async with open_jobs(memory_driver(), jobs=HANDLES):
        with pytest.raises(JobsError) as batch:
            _staged(handle, inputs, None, {})
        with pytest.raises(JobsError) as one:
            _row_by_row(handle, inputs, None, {})
    assert (batch.value.code, batch.value.message) == (one.value.code, one.value.message)


async def test_a_key_refused_on_an_earlier_row_wins_over_a_key_function_raising_later() -> None:
    def key(i: int) -> str:
        if i == 3:
            raise RuntimeError("the key function failed")
        return "" if i == 1 else f"k{i}"

    keyed = job(name="batch.keyed", input=int, idempotency_key=key)(_noop)
    async with open_jobs(memory_driver(), jobs=[keyed]):
        with pytest.raises(JobsError) as batch:
            _staged(keyed, [0, 1, 2, 3], None, {})
        with pytest.raises(JobsError) as one:
            _row_by_row(keyed, [0, 1, 2, 3], None, {})
        assert (batch.value.code, batch.value.message) == (one.value.code, one.value.message)
        with pytest.raises(RuntimeError, match="the key function failed"):
            _staged(keyed, [0, 2, 3, 1], None, {})


class ListingDriver(MemoryDriver):
    """A driver that reads its requests the ways third-party drivers do."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[type, list[EnqueueRequest]]] = []

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        listed = list(requests)
        assert [requests[i] for i in range(len(requests))] == listed
        self.seen.append((type(requests), listed))
        return await super().enqueue_many(listed)


async def test_a_driver_reading_requests_gets_each_chunk_as_requests() -> None:
    driver = ListingDriver()
    async with open_jobs(driver, jobs=HANDLES, ids=UuidSource(4)):
        got = await plain.enqueue_many(range(2500))
    async with open_jobs(memory_driver(), jobs=HANDLES, ids=UuidSource(4)):
        want = _row_by_row(plain, list(range(2500)), None, {})
    assert [(kind, len(rows)) for kind, rows in driver.seen] == [
        (EnqueueBatch, 1000),
        (EnqueueBatch, 1000),
        (EnqueueBatch, 500),
    ]
    assert [r for _, rows in driver.seen for r in rows] == want
    assert [(e.id, e.run_id, e.deduped) for e in got] == [(r.id, r.run_id, False) for r in want]
