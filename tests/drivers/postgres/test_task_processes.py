"""Real processes: scheduled tasks over PostgreSQL. Two worker subprocesses
serve one task; the leader is killed with SIGKILL (its lease is never
released), and the other takes the task over within one lease ttl (30 s) and
fires what fell due meanwhile by the task's ``catch_up`` (``all``): every
occurrence of the window fired exactly once."""

from __future__ import annotations

import itertools
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from trio_jobs._scheduler import LEASE_TTL

from .conftest import sql
from .test_processes import Procs, dsn, procs, wait_until  # noqa: F401 - fixtures

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _leader(pg_dsn: str, schema: str) -> Any:
    rows = sql(pg_dsn, schema, "SELECT leader FROM trio_jobs_tasks WHERE name = 'proc.tick'")
    return rows[0][0] if rows else None


def _fired(pg_dsn: str, schema: str) -> list[str]:
    rows = sql(
        pg_dsn,
        schema,
        "SELECT idempotency_key FROM trio_jobs_jobs WHERE name = 'proc.tick' ORDER BY 1",
    )
    return [r[0] for r in rows]


def test_sigkill_of_the_leader_fails_over_within_one_ttl_and_fires_each_occurrence_once(
    procs: Procs,  # noqa: F811
    dsn: str,  # noqa: F811
    pg_dsn: str,
    pg_schema: str,
    tmp_path: Path,
) -> None:
    def worker() -> Any:
        proc = procs.spawn(
            "-m", "trio_jobs.cli", "worker", "process_tasks", "--database-url", procs.dsn
        )
        procs.wait_log(proc, "jobs.worker.ready")
        return proc

    a, b = worker(), worker()
    leader = wait_until(lambda: _leader(pg_dsn, pg_schema), 20, "a leader")
    wait_until(lambda: len(_fired(pg_dsn, pg_schema)) >= 2, 10, "the task to fire")
    dead, heir = (a, b) if leader in procs.log(a) else (b, a)
    assert leader not in procs.log(heir)
    dead.send_signal(signal.SIGKILL)
    dead.wait(5)
    killed = time.monotonic()
    took = wait_until(
        lambda: (_leader(pg_dsn, pg_schema) not in (None, leader)) and time.monotonic(),
        LEASE_TTL + 5,
        "another process to take over",
    )
    assert took - killed <= LEASE_TTL + 1.0, f"took over {took - killed:.1f} s after the kill"
    time.sleep(2.5)  # the heir's catch-up and a couple more occurrences
    keys = _fired(pg_dsn, pg_schema)
    assert len(keys) == len(set(keys)), "an occurrence fired twice"
    instants = sorted(
        datetime.fromisoformat(k.split(":", 2)[2].replace("Z", "+00:00")).timestamp() for k in keys
    )
    # every=1s, catch_up=all: the occurrences fired form one run of seconds
    # (the ones that fell due while nobody led were fired by the heir).
    gaps = [b - a for a, b in itertools.pairwise(instants) if b - a != 1]
    assert gaps == [], f"occurrences skipped: {gaps}"
    assert instants[-1] - instants[0] >= took - killed
    procs.wait_log(heir, "jobs.task.leading")
