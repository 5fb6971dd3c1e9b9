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
from hypothesis import example, given, settings
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


class _Text(str):
    """A str subclass: not a plain text cell (``_cell`` writes its ``str``)."""

    def __str__(self) -> str:
        return "sub:" + str.__str__(self)


class _Number(int):
    def __str__(self) -> str:
        return "-n,"  # quoted, and not guarded: a number is never guarded


#: Text made of the characters the render looks for: formula starts, the csv
#: module's quoting characters, a line end then a formula start.
_SHARP_TEXT = st.text(alphabet=st.sampled_from(list("ab =+-@,\"\n\r'")), max_size=5)
#: Each a column's values: of one kind (with ``None`` or without: the render's
#: column-at-a-time paths) or of any kind.
_COLUMNS = [
    *[
        variant
        for kind in [
            st.integers(),
            st.floats(),
            st.booleans(),
            _SHARP_TEXT,
            st.sampled_from(["=1", "a\n=b", "x@y", "-", "", "a,b"]),
            st.dates() | st.times(),
            st.builds(_Text, _SHARP_TEXT) | st.builds(_Number, st.integers()),
        ]
        for variant in (kind, kind | st.none())
    ],
    _VALUES,
]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(_COLUMNS), min_size=1, max_size=4).flatmap(
        lambda kinds: st.lists(st.tuples(*kinds), min_size=1, max_size=8)
    ),
    st.sampled_from(["tuple", "list", "mapping", "attrs"]),
)
@example([("a\n=b",), ("c",)], "tuple")
@example([("",), ("c",)], "tuple")
@example([(1, "=x"), (-2, "@y")], "list")
def test_render_writes_what_the_csv_module_writes_of_the_guarded_cells(
    rows: list[tuple[Any, ...]], shape: str
) -> None:
    """Columns of one kind (the render's fast paths), with ``None``, text holding
    formula starts, commas, quotes and line ends, rows as tuples, lists,
    mappings or attrs instances: the bytes are the csv module's of ``_cell`` of
    each value, under the csv module's own header line."""
    width = len(rows[0])
    columns = tuple(f"c{i}" for i in range(width))
    expected = io.StringIO()
    writer = csv.writer(expected, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_cell(v) for v in row] for row in rows)
    given_rows: list[Any] = list(rows)
    if shape == "list":
        given_rows = [list(row) for row in rows]
    elif shape == "mapping":
        given_rows = [dict(zip(columns, row, strict=True)) for row in rows]
    elif shape == "attrs":
        cls = attrs.make_class("Row", list(columns))
        given_rows = [cls(*row) for row in rows]
    assert render("csv", columns, given_rows, "x") == expected.getvalue().encode()


_NEVER = object()


def _logged(log: list[Any], size: int = 2, fail_once: Any = _NEVER) -> Any:
    """A keyset source over ROWS logging each read (``fail_once``: the cursor
    whose first read raises)."""
    failed: list[Any] = []

    async def source(_input: Load, cursor: Any) -> tuple[list[Any], Any]:
        log.append(("read", cursor))
        if cursor == fail_once and not failed:
            failed.append(cursor)
            raise RuntimeError("the database went away")
        at = 0 if cursor is None else cursor
        nxt = at + size
        return ROWS[at:nxt], (nxt if nxt < len(ROWS) else None)

    return source


def _slow_writes(monkeypatch: pytest.MonkeyPatch, log: list[Any]) -> None:
    """The export's writes take a (virtual) second each, then are logged: the
    real store is written."""
    import trio

    import trio_jobs._export_rows as export_module

    real = export_module.put

    async def put_slowly(store: Any, key: str, data: bytes) -> None:
        await trio.sleep(1)
        await real(store, key, data)
        log.append(("wrote", key.rsplit("/", 1)[-1]))

    monkeypatch.setattr(export_module, "put", put_slowly)


@pytest.mark.parametrize("ahead", [False, True])
async def test_read_ahead_reads_page_n_plus_1_while_page_n_is_written(
    ahead: bool, monkeypatch: pytest.MonkeyPatch, autojump_clock: Any
) -> None:
    log: list[Any] = []
    _slow_writes(monkeypatch, log)
    store = MemoryStore()
    job = make_export(store, source=_logged(log), read_ahead=ahead)
    async with open_harness(jobs=[job]) as h:
        trace = await h.run(job, Load("a"))
    assert trace.result == {"pages": 3, "rows": 5, "prefix": "out/a"}
    if ahead:
        # Page 2's rows are read while page 1's part is written, and so on;
        # each page's read once, none after the last.
        assert log == [
            ("read", None),
            ("read", 2),
            ("wrote", "part-00001.csv"),
            ("read", 4),
            ("wrote", "part-00002.csv"),
            ("wrote", "part-00003.csv"),
        ]
    else:
        assert log == [
            ("read", None),
            ("wrote", "part-00001.csv"),
            ("read", 2),
            ("wrote", "part-00002.csv"),
            ("read", 4),
            ("wrote", "part-00003.csv"),
        ]
    plain = MemoryStore()
    async with open_harness(jobs=[reference := make_export(plain)]) as h:
        await h.run(reference, Load("a"))
    assert {k: read(store, k) for k in listing(store, "out")} == {
        k: read(plain, k) for k in listing(plain, "out")
    }


async def test_a_read_ahead_that_fails_fails_the_page_it_was_read_for(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: Any
) -> None:
    """Page 2's read, run while page 1 was written, raises: page 1 is still
    recorded, page 2's step fails with the error, and the retry reads page 2
    again (the failed read is not used)."""
    log: list[Any] = []
    _slow_writes(monkeypatch, log)
    store = MemoryStore()
    job = make_export(store, source=_logged(log, fail_once=2), read_ahead=True)
    async with open_harness(jobs=[job]) as h:
        trace = await h.run(job, Load("f"))
    assert trace.state == "done", trace.last_error
    assert trace.attempts == 2
    assert trace.steps["page:1"].executions == 1
    assert trace.steps["page:2"].executions == 2
    assert log[:3] == [("read", None), ("read", 2), ("wrote", "part-00001.csv")]
    assert log[3:5] == [("read", 2), ("read", 4)]  # attempt 2: page 1 replayed, not read
    assert listing(store, "out/f") == [f"out/f/part-0000{n}.csv" for n in (1, 2, 3)]


async def test_an_export_reading_ahead_killed_at_every_boundary_writes_the_same_parts(
    autojump_clock: Any,
) -> None:
    store = MemoryStore()
    log: list[Any] = []
    job = make_export(store, source=_logged(log), read_ahead=True)
    report = await crash_proof(
        job, Load("k"), observe=lambda: {k: read(store, k) for k in listing(store, "out/k")}
    )
    assert report.boundaries == 3 * 3 + 1
    assert sorted(report.reference) == [f"out/k/part-0000{n}.csv" for n in (1, 2, 3)]
    assert read(store, "out/k/part-00002.csv").startswith(b"id,text,n,extra\n3,")


def test_read_ahead_must_be_a_bool() -> None:
    with pytest.raises(JobsError) as caught:
        make_export(MemoryStore(), read_ahead="yes")
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert "read_ahead must be True or False" in caught.value.message
