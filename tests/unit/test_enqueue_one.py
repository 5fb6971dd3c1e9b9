"""A single enqueue (``Job.enqueue``, ``enqueue_as``) stages its row through
``stage_one``, the batch (``enqueue_many``, ``step.invoke``) through
``stage_requests``: the one must stage exactly what the other stages for a batch
of one, and refuse exactly what it refuses, in the same order (spec "The fluent
surface", "Idempotency is in the type signature"; benchmarks/README.md on why a
single enqueue has its own path).
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@attrs.frozen
class Order:
    org_id: str
    n: int = 0


async def _noop(ctx: JobContext[Any]) -> None:
    return None


plain = job(name="one.plain", input=int, idempotency_key=lambda i: f"k{i}")(_noop)
texts = job(name="one.text", input=str, idempotency_key=lambda s: f"t{len(s)}")(_noop)
orders = job(
    name="one.orders",
    input=Order,
    tenant=lambda o: o.org_id,
    idempotency_key=lambda o: f"o{o.n}",
    concurrency=Concurrency(1, key=lambda o: f"c{o.n}"),
)(_noop)
no_input = job(name="one.none", input=None, idempotency_key=lambda _: "only")(_noop)
debounced = job(name="one.debounced", input=int, idempotency_key=lambda i: "d", debounce="5s")(
    _noop
)

HANDLES = {
    "plain": plain,
    "texts": texts,
    "orders": orders,
    "none": no_input,
    "debounced": debounced,
}

#: (handle, input, options): every option a single enqueue takes, and inputs of
#: each shape (a native int, a str, an attrs class, None, a dict to structure).
CASES: list[tuple[str, Any, dict[str, Any]]] = [
    ("plain", 7, {}),
    ("plain", -(2**63), {}),
    ("plain", 7, {"run_id": "0191c6a2-6c1e-4a3b-9f0e-0123456789ab"}),
    ("plain", 7, {"run_id": uuid.UUID("0191c6a2-6c1e-4a3b-9f0e-0123456789ab")}),
    ("plain", 7, {"delay": "90s"}),
    ("plain", 7, {"delay": 0}),
    ("plain", 7, {"run_at": datetime(2030, 1, 2, tzinfo=UTC)}),
    ("plain", 7, {"run_at": 1_900_000_000.5}),
    ("plain", 7, {"priority": -5}),
    ("plain", 7, {"tenant_id": "org-z"}),
    ("plain", 7, {"actor": Actor("u1", org_id="org-q", permissions=frozenset({"b", "a"}))}),
    ("plain", 7, {"actor": None}),
    ("texts", "héllo \u2603", {}),
    ("orders", Order("org-a", 3), {}),
    ("orders", {"org_id": "org-a", "n": 4}, {}),
    ("orders", Order("org-a", 3), {"tenant_id": "org-a"}),
    ("orders", Order("org-a", 3), {"actor": Actor("u2", org_id="org-a")}),
    ("none", None, {}),
    ("debounced", 1, {}),
]

#: Refusals: each must be the same JobsError (code and message) either way.
BAD: list[tuple[str, Any, dict[str, Any]]] = [
    ("plain", "7", {}),
    ("plain", 2**64, {}),
    ("plain", True, {}),
    ("plain", 7, {"delay": "1s", "run_at": 1_900_000_000.0}),
    ("plain", 7, {"delay": "soon"}),
    ("plain", 7, {"delay": -1}),
    ("plain", 7, {"run_at": math.nan}),
    ("plain", 7, {"run_at": datetime(2030, 1, 2)}),  # noqa: DTZ001 — naive: refused
    ("plain", 7, {"priority": 2**40}),
    ("plain", 7, {"priority": True}),
    ("plain", 7, {"tenant_id": ""}),
    ("plain", 7, {"tenant_id": "a\x00b"}),
    ("plain", 7, {"run_id": "0191C6A2-6C1E-4A3B-9F0E-0123456789AB"}),
    ("plain", 7, {"run_id": "nope"}),
    ("plain", 7, {"actor": "u1"}),
    ("texts", "a\ud800b", {}),
    ("orders", {"org_id": "org-a", "n": "x"}, {}),
    ("orders", {"org_id": "org-a", "extra": 1}, {}),
    ("orders", Order("org-a", 3), {"tenant_id": "org-b"}),
    ("orders", Order("org-a", 3), {"actor": Actor("u2", org_id="org-b")}),
    ("none", 1, {}),
    ("debounced", 1, {"delay": "1s"}),
]


def _options(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "delay": options.get("delay"),
        "run_at": options.get("run_at"),
        "tenant_id": options.get("tenant_id"),
        "priority": options.get("priority", 0),
        "actor": options.get("actor", _MISSING),
    }


def _both(
    handle: Any, raw: Any, options: dict[str, Any]
) -> tuple[Callable[[], Any], Callable[[], Any]]:
    facade = _ambient.facade_var.get()
    assert facade is not None
    run_id = options.get("run_id")

    def one() -> Any:
        return stage_one(facade, handle, raw, run_id=run_id, **_options(options))

    def batch() -> Any:
        (staged,) = stage_requests(facade, handle, [raw], run_ids=[run_id], **_options(options))
        return staged

    return one, batch


@pytest.mark.parametrize(("handle", "raw", "options"), CASES)
async def test_a_single_enqueue_stages_what_a_batch_of_one_stages(
    handle: str, raw: Any, options: dict[str, Any]
) -> None:
    # A seeded id source: the ids themselves must match too (the simulation's
    # traces depend on which draw each id is).
    async with open_jobs(memory_driver(), jobs=list(HANDLES.values()), ids=UuidSource(3)):
        one, _ = _both(HANDLES[handle], raw, options)
        single = one()
    async with open_jobs(memory_driver(), jobs=list(HANDLES.values()), ids=UuidSource(3)):
        _, batch = _both(HANDLES[handle], raw, options)
        staged = batch()
    assert single == staged
    if "run_id" in options:
        assert single.run_id == str(options["run_id"])


@pytest.mark.parametrize(("handle", "raw", "options"), CASES)
async def test_unseeded_a_single_enqueue_differs_from_a_batch_of_one_only_in_its_fresh_ids(
    handle: str, raw: Any, options: dict[str, Any]
) -> None:
    async with open_jobs(memory_driver(), jobs=list(HANDLES.values())):
        one, batch = _both(HANDLES[handle], raw, options)
        single, staged = one(), batch()
    fresh = {"id": single.id} if "run_id" in options else {"id": single.id, "run_id": single.run_id}
    assert attrs.evolve(staged, **fresh) == single
    for value in fresh.values():
        parsed = uuid.UUID(value)
        assert str(parsed) == value
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


@pytest.mark.parametrize(("handle", "raw", "options"), BAD)
async def test_a_single_enqueue_refuses_what_a_batch_of_one_refuses(
    handle: str, raw: Any, options: dict[str, Any]
) -> None:
    async with open_jobs(memory_driver(), jobs=list(HANDLES.values())):
        one, batch = _both(HANDLES[handle], raw, options)
        with pytest.raises(JobsError) as single:
            one()
        with pytest.raises(JobsError) as staged:
            batch()
    assert (single.value.code, single.value.message) == (staged.value.code, staged.value.message)


@pytest.mark.parametrize(("handle", "raw", "options"), BAD)
async def test_a_refused_single_enqueue_writes_nothing(
    handle: str, raw: Any, options: dict[str, Any]
) -> None:
    driver = memory_driver()
    async with open_jobs(driver, jobs=list(HANDLES.values())):
        h = HANDLES[handle]
        if "actor" in options:
            rest = {k: v for k, v in options.items() if k != "actor"}
            with pytest.raises(JobsError):
                await h.enqueue_as(options["actor"], raw, **rest)
        else:
            with pytest.raises(JobsError):
                await h.enqueue(raw, **options)
        assert driver._rows == {}


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(), st.text(max_size=40), st.booleans(), st.none(), st.floats()))
async def test_any_input_stages_or_refuses_the_same_either_way(raw: Any) -> None:
    async with open_jobs(memory_driver(), jobs=list(HANDLES.values()), ids=UuidSource(5)):
        for handle in (plain, texts):
            one, _ = _both(handle, raw, {})
            try:
                got: Any = one()
            except JobsError as exc:
                got = (exc.code, exc.message)
            _ambient.facade_var.get().ids = UuidSource(5)  # type: ignore[union-attr]
            _, batch = _both(handle, raw, {})
            try:
                want: Any = batch()
            except JobsError as exc:
                want = (exc.code, exc.message)
            _ambient.facade_var.get().ids = UuidSource(5)  # type: ignore[union-attr]
            assert got == want


def test_a_pair_of_fresh_ids_is_two_distinct_canonical_uuid4s_over_all_their_random_digits() -> (
    None
):
    source = UuidSource()
    pairs = [source.new_pair() for _ in range(2000)]
    ids = [i for pair in pairs for i in pair]
    assert len(set(ids)) == len(ids)
    for value in ids:
        parsed = uuid.UUID(value)
        assert str(parsed) == value
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
    # The first seven digits count up by one from id to id (a pair is two
    # steps of the source's counter), the eighth is their check digit; every
    # later digit but the version's takes many values (no position fixed by
    # the layout), the variant digit each of its four.
    counters = [int(value[:7], 16) for value in ids]
    assert [(b - a) % 2**28 for a, b in itertools.pairwise(counters)] == [1] * (len(ids) - 1)
    assert all(map(_checks, ids))
    for position in range(9, 36):
        seen = {value[position] for value in ids}
        if position in (13, 18, 23):
            assert seen == {"-"}
        elif position == 14:
            assert seen == {"4"}
        elif position == 19:
            assert seen == set("89ab")
        else:
            assert len(seen) == 16, position


def test_the_counter_in_a_fresh_id_wraps_from_its_top_to_zero_in_every_kind_of_call() -> None:
    for make in (
        lambda s: [s.new_id() for _ in range(4)],
        lambda s: [i for _ in range(2) for i in s.new_pair()],
        lambda s: s.new_ids(4),
        lambda s: s.new_ids(100)[:4],
    ):
        source = UuidSource()
        source._count = 2**28 - 2
        ids = make(source)
        assert [value[:7] for value in ids] == ["ffffffe", "fffffff", "0000000", "0000001"]
        assert all(map(_checks, ids))
        for value in ids:
            parsed = uuid.UUID(value)
            assert str(parsed) == value
            assert parsed.version == 4
            assert parsed.variant == uuid.RFC_4122


def _checks(value: str) -> bool:
    """The check digit's rule, written out: the first eight digits weighted 1,
    3, 1, 3, ... from the eighth (the check digit) back sum to 0 mod 16."""
    return (
        sum((1 if (7 - i) % 2 == 0 else 3) * int(ch, 16) for i, ch in enumerate(value[:8])) % 16
        == 0
    )


def test_a_short_id_mistyped_by_one_digit_names_no_other_id_of_the_process() -> None:
    # An operator types the 8-digit short id: a counter alone would make the
    # id before or after a one-digit typo away (…c4, …c5). The check digit
    # turns every one-digit typo, and most swaps of two neighbours, into a
    # short id that no id of this process has.
    source = UuidSource()
    ids = source.new_ids(3000) + [i for _ in range(500) for i in source.new_pair()]
    ids += [source.new_id() for _ in range(500)]
    shorts = {value[:8] for value in ids}
    assert len(shorts) == len(ids)
    swaps = caught = 0
    for value in ids[::40]:
        short = value[:8]
        for i in range(8):
            for digit in "0123456789abcdef":
                if digit != short[i]:
                    typo = short[:i] + digit + short[i + 1 :]
                    assert typo not in shorts, (short, typo)
                    assert not _checks(typo)
        for i in range(7):
            if short[i] != short[i + 1]:
                swapped = short[:i] + short[i + 1] + short[i] + short[i + 2 :]
                swaps += 1
                caught += swapped not in shorts
    assert caught >= 0.85 * swaps  # all but neighbours 8 apart (1 in 15)


def test_two_fresh_sources_count_from_unrelated_starts() -> None:
    # Each process's source starts its counter at random: two processes' ids
    # land in two places of the index, and their short ids do not step on each
    # other's (the chance that 32 starts meet in the top 16 bits is under 1%).
    starts = {UuidSource().new_id()[:4] for _ in range(32)}
    assert len(starts) >= 30


def test_a_seeded_pair_is_the_next_two_ids_of_the_stream() -> None:
    a, b = UuidSource(9), UuidSource(9)
    assert a.new_pair() == (b.new_id(), b.new_id())
    assert a.new_ids(3) == [b.new_id(), b.new_id(), b.new_id()]


@pytest.mark.parametrize(
    ("handle", "inputs"),
    [
        ("plain", [1, 2, -(2**63), 2**64 - 1, 5]),
        ("texts", ["a", "é", ""]),
        ("plain", [1, 2, "3"]),  # a refusal in the middle of the batch
        ("plain", [1, 2**64]),
    ],
)
async def test_a_batch_stages_each_input_as_a_single_enqueue_stages_it(
    handle: str, inputs: list[Any]
) -> None:
    h = HANDLES[handle]
    async with open_jobs(memory_driver(), jobs=list(HANDLES.values())):
        facade = _ambient.facade_var.get()
        assert facade is not None
        options = _options({})
        try:
            batch: Any = stage_requests(facade, h, inputs, run_ids=[None] * len(inputs), **options)
        except JobsError as exc:
            batch = (exc.code, exc.message)
        try:
            singles: Any = [stage_one(facade, h, raw, run_id=None, **options) for raw in inputs]
        except JobsError as exc:
            singles = (exc.code, exc.message)
    if isinstance(singles, tuple):
        assert batch == singles
        return
    assert [attrs.evolve(b, id="", run_id="") for b in batch] == [
        attrs.evolve(s, id="", run_id="") for s in singles
    ]
    ids = [b.id for b in batch] + [b.run_id for b in batch]
    assert len(set(ids)) == len(ids)
