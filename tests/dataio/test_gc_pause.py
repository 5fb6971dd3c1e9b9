"""The import's row loop runs with the cyclic collector paused (design-choices.md
"Data jobs"): never left off, never off across an await, never turned on where
the app turned it off."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from obstore.store import MemoryStore

from dataio_support import Load, Table, make_import, put
from trio_jobs._gc_pause import paused_gc
from trio_jobs.testing import open_harness


@pytest.fixture
def gc_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_on_again_after_an_exception(gc_on: None) -> None:
    during: list[bool] = []

    def fail() -> None:
        with paused_gc():
            during.append(gc.isenabled())
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fail()
    assert during == [False]
    assert gc.isenabled()


def test_an_app_that_turned_it_off_keeps_it_off(gc_on: None) -> None:
    gc.disable()
    with paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("boom")
    assert not gc.isenabled()


def test_a_nested_pause_does_not_turn_it_on_before_the_outer_ends(gc_on: None) -> None:
    with paused_gc():
        with paused_gc():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


@attrs.frozen
class Seen:
    id: int
    name: str
    score: float | None
    active: bool = attrs.field()

    @active.validator
    def _record(self, _a: Any, _v: Any) -> None:
        SEEN.append(gc.isenabled())


SEEN: list[bool] = []


async def test_rows_are_built_paused_and_handled_with_the_collector_on(
    gc_on: None, autojump_clock: Any
) -> None:
    SEEN.clear()
    store = MemoryStore()
    put(store, "k", "id,name,score,active\n" + "".join(f"{i},n,1.5,on\n" for i in range(1, 8)))
    at_handle: list[bool] = []

    async def handle(rows: list[Seen], _input: Load) -> None:
        at_handle.append(gc.isenabled())

    job = make_import(store, Table(), schema=Seen, handle=handle, batch=3)
    async with open_harness(jobs=[job]) as h:
        trace = await h.run(job, Load("k"))
    assert trace.state == "done", trace.last_error
    assert SEEN == [False] * 7  # every row made with the collector paused
    assert at_handle == [True, True, True]  # batches of 3, 3, 1: each sent after the pause
    assert gc.isenabled()


async def test_a_page_that_fails_inside_the_loop_leaves_the_collector_on(
    gc_on: None, autojump_clock: Any
) -> None:
    store = MemoryStore()
    put(store, "k", "id,nom,score,active\n1,n,1.5,on\n")
    job = make_import(store, Table())
    async with open_harness(jobs=[job]) as h:
        trace = await h.run(job, Load("k"))
    assert trace.state == "dead"  # the header is refused from inside the paused loop
    assert "X_IMPORT_HEADER_MISMATCH" in str(trace.last_error)
    assert gc.isenabled()


async def test_an_import_leaves_an_app_s_disabled_collector_off(
    gc_on: None, autojump_clock: Any
) -> None:
    gc.disable()
    store = MemoryStore()
    put(store, "k", "id,name,score,active\n1,n,1.5,on\n2,m,2,off\n")
    table = Table()
    job = make_import(store, table)
    async with open_harness(jobs=[job]) as h:
        trace = await h.run(job, Load("k"))
    assert trace.state == "done", trace.last_error
    assert len(table.rows) == 2
    assert not gc.isenabled()


async def test_ndjson_rows_are_built_paused_and_handled_with_the_collector_on(
    gc_on: None, autojump_clock: Any
) -> None:
    SEEN.clear()
    store = MemoryStore()
    body = "".join(
        f'{{"id": {i}, "name": "n", "score": 1.5, "active": true}}\n' for i in range(1, 8)
    )
    put(store, "k", body + '{"id": "x", "name": "n", "active": true}\n')
    at_handle: list[bool] = []

    async def handle(rows: list[Seen], _input: Load) -> None:
        at_handle.append(gc.isenabled())

    job = make_import(store, Table(), schema=Seen, handle=handle, batch=3, format="ndjson")
    async with open_harness(jobs=[job]) as h:
        trace = await h.run(job, Load("k"))
    assert trace.state == "done", trace.last_error
    assert trace.result["rows"] == 7
    assert trace.result["refused"] == 1
    assert SEEN == [False] * 7  # every row made with the collector paused
    assert at_handle == [True, True, True]  # batches of 3, 3, 1: each sent after the pause
    assert gc.isenabled()
