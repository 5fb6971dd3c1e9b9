"""Jobs-And-Workflows.md "One person's data": "children first, the subject
last; one step per page of parent keys — a killed run resumes at the page it
stopped on". A worker subprocess erasing a person is SIGKILLed inside a page
(its statement held by a lock the test owns); a fresh process resumes the run
at that page, and every row is treated once: the pages committed before the
kill are not run again, the held page's work never committed, and the counts
of the finished run are the person's rows exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from pg_schemas import base_dsn, throwaway_schema
from subjects.subject_app import TABLES, Person
from trio_jobs import open_jobs, postgres_driver
from trio_jobs._subject import PAGE_ROWS
from trio_jobs.drivers.postgres import migrate

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TESTS = Path(__file__).resolve().parents[1]
LOCK = 914_118  # the advisory lock the held page waits on
MANY = 2 * PAGE_ROWS + 3  # Ann's likes on her post: three pages, the last one held

SEED = f"""
INSERT INTO members VALUES (1, 7, 'a@x', 'Ann', NULL), (1, 8, 'b@x', 'Bob', NULL);
INSERT INTO posts VALUES (1, 100, 7, 'ann post'), (1, 101, 8, 'bob post');
INSERT INTO comments (tenant_id, post_id, author_id, body) VALUES
    (1, 100, 8, 'bob on ann'), (1, 101, 7, 'ann on bob'), (1, 101, 8, 'bob on bob');
INSERT INTO likes (tenant_id, post_id) SELECT 1, 100 FROM generate_series(2, {MANY});
INSERT INTO likes (tenant_id, post_id, note) VALUES (1, 100, 'stop');
INSERT INTO likes (tenant_id, post_id) SELECT 1, 101 FROM generate_series(1, 5);
INSERT INTO invoices (tenant_id, member_id, total) VALUES (1, 7, 10), (1, 8, 20);
INSERT INTO audit_copies (tenant_id, member_id, who) VALUES (1, 7, 'Ann'), (1, 8, 'Bob');
CREATE FUNCTION hold_stop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({LOCK});
    RETURN OLD;
END $$;
CREATE TRIGGER hold_stop BEFORE DELETE ON likes FOR EACH ROW
    WHEN (OLD.note = 'stop') EXECUTE FUNCTION hold_stop();
"""


@pytest.fixture
def dsn() -> Iterator[str]:
    with throwaway_schema("tj_subjk") as schema_dsn:
        trio.run(migrate, schema_dsn)
        with psycopg.connect(schema_dsn, autocommit=True) as conn:
            conn.execute(TABLES + SEED)
        yield schema_dsn


def _sql(dsn: str, text: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(text, params)
        return cur.fetchall() if cur.description else []


def _worker(dsn: str, tmp: Path, n: int) -> tuple[subprocess.Popen[bytes], Path]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env.pop("DATABASE_URL", None)  # the DSN is passed: it carries the schema
    log = tmp / f"worker{n}.err"
    proc = subprocess.Popen(
        [
            sys.executable,
            *("-m", "trio_jobs.cli", "worker", "subjects.erase_app"),
            *("--database-url", dsn, "--visibility-timeout", "2s", "--idle-poll-max", "250ms"),
        ],
        env=env,
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
    )
    return proc, log


def _until(check: Any, timeout: float, what: str, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {what}:\n{log.read_text('utf-8', 'replace')}"
            )
        time.sleep(0.05)
    return value


async def _enqueue(dsn: str) -> str:
    from subjects import erase_app

    async with open_jobs(postgres_driver(dsn), jobs=[erase_app.erase]):
        return (await erase_app.erase.enqueue(Person(1, 7))).id


def _steps(dsn: str, job_id: str) -> list[tuple[str, Any, int]]:
    return _sql(
        dsn,
        "SELECT name, output, executions FROM trio_jobs_steps "
        "WHERE job_id = %s AND status = 'completed' ORDER BY seq",
        (job_id,),
    )


def test_an_erase_killed_inside_a_page_resumes_there_and_treats_every_row_once(
    dsn: str, tmp_path: Path
) -> None:
    holder = psycopg.connect(base_dsn(), autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        first, log = _worker(dsn, tmp_path, 1)
        procs.append(first)
        job_id = trio.run(_enqueue, dsn)
        # the third page of likes waits on the lock: the first two are committed
        _until(
            lambda: _sql(
                dsn,
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted",
                (LOCK,),
            ),
            30,
            "the held page",
            log,
        )
        done_before = [name for name, _, _ in _steps(dsn, job_id)]
        assert done_before[-2:] == ["delete:likes:1", "delete:likes:2"]
        left = _sql(dsn, "SELECT count(*) FROM likes WHERE post_id = 100")[0][0]
        assert left == MANY - 2 * PAGE_ROWS  # the held page deleted nothing yet
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        # The killed worker's statement still waits in its backend; once the
        # lock is free it finishes, cannot answer, and its transaction rolls back.
        holder.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
        second, log = _worker(dsn, tmp_path, 2)
        procs.append(second)
        _until(
            lambda: (
                _sql(dsn, "SELECT state FROM trio_jobs_jobs WHERE id = %s", (job_id,))[0][0]
                in ("done", "dead")
            ),
            60,
            "the resumed run to settle",
            log,
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        holder.close()
    [(state, attempts, result)] = _sql(
        dsn, "SELECT state, attempts, result FROM trio_jobs_jobs WHERE id = %s", (job_id,)
    )
    assert (state, attempts) == ("done", 2)
    steps = _steps(dsn, job_id)
    names = [name for name, _, _ in steps]
    assert names[: len(done_before)] == done_before  # the resumed run kept them
    assert names[len(done_before)] == "delete:likes:3"
    # each page's statement committed once: none was run again by the resumed attempt
    assert {name: n for name, _, n in steps} == dict.fromkeys(names, 1)
    counts = {name: out for name, out, _ in steps}
    assert [counts[f"delete:likes:{n}"] for n in (1, 2, 3)] == [PAGE_ROWS, PAGE_ROWS, 3]
    # every row of Ann's treated once; Bob's untouched
    assert result["tables"]["likes"] == {"treatment": "delete", "rows": MANY}
    assert result["tables"]["comments"] == {"treatment": "delete", "rows": 2}
    assert result["rows"] == MANY + 2 + 1 + 1 + 1 + 1  # likes, comments, post, invoice, audit, Ann
    assert _sql(dsn, "SELECT tenant_id, id FROM members ORDER BY id") == [(1, 8)]
    assert _sql(dsn, "SELECT count(*) FROM likes") == [(5,)]
    assert _sql(dsn, "SELECT body FROM comments ORDER BY body") == [("bob on bob",)]
    assert _sql(dsn, "SELECT member_id, total FROM invoices ORDER BY total") == [
        (None, 10),
        (8, 20),
    ]
    assert _sql(dsn, "SELECT member_id, who FROM audit_copies ORDER BY who") == [
        (8, "Bob"),
        (7, "erased"),
    ]
