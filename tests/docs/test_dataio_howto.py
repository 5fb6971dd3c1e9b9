"""docs/how-to/import-and-export-rows.md on PostgreSQL: the page's import reads a
csv from a LocalStore into a real ``people`` table (one row refused, reported
without its value) and its export writes the table back as a csv part."""

from __future__ import annotations

import pathlib

import trio

from ._pages import load_page
from .test_backfill_howto import schema_dsn  # noqa: F401 - a fixture, used by name

PAGE = "docs/how-to/import-and-export-rows.md"


def test_the_page_imports_then_exports_on_postgres(
    schema_dsn: str,  # noqa: F811
    tmp_path: pathlib.Path,
) -> None:
    page = load_page(PAGE)
    (tmp_path / "people.csv").write_text("name,id,score\r\nAda,1,1.5\r\nBob,x,\r\n=Eve,3,\r\n")
    imported, exported = trio.run(page.import_then_export, schema_dsn, str(tmp_path))
    assert imported["rows"] == 2
    assert imported["refused"] == 1
    assert imported["pages"] == 1
    assert imported["error_prefix"].startswith("errors/")
    [part] = (tmp_path / imported["error_prefix"]).iterdir()
    assert part.read_text() == '{"line":3,"field":"id","code":"X_IMPORT_ROW_INVALID"}\n'
    assert exported == {"pages": 1, "rows": 2, "prefix": "exports/people"}
    written = (tmp_path / "exports" / "people" / "part-00001.csv").read_text()
    assert written == "id,name,score\n1,Ada,1.5\n3,'=Eve,\n"
