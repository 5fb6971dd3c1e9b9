"""Jobs-And-Workflows.md "Exports and imports", the import table, and PYTHON-API.md
"Data jobs": import_rows on the memory driver over a real obstore LocalStore /
MemoryStore. Each rule of the table is a test named after it."""

from __future__ import annotations

import itertools
import pathlib
from typing import Any

import attrs
import orjson
import pytest
from obstore.store import MemoryStore

from dataio_support import Load, Person, Table, listing, local, make_import, put, read
from trio_jobs import ErrorCode, ErrorSink, JobsError, Retry, import_rows
from trio_jobs.testing import open_harness

HEADER = "id,name,score,active\n"


def people(n: int, start: int = 1) -> str:
    return "".join(
        f"{i},name {i},{i / 2},{'true' if i % 2 else 'false'}\n" for i in range(start, start + n)
    )


async def run(job: Any, key: str = "in.csv") -> Any:
    async with open_harness(jobs=[job]) as h:
        return await h.run(job, Load(key))


def report(store: Any, prefix: str) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for key in listing(store, prefix):
        lines += [orjson.loads(x) for x in read(store, key).splitlines()]
    return lines


async def test_one_step_per_page_checkpointed_at_the_byte_offset(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    body = HEADER + people(40)
    put(store, "in.csv", body)
    job = make_import(store, table, page_bytes=100, batch=7)
    trace = await run(job)
    assert trace.state == "done"
    assert trace.result == {
        "rows": 40,
        "refused": 0,
        "pages": len(trace.steps),
        "error_prefix": None,
    }
    assert table.rows == {i: Person(i, f"name {i}", i / 2, bool(i % 2)) for i in range(1, 41)}
    # every page a step; each checkpoint a record end, within page_bytes of the one before
    offsets = [0] + [s.output["offset"] for s in trace.steps.values()]
    assert list(trace.steps) == [f"page:{n}" for n in range(1, len(offsets))]
    assert offsets[-1] == len(body.encode())
    assert all(0 < b - a <= 100 for a, b in itertools.pairwise(offsets))
    assert all(body.encode()[o - 1 : o] == b"\n" for o in offsets[1:])
    assert len(trace.steps) <= len(body.encode()) // 100 + 2
    assert all(n <= 7 for n in table.calls)
    assert sum(table.calls) == 40


async def test_a_newline_inside_quotes_is_data_and_a_record_end_found_on_bytes(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    # The quoted newline falls on the first page's edge (page_bytes=40).
    body = HEADER + '1,"two\nlines, ""quoted""",1,on\n2,plain,2,off\n'
    put(store, "in.csv", body)
    trace = await run(make_import(store, table, page_bytes=40))
    assert trace.state == "done", trace.last_error
    assert table.rows[1].name == 'two\nlines, "quoted"'
    assert table.rows[2] == Person(2, "plain", 2.0, False)
    assert trace.result["rows"] == 2


async def test_a_character_split_by_a_page_edge_is_read_whole(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    rows = "".join(f"{i},Zoë Åsa Ñandú {i},,no\n" for i in range(1, 30))
    raw = (HEADER + rows).encode()
    put(store, "in.csv", raw)
    # Every page size from 30 to 60 bytes cuts some multi-byte character in two.
    for page_bytes in range(30, 61):
        table.reset()
        trace = await run(make_import(store, table, page_bytes=page_bytes))
        assert trace.state == "done", (page_bytes, trace.last_error)
        assert {r.name for r in table.rows.values()} == {f"Zoë Åsa Ñandú {i}" for i in range(1, 30)}


async def test_a_bom_and_crlf_read_as_nothing(tmp_path: pathlib.Path, autojump_clock: Any) -> None:
    store, table = local(tmp_path), Table()
    put(store, "in.csv", b"\xef\xbb\xbfname,active,id,score\r\nann,yes,1,\r\n\r\nbob,0,2,1.5\r\n")
    trace = await run(make_import(store, table))
    assert trace.state == "done", trace.last_error
    assert table.rows == {1: Person(1, "ann", None, True), 2: Person(2, "bob", 1.5, False)}


@pytest.mark.parametrize(
    ("body", "missing", "undeclared"),
    [
        ("id,name,score\n1,a,1\n", ["active"], []),
        ("id,name,score,active,email\n1,a,1,on,x@y\n", [], ["email"]),
        ("id,name,score,active,id\n", [], []),
        ("", ["id", "name", "score", "active"], []),
        ("\ufeff", ["id", "name", "score", "active"], []),
        ("\n\r\n\n", ["id", "name", "score", "active"], []),
    ],
    ids=["missing", "undeclared", "twice", "empty", "bom-only", "blank-lines"],
)
async def test_the_header_must_name_exactly_columns(
    tmp_path: pathlib.Path,
    body: str,
    missing: list[str],
    undeclared: list[str],
    autojump_clock: Any,
) -> None:
    store, table = local(tmp_path), Table()
    put(store, "in.csv", body)
    trace = await run(make_import(store, table))
    assert trace.state == "dead"
    assert trace.error_code == ErrorCode.X_IMPORT_HEADER_MISMATCH
    assert trace.attempts == 1  # terminal: the same file gives the same answer
    assert table.calls == []
    for name in missing + undeclared:
        assert name in (trace.last_error or "")


async def test_a_record_past_max_record_bytes_is_refused_at_its_offset(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    long = "1," + "x" * 300 + ",1,on\n"
    body = HEADER + "2,ok,1,on\n" + long + people(3, start=3)
    put(store, "in.csv", body)
    trace = await run(make_import(store, table, max_record_bytes=200, page_bytes=1000))
    assert trace.state == "dead"
    assert trace.error_code == ErrorCode.X_IMPORT_RECORD_TOO_LARGE
    assert f"at byte {len(HEADER) + 10} (line 3)" in (trace.last_error or "")
    assert "x" * 20 not in (trace.last_error or "")


async def test_an_unclosed_quote_is_never_read_on_into_the_heap(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    body = HEADER + '1,"never closed,1,on\n' + people(2000, start=2)
    put(store, "in.csv", body)
    trace = await run(make_import(store, table, max_record_bytes=1024, page_bytes=256))
    assert trace.error_code == ErrorCode.X_IMPORT_RECORD_TOO_LARGE
    assert "line 2" in (trace.last_error or "")
    assert table.calls == []


async def test_refused_rows_are_line_field_code_under_the_run_never_the_value(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    secret = "4111-1111-SECRET"
    body = (
        HEADER.encode()
        + b"1,ok,1,on\n"
        + f"{secret},bad id,1,on\n".encode()  # line 3: id is not a number
        + b"3,too,many,fields,here\n"  # line 4: ragged
        + b"4,\xff\xfe,1,on\n"  # line 5: not UTF-8
        + b"5,nul\x00here,1,on\n"  # line 6: NUL
        + b'6,"stray"quote,1,on\n'  # line 7: malformed quoting
        + f"7,ok,1,{secret}\n".encode()  # line 8: not a yes/no
        + b'8,"multi\nline",1,on\n'  # lines 9-10: fine
        + b'9,"unclosed at the end,1,on\n'  # line 11: unclosed quote at end of file
    )
    put(store, "in.csv", body)
    trace = await run(make_import(store, table, page_bytes=64))
    assert trace.state == "done", trace.last_error
    assert set(table.rows) == {1, 8}
    prefix = trace.result["error_prefix"]
    assert prefix.startswith("reports/")
    assert len(prefix) > len("reports/")
    found = report(store, "reports")
    assert found == [
        {"line": 3, "field": "id", "code": "X_IMPORT_ROW_INVALID"},
        {"line": 4, "field": None, "code": "X_IMPORT_ROW_MALFORMED"},
        {"line": 5, "field": None, "code": "X_IMPORT_ROW_ENCODING"},
        {"line": 6, "field": None, "code": "X_IMPORT_ROW_MALFORMED"},
        {"line": 7, "field": None, "code": "X_IMPORT_ROW_MALFORMED"},
        {"line": 8, "field": "active", "code": "X_IMPORT_ROW_INVALID"},
        {"line": 11, "field": None, "code": "X_IMPORT_ROW_MALFORMED"},
    ]
    keys = listing(store, "reports")
    assert all(k.startswith(prefix + "/errors-") and k.endswith(".ndjson") for k in keys)
    # one part per page that refused something, keyed by page number
    pages_with_faults = {int(k.rsplit("-", 1)[1].split(".")[0]) for k in keys}
    assert pages_with_faults <= {int(s.split(":")[1]) for s in trace.steps}
    for key in keys:
        assert secret.encode() not in read(store, key)
    assert trace.result == {
        "rows": 2,
        "refused": 7,
        "pages": len(trace.steps),
        "error_prefix": trace.result["error_prefix"],
    }


async def test_past_max_row_errors_the_run_fails_and_the_crossing_batch_is_not_handled(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    body = HEADER + "1,a,,no\n2,b,,no\nx,c,,no\n4,d,,no\ny,e,,no\n6,f,,no\n"
    put(store, "in.csv", body)
    trace = await run(make_import(store, table, max_row_errors=1, batch=2))
    assert trace.state == "dead"
    assert trace.error_code == ErrorCode.X_IMPORT_TOO_MANY_ERRORS
    assert trace.attempts == 1
    # batch [1, 2] handled; [4] with the crossing error (line 6) not.
    assert set(table.rows) == {1, 2}
    assert report(store, "reports") == [
        {"line": 4, "field": "id", "code": "X_IMPORT_ROW_INVALID"},
        {"line": 6, "field": "id", "code": "X_IMPORT_ROW_INVALID"},
    ]


async def test_max_row_errors_zero_needs_no_sink_and_fails_on_the_first(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    put(store, "in.csv", HEADER + "1,a,,no\nx,b,,no\n")
    trace = await run(make_import(store, table, max_row_errors=0, errors=None))
    assert trace.error_code == ErrorCode.X_IMPORT_TOO_MANY_ERRORS
    assert table.calls == []


async def test_no_formula_guard_on_the_way_in(tmp_path: pathlib.Path, autojump_clock: Any) -> None:
    store, table = local(tmp_path), Table()
    put(store, "in.csv", HEADER + "1,'=SUM(A1),,no\n")
    await run(make_import(store, table))
    assert table.rows[1].name == "'=SUM(A1)"


async def test_ndjson_rows_are_structured_with_json_types(autojump_clock: Any) -> None:
    store, table = MemoryStore(), Table()
    lines = [
        b'{"id": 1, "name": "a", "score": 0.5, "active": true}',
        b'{"id": "2", "name": "b"}',  # JSON types are kept: a string is not an int
        b"[1, 2]",
        b'{"id": 4, "name": "d", "email": "x@y"}',
        b"{not json",
        b'{"id": 6, "name": "\xff"}',
        b"",
        b'{"id": 8, "name": "h"}',
    ]
    put(store, "in.ndjson", b"\n".join(lines) + b"\n")
    trace = await run(make_import(store, table, format="ndjson", page_bytes=50), "in.ndjson")
    assert trace.state == "done", trace.last_error
    assert table.rows == {1: Person(1, "a", 0.5, True), 8: Person(8, "h")}
    assert report(store, "reports") == [
        {"line": 2, "field": "id", "code": "X_IMPORT_ROW_INVALID"},
        {"line": 3, "field": None, "code": "X_IMPORT_ROW_MALFORMED"},
        {"line": 4, "field": "email", "code": "X_IMPORT_ROW_INVALID"},
        {"line": 5, "field": None, "code": "X_IMPORT_ROW_MALFORMED"},
        {"line": 6, "field": None, "code": "X_IMPORT_ROW_ENCODING"},
    ]


async def test_an_object_that_changes_between_pages_is_source_changed(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    put(store, "in.csv", HEADER + people(50))

    def write_then_swap(rows: list[Person], input: Load) -> None:
        table.write(rows, input)
        if len(table.calls) == 1:
            put(store, "in.csv", HEADER + people(60, start=1000))  # another file, same key

    trace = await run(make_import(store, table, handle=write_then_swap, page_bytes=200))
    assert trace.state == "dead"
    assert trace.error_code == ErrorCode.X_IMPORT_SOURCE_CHANGED
    assert all(i < 1000 for i in table.rows)  # never a row of the second file


async def test_a_missing_object_is_source_missing(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    trace = await run(make_import(store, table), "nope.csv")
    assert trace.state == "dead"
    assert trace.error_code == ErrorCode.X_IMPORT_SOURCE_MISSING
    assert trace.attempts == 1
    assert "nope.csv" in (trace.last_error or "")
    assert table.calls == []
    assert listing(store, "reports") == []


async def test_the_handle_gets_the_input_and_async_callables_work(autojump_clock: Any) -> None:
    store = MemoryStore()
    put(store, "k", HEADER + people(3))
    seen: list[tuple[int, str]] = []

    async def source(_: Load) -> Any:
        return store

    async def handle(rows: list[Person], input: Load) -> None:
        seen.extend((r.id, input.key) for r in rows)

    job = make_import(store, Table(), source=source, handle=handle)
    trace = await run(job, "k")
    assert trace.result["rows"] == 3
    assert seen == [(1, "k"), (2, "k"), (3, "k")]
    assert job.kind == "import"


def test_a_bad_declaration_names_every_fault() -> None:
    @attrs.frozen
    class Row:
        id: int
        must: str

    with pytest.raises(JobsError) as caught:
        import_rows(
            name="x",
            idempotency_key=lambda i: "k",
            source="not a function",
            key=lambda a, b: a,
            format="xml",
            columns=["id", "id"],
            schema=Row,
            handle=lambda rows: None,
            page_bytes=0,
            batch=True,
            max_row_errors=-1,
            colour="blue",
        )
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    faults = caught.value.meta["faults"]
    text = "; ".join(faults)
    for part in (
        "unknown field(s): colour",
        "source must be a function",
        "key must take one argument",
        "handle must take two arguments",
        "format must be",
        "columns must not name a column twice",
        "page_bytes",
        "batch",
        "max_row_errors",
        "errors= is required",
    ):
        assert part in text, part
    with pytest.raises(JobsError) as caught:
        import_rows(
            name="x",
            idempotency_key=lambda i: "k",
            source=lambda i: None,
            key=lambda i: "k",
            columns=["id", "other"],
            schema=Row,
            handle=lambda rows, i: None,
            errors=ErrorSink(sink=lambda i: None, prefix="p"),
        )
    text = "; ".join(caught.value.meta["faults"])
    assert "columns not fields of Row: other" in text
    assert "without a default missing from columns: must" in text
    with pytest.raises(JobsError) as caught:
        import_rows(name="x", source=lambda i: None)
    assert caught.value.code == ErrorCode.X_IDEMPOTENCY_REQUIRED


async def test_a_handle_overlaps_the_parse_of_the_next_batch_but_never_itself(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    """A batch's handle runs while the page parses on; the next batch waits for
    it, so the calls keep the file's order and never overlap; a handle's fault
    fails the page (the attempt), and the retry hands every row again."""
    import trio

    store = local(tmp_path)
    put(store, "in.csv", HEADER + people(23))
    seen: list[list[int]] = []
    inside, most = [0], [0]
    failures = [1]

    async def handle(rows: list[Person], _input: Load) -> None:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        try:
            await trio.sleep(1)
            if len(seen) == 2 and failures[0]:
                failures[0] -= 1
                raise RuntimeError("the database went away")
            seen.append([r.id for r in rows])
        finally:
            inside[0] -= 1

    job = make_import(store, Table(), batch=5, handle=handle, retry=Retry(attempts=2, base="1s"))
    trace = await run(job)
    assert trace.state == "done", trace.last_error
    assert trace.attempts == 2
    assert most == [1], "two handle calls at once"
    # the first attempt handed [1..5], [6..10], failed on the third; the retry handed all
    assert seen[:2] == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    assert [i for batch in seen[2:] for i in batch] == list(range(1, 24))


async def test_the_next_page_is_parsed_while_a_handle_runs_and_checkpoints_stay_per_page(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    """While page n's batch is in ``handle``, page n + 1 is read and its rows
    structured (the client parses while the database writes); page n's
    checkpoint still waits for its own handle, and page n + 1's rows are
    handed only by page n + 1's step."""
    import trio

    from trio_jobs._store import INLINE

    # The store's calls inline, as under the simulation: a read in a worker
    # thread would let the virtual clock end the handle's sleep before it.
    token = INLINE.set(True)
    built: list[int] = []

    @attrs.frozen
    class Seen:
        id: int = attrs.field()
        name: str = ""

        @id.validator
        def _record(self, _attr: Any, value: int) -> None:
            built.append(value)

    store = local(tmp_path)
    body = "id,name\n" + "".join(f"{i},n{i}\n" for i in range(1, 41))
    put(store, "in.csv", body)
    ahead: list[bool] = []
    handed: list[list[int]] = []

    async def handle(rows: list[Seen], _input: Load) -> None:
        await trio.sleep(1)  # the database at work: the reader parses on meanwhile
        ahead.append(max(built) > rows[-1].id)
        handed.append([r.id for r in rows])

    job = make_import(
        store, Table(), columns=["id", "name"], schema=Seen, handle=handle, page_bytes=60
    )
    try:
        trace = await run(job)
    finally:
        INLINE.reset(token)
    assert trace.state == "done", trace.last_error
    assert [i for batch in handed for i in batch] == list(range(1, 41))
    # every page but the last found the next one parsed when its handle returned
    assert ahead[:-1] == [True] * (len(ahead) - 1)
    assert ahead[-1] is False
    # one handle call a page (each page's rows are fewer than a batch), its checkpoint after it
    assert len(handed) == len(trace.steps)
    counts = [s.output["rows"] for s in trace.steps.values()]
    assert counts == list(itertools.accumulate(len(b) for b in handed))


async def test_a_fault_the_reader_finds_ahead_fails_its_own_page_after_the_one_before(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    """Page 2 holds a record past max_record_bytes: found while page 1 was in
    handle, raised by page 2's step; page 1's rows and checkpoint stand."""
    store, table = local(tmp_path), Table()
    first = HEADER + people(5)
    body = first + "6," + "x" * 300 + ",1,on\n" + people(3, start=7)
    put(store, "in.csv", body)
    job = make_import(store, table, page_bytes=len(first), max_record_bytes=200)
    trace = await run(job)
    assert trace.state == "dead"
    assert trace.error_code == ErrorCode.X_IMPORT_RECORD_TOO_LARGE
    assert trace.steps["page:1"].status == "completed"
    assert trace.steps["page:1"].output["offset"] == len(first.encode())
    assert set(table.rows) == {1, 2, 3, 4, 5}
    assert f"at byte {len(first)} (line 7)" in (trace.last_error or "")


async def test_max_row_errors_counts_across_pages_and_the_earlier_page_stands(
    tmp_path: pathlib.Path, autojump_clock: Any
) -> None:
    store, table = local(tmp_path), Table()
    first = HEADER + "1,a,,no\nx,b,,no\n3,c,,no\n"
    body = first + "4,d,,no\ny,e,,no\n6,f,,no\n"
    put(store, "in.csv", body)
    trace = await run(make_import(store, table, max_row_errors=1, page_bytes=len(first)))
    assert trace.state == "dead"
    assert trace.error_code == ErrorCode.X_IMPORT_TOO_MANY_ERRORS
    assert trace.steps["page:1"].status == "completed"
    # page 1 handled whole; page 2's batch (the one that crossed) not
    assert set(table.rows) == {1, 3}
    assert report(store, "reports") == [
        {"line": 3, "field": "id", "code": "X_IMPORT_ROW_INVALID"},
        {"line": 6, "field": "id", "code": "X_IMPORT_ROW_INVALID"},
    ]
