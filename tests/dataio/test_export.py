"""Jobs-And-Workflows.md "Exports and imports" and PYTHON-API.md "Data jobs":
export_rows writes one object per page (a replay overwrites its part) with the
formula guard on csv cells, csv and ndjson, on the memory driver over a real
obstore store; and crash_proof of an import into a table keyed by line."""

from __future__ import annotations

import csv
import datetime as dt
import io
import pathlib
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from obstore.store import MemoryStore

from dataio_support import Load, Table, listing, local, make_import, put, read
from trio_jobs import ErrorCode, JobsError, Retry, export_rows
from trio_jobs._export_rows import _cell, render
from trio_jobs.testing import crash_proof, open_harness

ROWS = [
    (1, "=HYPERLINK(evil)", -5, None),
    (2, "+1 555", 2.5, True),
    (3, "-minus", 0, False),
    (4, "@at", 7, dt.date(2026, 1, 2)),
    (5, "plain, with comma", 1, "x"),
]
COLUMNS = ["id", "text", "n", "extra"]


def pages(size: int = 2) -> Any:
    def source(_input: Load, cursor: Any) -> tuple[list[Any], Any]:
        at = 0 if cursor is None else cursor
        found = ROWS[at : at + size]
        nxt = at + size
        return found, (nxt if nxt < len(ROWS) else None)

    return source


def make_export(store: Any, **over: Any) -> Any:
    fields: dict[str, Any] = {
        "name": "rows.export",
        "input": Load,
        "idempotency_key": lambda i: f"export:{i.key}",
        "source": pages(),
        "sink": lambda _i: store,
        "prefix": lambda i: f"out/{i.key}",
        "columns": COLUMNS,
        "retry": Retry(attempts=3, base="1s", jitter=False),
    }
    fields.update(over)
    return export_rows(**fields)


async def test_one_object_per_page_with_the_formula_guard(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store = local(tmp_path)
    job = make_export(store)
    async with open_harness(jobs=[job]) as h:
        trace = await h.run(job, Load("a"))
    assert trace.state == "done", trace.last_error
    assert trace.result == {"pages": 3, "rows": 5, "prefix": "out/a"}
    assert job.kind == "export"
    assert listing(store, "out") == [
        "out/a/part-00001.csv",
        "out/a/part-00002.csv",
        "out/a/part-00003.csv",
    ]
    parsed: list[list[str]] = []
    for key in listing(store, "out"):
        rows = list(csv.reader(io.StringIO(read(store, key).decode())))
        assert rows[0] == COLUMNS  # every part carries its header
        parsed += rows[1:]
    assert parsed == [
        ["1", "'=HYPERLINK(evil)", "-5", ""],
        ["2", "'+1 555", "2.5", "true"],
        ["3", "'-minus", "0", "false"],
        ["4", "'@at", "7", "2026-01-02"],
        ["5", "plain, with comma", "1", "x"],
    ]


async def test_a_replay_overwrites_its_part(autojump_clock: Any) -> None:
    store = MemoryStore()
    put(store, "out/b/part-00002.csv", b"stale bytes of an earlier attempt")
    job = make_export(store)
    async with open_harness(jobs=[job]) as h:
        await h.run(job, Load("b"))
    assert read(store, "out/b/part-00002.csv").startswith(b"id,text,n,extra\n3,")
    report = await crash_proof(
        job, Load("c"), observe=lambda: {k: read(store, k) for k in listing(store, "out/c")}
    )
    assert report.boundaries == 3 * 3 + 1
    assert len(report.reference) == 3


async def test_ndjson_parts_and_mapping_and_attrs_rows(autojump_clock: Any) -> None:
    @attrs.frozen
    class Item:
        id: int
        text: str
        n: float
        extra: Any

    store = MemoryStore()

    def source(_i: Load, cursor: Any) -> tuple[list[Any], Any]:
        if cursor is None:
            return [{"id": 1, "text": "=x", "n": 1, "extra": dt.date(2026, 1, 2)}], 1
        return [Item(2, "b", 2.5, None)], None

    job = make_export(store, source=source, format="ndjson", prefix="flat")
    async with open_harness(jobs=[job]) as h:
        trace = await h.run(job, Load("n"))
    assert trace.result == {"pages": 2, "rows": 2, "prefix": "flat"}
    assert [orjson.loads(read(store, k)) for k in listing(store, "flat")] == [
        {"id": 1, "text": "=x", "n": 1, "extra": "2026-01-02"},  # no guard: JSON is not a sheet
        {"id": 2, "text": "b", "n": 2.5, "extra": None},
    ]


def test_a_bad_export_declaration_names_every_fault() -> None:
    with pytest.raises(JobsError) as caught:
        export_rows(
            name="",
            idempotency_key=lambda i: "k",
            source=lambda i: None,
            sink=None,
            prefix=3,
            format="xlsx",
            columns=[],
        )
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    text = "; ".join(caught.value.meta["faults"])
    for part in (
        "name must be",
        "source must take two",
        "sink= is required",
        "prefix must be",
        "format must be",
        "columns must be",
    ):
        assert part in text, part


async def test_an_import_killed_at_every_page_boundary_imports_every_row_once(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    """crash_proof: killed before each page, after its handle, after its
    checkpoint, and at the settle; each resumed run leaves the table keyed by
    line with every row once, and the error report as the clean run's."""
    store = local(tmp_path)
    body = "id,name,score,active\n" + "".join(
        f"{i},n{i},,{'on' if i % 3 else 'off'}\n" if i % 7 else f"bad{i},n{i},,on\n"
        for i in range(1, 60)
    )
    put(store, "in.csv", body)
    by_line: dict[int, list[int]] = {}

    def upsert(rows: list[Any], _i: Load) -> None:
        for row in rows:
            line = row.id + 1  # row i sits on line i + 1
            by_line[line] = [row.id]  # keyed by line: a page handled twice leaves it as once

    job = make_import(store, Table(), handle=upsert, page_bytes=120, batch=4)

    def observe() -> Any:
        reports = sorted(
            orjson.loads(x)["line"]
            for k in listing(store, "reports")
            for x in read(store, k).splitlines()
        )
        return {"table": dict(by_line), "refused_lines": reports}

    def reset() -> None:
        by_line.clear()
        for key in listing(store, "reports"):
            (tmp_path / "store" / key).unlink()

    report = await crash_proof(job, Load("in.csv"), observe=observe, reset=reset)
    pages = len(body.encode()) // 120
    assert report.boundaries >= 3 * pages + 1
    assert report.reference["table"] == {i + 1: [i] for i in range(1, 60) if i % 7}
    assert report.reference["refused_lines"] == [i + 1 for i in range(7, 60, 7)]


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.sampled_from(["=1+1", "+x", "-3", "@a", "", "a,b", 'q"q', "a\nb", "c\rd", " s "]),
    st.dates(),
    st.datetimes(),
    st.times(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.uuids(),
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda width: st.lists(
            st.tuples(*[_VALUES] * width) | st.tuples(*[st.sampled_from([1, None, "=x"])] * width),
            max_size=6,
        )
    )
)
def test_a_page_renders_each_cell_as_the_one_cell_rule_does(rows: list[tuple[Any, ...]]) -> None:
    """The column-at-a-time render writes what ``_cell`` of every value writes."""
    width = len(rows[0]) if rows else 2
    columns = tuple(f"c{i}" for i in range(width))
    expected = io.StringIO()
    writer = csv.writer(expected, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_cell(v) for v in row] for row in rows)
    assert render("csv", columns, rows, "x") == expected.getvalue().encode()
