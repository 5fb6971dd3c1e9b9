"""The data jobs over S3 (moto's server mode, started by the test session): an
import a page at a time with ranged reads, its error report, an export, and a
missing object; obstore's S3Store is the real client, never a mock."""

from __future__ import annotations

from typing import Any

import orjson

from dataio_support import Load, Person, Table, listing, make_import, put, read
from trio_jobs import ErrorCode, export_rows
from trio_jobs.testing import open_harness


async def test_an_import_and_an_export_through_s3(s3_store: Any, autojump_clock: Any) -> None:
    table = Table()
    body = (
        "name,id,active,score\n" + "".join(f"n{i},{i},on,\n" for i in range(1, 200)) + "x,y,on,\n"
    )
    put(s3_store, "drop/in.csv", body)
    job = make_import(s3_store, table, page_bytes=256)
    exp = export_rows(
        name="people.export",
        input=Load,
        idempotency_key=lambda i: f"export:{i.key}",
        source=lambda _i, c: (
            sorted(table.rows.values(), key=lambda p: p.id)[c or 0 : (c or 0) + 100],
            None if (c or 0) + 100 >= len(table.rows) else (c or 0) + 100,
        ),
        sink=lambda _i: s3_store,
        prefix="exported",
        columns=["id", "name"],
        format="ndjson",
    )
    async with open_harness(jobs=[job, exp]) as h:
        trace = await h.run(job, Load("drop/in.csv"))
        assert trace.state == "done", trace.last_error
        assert trace.result["rows"] == 199
        assert trace.result["pages"] == len(trace.steps) > 5
        assert table.rows[150] == Person(150, "n150", None, True)
        [part] = listing(s3_store, trace.result["error_prefix"])
        assert [orjson.loads(x) for x in read(s3_store, part).splitlines()] == [
            {"line": 201, "field": "id", "code": "X_IMPORT_ROW_INVALID"}
        ]
        out = await h.run(exp, Load("all"))
        assert out.result == {"pages": 2, "rows": 199, "prefix": "exported"}
        assert listing(s3_store, "exported") == [
            "exported/part-00001.ndjson",
            "exported/part-00002.ndjson",
        ]
        missing = await h.run(job, Load("drop/none.csv"))
        assert missing.error_code == ErrorCode.X_IMPORT_SOURCE_MISSING
