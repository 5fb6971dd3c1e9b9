"""Real processes: every promise about crashes, drains, caps, wake-ups and
transactions, held by worker subprocesses (``python -m trio_jobs.cli worker
process_jobs``) against a real PostgreSQL.

Real time appears here, and only here among the driver tests: each wait is
bounded, and the whole module stays well under a minute.
"""

from __future__ import annotations

import importlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from trio_jobs import open_jobs
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._driver import conninfo_with_schema

from .conftest import sql

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TESTS = Path(__file__).resolve().parents[2]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
# tests/process_jobs.py: the jobs the worker subprocesses serve (importable
# there through PYTHONPATH, here through sys.path).
process_jobs = importlib.import_module("process_jobs")
Work = process_jobs.Work


class Procs:
    """Subprocesses of one test: started with ``tests/`` importable, logs in
    files, every one killed at teardown."""

    def __init__(self, dsn: str, tmp: Path) -> None:
        self.dsn = dsn
        self.tmp = tmp
        self.all: list[subprocess.Popen[bytes]] = []
        self._n = 0

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
        env.pop("DATABASE_URL", None)  # the DSN is passed: it carries the schema
        return env

    def spawn(self, *args: str, stdout: Any = None, stdin: Any = None) -> subprocess.Popen[bytes]:
        self._n += 1
        err = open(self.tmp / f"proc{self._n}.err", "wb")
        proc = subprocess.Popen(
            [sys.executable, *args],
            env=self._env(),
            cwd=self.tmp,
            stdout=stdout if stdout is not None else subprocess.DEVNULL,
            stdin=stdin,
            stderr=err,
        )
        proc.err_path = err.name  # type: ignore[attr-defined]
        self.all.append(proc)
        return proc

    def worker(self, *flags: str, module: str = "process_jobs") -> subprocess.Popen[bytes]:
        """``trio-jobs worker MODULE`` (a module of ``tests/``), once it is ready."""
        proc = self.spawn(
            "-m", "trio_jobs.cli", "worker", module, "--database-url", self.dsn, *flags
        )
        self.wait_log(proc, "jobs.worker.ready")
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return Path(proc.err_path).read_text("utf-8", "replace")  # type: ignore[attr-defined]

    def wait_log(self, proc: subprocess.Popen[bytes], needle: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.log(proc):
            if proc.poll() is not None:
                raise AssertionError(f"exited {proc.returncode}:\n{self.log(proc)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in:\n{self.log(proc)}")
            time.sleep(0.02)

    def kill_all(self) -> None:
        for proc in self.all:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def dsn(pg_dsn: str, pg_schema: str) -> str:
    """The test's schema as the connection's search_path; its tables created."""
    scoped = conninfo_with_schema(pg_dsn, pg_schema)
    trio.run(_migrate, scoped)
    with_tables(pg_dsn, pg_schema)
    return scoped


async def _migrate(dsn: str) -> None:
    from trio_jobs.drivers.postgres import migrate

    await migrate(dsn)


def with_tables(dsn: str, schema: str) -> None:
    for statement in process_jobs.TABLES.strip().split(";"):
        if statement.strip():
            sql(dsn, schema, statement)


@pytest.fixture
def procs(dsn: str, tmp_path: Path) -> Iterator[Procs]:
    p = Procs(dsn, tmp_path)
    try:
        yield p
    finally:
        p.kill_all()


def enqueue(dsn: str, handle: Any, *keys: str) -> list[str]:
    async def go() -> list[str]:
        async with open_jobs(postgres_driver(dsn), jobs=process_jobs.jobs):
            return [e.id for e in await handle.enqueue_many([Work(k) for k in keys])]

    return trio.run(go)


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def effects(p: Procs, schema: str, pg_dsn: str, what: str | None = None) -> list[tuple[Any, ...]]:
    q = "SELECT key, what, attempt, pid FROM proc_effects"
    if what is not None:
        return sql(pg_dsn, schema, q + " WHERE what = %s ORDER BY at", (what,))
    return sql(pg_dsn, schema, q + " ORDER BY at")


def row(pg_dsn: str, schema: str, job_id: str) -> tuple[Any, ...]:
    return sql(
        pg_dsn, schema, "SELECT state, attempts FROM trio_jobs_jobs WHERE id = %s", (job_id,)
    )[0]


# --------------------------------------------------------------------------- crashes and drains


def test_sigkill_mid_step_resumes_after_the_lease_lapses_without_rerunning_completed_steps(
    procs: Procs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    first = procs.worker("--visibility-timeout", "2s")
    (job_id,) = enqueue(dsn, process_jobs.three_steps, "k1")
    wait_until(lambda: effects(procs, pg_schema, pg_dsn, "two-start"), 10, "step two to start")
    first.send_signal(signal.SIGKILL)
    first.wait(5)
    killed_at = time.monotonic()
    assert row(pg_dsn, pg_schema, job_id) == ("running", 1)  # nobody settled it
    procs.worker("--visibility-timeout", "2s", "--idle-poll-max", "250ms")
    wait_until(lambda: row(pg_dsn, pg_schema, job_id)[0] == "done", 15, "the job to finish")
    assert time.monotonic() - killed_at >= 1.0  # it waited for the 2 s lease to lapse
    done = [(what, attempt) for _k, what, attempt, _pid in effects(procs, pg_schema, pg_dsn)]
    # `one` completed before the kill: replayed from storage, never run again.
    assert done == [("one", 1), ("two-start", 1), ("two-start", 2), ("two-end", 2), ("three", 2)]
    steps = sql(
        pg_dsn,
        pg_schema,
        "SELECT name, status, executions FROM trio_jobs_steps WHERE job_id = %s ORDER BY seq",
        (job_id,),
    )
    assert steps == [("one", "completed", 1), ("two", "completed", 1), ("three", "completed", 1)]
    assert row(pg_dsn, pg_schema, job_id) == ("done", 2)  # the lapse counted an attempt


def test_sigkill_inside_a_transaction_step_leaves_neither_the_write_nor_the_record(
    procs: Procs, dsn: str, pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    first = procs.worker("--visibility-timeout", "2s")
    (job_id,) = enqueue(dsn, process_jobs.atomic, "t1")
    wait_until(lambda: (tmp_path / "atomic-t1").exists(), 10, "the app write to be made")
    first.send_signal(signal.SIGKILL)
    first.wait(5)
    # The write was made in the step's transaction and never committed.
    assert effects(procs, pg_schema, pg_dsn, "atomic") == []
    procs.worker("--visibility-timeout", "2s", "--idle-poll-max", "250ms")
    wait_until(lambda: row(pg_dsn, pg_schema, job_id)[0] == "done", 15, "the job to finish")
    assert [(w, a) for _k, w, a, _p in effects(procs, pg_schema, pg_dsn, "atomic")] == [
        ("atomic", 2)
    ]
    steps = sql(
        pg_dsn,
        pg_schema,
        "SELECT name, status, executions, output::text FROM trio_jobs_steps WHERE job_id = %s",
        (job_id,),
    )
    # The first execution left no record at all: the one record is the second's.
    assert steps == [("write", "completed", 1, '{"attempt":2}')]


def test_sigterm_drains_with_the_attempt_uncounted_and_exits_0(
    procs: Procs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    worker = procs.worker("--drain-timeout", "10s")
    (job_id,) = enqueue(dsn, process_jobs.blocker, "b1")
    wait_until(lambda: effects(procs, pg_schema, pg_dsn, "wait-start"), 10, "the body to start")
    assert row(pg_dsn, pg_schema, job_id) == ("running", 1)
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(15) == 0, procs.log(worker)
    assert time.monotonic() - started < 5  # the body unwound at once; no deadline was spent
    assert row(pg_dsn, pg_schema, job_id) == ("ready", 0)  # handed back, attempt uncounted
    log = procs.log(worker)
    assert "jobs.worker.draining signal=SIGTERM" in log
    assert "jobs.worker.drained" in log
    assert "drained=1" in log


def test_a_second_sigterm_abandons_at_once_and_exits_non_zero(
    procs: Procs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    worker = procs.worker("--drain-timeout", "30s")
    (job_id,) = enqueue(dsn, process_jobs.stubborn, "s1")
    wait_until(lambda: effects(procs, pg_schema, pg_dsn, "stubborn-start"), 10, "the body")
    worker.send_signal(signal.SIGTERM)
    procs.wait_log(worker, "jobs.worker.draining")
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(10) == 3, procs.log(worker)
    assert time.monotonic() - started < 5  # not the 30 s drain deadline
    assert "jobs.worker.abandoned" in procs.log(worker)
    assert "reason=second SIGTERM" in procs.log(worker)
    # Abandoned, not handed back: the lease lapses and the attempt counts.
    assert row(pg_dsn, pg_schema, job_id) == ("running", 1)


def test_the_drain_deadline_abandons_a_body_that_ignores_its_abort(
    procs: Procs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    worker = procs.worker("--drain-timeout", "500ms")
    enqueue(dsn, process_jobs.stubborn, "s2")
    wait_until(lambda: effects(procs, pg_schema, pg_dsn, "stubborn-start"), 10, "the body")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(15) == 3, procs.log(worker)
    log = procs.log(worker)
    assert "jobs.drain.abandoned" in log  # the worker named the job it gave up on
    assert "reason=drain-deadline" in log


# --------------------------------------------------------------------------- fleet-wide cap


def test_two_worker_processes_hold_a_concurrency_2_cap(
    procs: Procs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    a = procs.worker("--concurrency", "4", "--idle-poll-max", "250ms")
    b = procs.worker("--concurrency", "4", "--idle-poll-max", "250ms")
    ids = enqueue(dsn, process_jobs.capped, *[f"c{i}" for i in range(10)])
    wait_until(
        lambda: (
            sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs WHERE state = 'done'")[0][0]
            == len(ids)
        ),
        30,
        "every capped job to finish",
    )
    peak, running = sql(pg_dsn, pg_schema, "SELECT peak, running FROM proc_gauge")[0]
    assert (peak, running) == (2, 0)  # the cap was reached, and never passed
    pids = {pid for _k, _w, _a, pid in effects(procs, pg_schema, pg_dsn, "capped")}
    assert pids <= {a.pid, b.pid}
    for proc in (a, b):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


# --------------------------------------------------------------------------- the wake


def test_an_idle_worker_is_woken_by_an_enqueue_from_another_process(
    procs: Procs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    # A 30 s poll, from the first idle pass on: only the wake can explain a
    # pickup within seconds (a missed one waits the 30 s out).
    worker = procs.worker("--poll-interval", "30s", "--idle-poll-max", "30s")
    procs.wait_log(worker, "jobs.wake.live")
    time.sleep(0.5)  # idle, in its 30 s wait
    latencies = []
    for i in range(4):
        # From the enqueue's return (its commit landed): the enqueuer's own
        # commit (an fsync the server may stall under load) is not the wake's.
        (job_id,) = enqueue(dsn, process_jobs.pickup, f"p{i}")
        committed = sql(pg_dsn, pg_schema, "SELECT extract(epoch FROM clock_timestamp())")
        try:
            started = wait_until(
                lambda job_id=job_id: sql(
                    pg_dsn,
                    pg_schema,
                    "SELECT e.at FROM proc_effects e JOIN trio_jobs_jobs j "
                    "ON j.idempotency_key = 'pickup:' || e.key WHERE j.id = %s",
                    (job_id,),
                ),
                10,
                f"the pickup of p{i}",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the worker's log:\n{procs.log(worker)}") from None
        latencies.append(max(0.0, float(started[0][0]) - float(committed[0][0])))
        time.sleep(0.5)  # idle again before the next one
    print(
        f"pickup across processes: median {statistics.median(latencies) * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms"
    )
    # Seconds of slack for a loaded machine; a missed wake costs the 30 s poll.
    assert max(latencies) < 5.0, (latencies, procs.log(worker))


# --------------------------------------------------------------------------- transactions


def test_a_rolled_back_transaction_leaves_no_job(
    procs: Procs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    procs.worker("--idle-poll-max", "250ms")
    # Killed before its commit: the server rolls the transaction back.
    hang = procs.spawn("-m", "process_jobs", "stage-and-hang", dsn, "g1", stdout=subprocess.PIPE)
    assert hang.stdout is not None
    staged = orjson.loads(hang.stdout.readline())["staged"]
    hang.send_signal(signal.SIGKILL)
    hang.wait(5)
    # Rolled back by an exception in the handler.
    out = subprocess.run(
        [sys.executable, "-m", "process_jobs", "stage-and-raise", dsn, "g2"],
        env=procs._env(),
        capture_output=True,
        timeout=30,
        check=True,
    )
    rolled = orjson.loads(out.stdout.splitlines()[-1])["rolled_back"]
    time.sleep(1.0)  # the worker polls every 250 ms: it would have run a ghost by now
    for job_id in (staged, rolled):
        assert sql(pg_dsn, pg_schema, "SELECT 1 FROM trio_jobs_jobs WHERE id = %s", (job_id,)) == []
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs")[0][0] == 0
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM app_rows")[0][0] == 0
    assert effects(procs, pg_schema, pg_dsn, "ghost-ran") == []


def test_twenty_concurrent_enqueues_of_one_key_from_twenty_processes_make_one_row(
    procs: Procs, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    racers = [
        procs.spawn(
            "-m",
            "process_jobs",
            "enqueue-on-go",
            dsn,
            "the-key",
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
        )
        for _ in range(20)
    ]
    for proc in racers:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, procs.log(proc)
        assert "ready" in orjson.loads(line)
    for proc in racers:  # every process is connected and waiting: they enqueue together
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    answers = []
    for proc in racers:
        assert proc.stdout is not None
        answers.append(orjson.loads(proc.stdout.readline()))
        assert proc.wait(15) == 0
    assert len({a["id"] for a in answers}) == 1
    assert sorted(a["deduped"] for a in answers) == [False] + [True] * 19
    rows = sql(
        pg_dsn,
        pg_schema,
        "SELECT count(*) FROM trio_jobs_jobs WHERE idempotency_key = 'pickup:the-key'",
    )
    assert rows == [(1,)]
