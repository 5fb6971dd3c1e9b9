"""``trio-jobs worker --processes N`` as real processes against a real
PostgreSQL: the supervisor spreads the work over its children, drains them on
SIGTERM (and Ctrl-C), restarts a child that dies, and stops, without a restart
loop, when its children refuse their configuration.

The supervisor runs with ``--json``: every line on its stderr (its own and its
children's) is a JSON event, and each supervisor event is checked against
:data:`trio_jobs.logging.EVENTS`. Real time, bounded at every wait.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import trio_jobs.logging as tj_logging

from .conftest import sql
from .test_processes import Procs, effects, enqueue, process_jobs, row, wait_until
from .test_processes import dsn as dsn  # the fixture: the test's migrated schema

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


class Supervisors(Procs):
    """``Procs`` whose supervisors' children are killed at teardown too (a
    test may kill a supervisor; its children then drain on their own)."""

    def supervisor(
        self,
        *flags: str,
        target: str = "process_jobs",
        processes: int = 2,
        ready: int = 2,
        session: bool = False,
        json: bool = True,
    ) -> Any:
        """``trio-jobs worker TARGET --processes N [--json] FLAGS``; waits for
        ``ready`` children to say ``jobs.worker.ready``."""
        self._n += 1
        err = open(self.tmp / f"sup{self._n}.err", "wb")
        out = open(self.tmp / f"sup{self._n}.out", "wb")
        as_json = ["--json"] if json else []
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "trio_jobs.cli", "worker", target),
                *("--processes", str(processes), *as_json, "--database-url", self.dsn, *flags),
            ],
            env=self._env(),
            cwd=self.tmp,
            stdout=out,
            stderr=err,
            # A session of its own: a test may signal its whole process group,
            # as a terminal's Ctrl-C does, without reaching pytest.
            start_new_session=session,
        )
        proc.err_path = err.name  # type: ignore[attr-defined]
        proc.out_path = out.name  # type: ignore[attr-defined]
        self.all.append(proc)
        if ready:
            self.wait_events(proc, "jobs.worker.ready", ready)
        return proc

    def events(self, proc: Any, name: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in self.log(proc).splitlines():
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                found.append(event)
        return found

    def wait_events(self, proc: Any, name: str, count: int = 1, timeout: float = 60) -> list[Any]:
        # 60 s: a supervisor and its children each import the library before they
        # say anything; on a busy two-core box (the suite on both cores beside
        # other work) three start-ups took over 20 s. No test here times them.
        deadline = time.monotonic() + timeout
        while len(found := self.events(proc, name)) < count:
            if proc.poll() is not None:
                raise AssertionError(f"exited {proc.returncode}:\n{self.log(proc)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {count} {name!r} in:\n{self.log(proc)}")
            time.sleep(0.02)
        return found

    def child_pids(self, proc: Any) -> set[int]:
        return {e["pid"] for e in self.events(proc) if e.get("event") == "jobs.worker.ready"} | {
            e["pid"]
            for e in self.events(proc)
            if e.get("event")
            in ("jobs.supervisor.child-started", "jobs.supervisor.child-restarted")
        }

    def kill_all(self) -> None:
        for proc in self.all:
            for pid in self.child_pids(proc):
                if not gone(pid):
                    os.kill(pid, signal.SIGKILL)
        super().kill_all()


def gone(pid: int) -> bool:
    """Exited (a zombie whose parent has not reaped it counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
def sup(dsn: str, tmp_path: Path) -> Iterator[Supervisors]:
    p = Supervisors(dsn, tmp_path)
    try:
        yield p
    finally:
        p.kill_all()


def check_supervisor_events(sup: Supervisors, proc: Any) -> None:
    """Every supervisor event is catalogued, at its level, with its fields."""
    seen = [e for e in sup.events(proc) if e["event"].startswith("jobs.supervisor.")]
    assert seen
    for event in seen + sup.events(proc, "jobs.worker.orphaned"):
        name = event["event"]
        assert name in tj_logging.EVENTS, name
        level, fields, _meaning = tj_logging.EVENTS[name]
        assert event["level"] == level, event
        extra = set(event) - {"ts", "level", "logger", "event"}
        assert extra <= set(fields), (name, extra - set(fields))


def outcome(proc: Any) -> dict[str, Any]:
    return orjson.loads(Path(proc.out_path).read_bytes())  # type: ignore[no-any-return]


def done_count(pg_dsn: str, schema: str) -> int:
    return sql(pg_dsn, schema, "SELECT count(*) FROM trio_jobs_jobs WHERE state = 'done'")[0][0]  # type: ignore[return-value]


# --------------------------------------------------------------------------- the work


def test_two_processes_share_the_work_and_drain_on_sigterm(
    sup: Supervisors, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    proc = sup.supervisor("--concurrency", "1", "--idle-poll-max", "250ms")
    children = {e["pid"] for e in sup.events(proc, "jobs.worker.ready")}
    assert len(children) == 2
    assert len({e["worker_id"] for e in sup.events(proc, "jobs.worker.ready")}) == 2
    ids = enqueue(dsn, process_jobs.slow, *[f"w{i}" for i in range(8)])
    wait_until(lambda: done_count(pg_dsn, pg_schema) == len(ids), 30, "every job to finish")
    pids = [pid for _k, _w, _a, pid in effects(sup, pg_schema, pg_dsn, "slow")]
    assert len(pids) == len(ids)  # each ran once
    assert set(pids) == children  # on both children, and only there
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, sup.log(proc)
    body = outcome(proc)
    assert (body["ok"], body["outcome"], body["restarts"]) == (True, "drained", 0)
    assert {w["pid"] for w in body["workers"]} == children
    assert sum(w["done"] for w in body["workers"]) == len(ids)
    check_supervisor_events(sup, proc)


def test_sigterm_hands_back_the_jobs_mid_step_in_every_child_and_exits_0(
    sup: Supervisors, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    proc = sup.supervisor("--concurrency", "1", "--drain-timeout", "10s")
    ids = enqueue(dsn, process_jobs.blocker, "b1", "b2")
    started = wait_until(
        lambda: len(e := effects(sup, pg_schema, pg_dsn, "wait-start")) == 2 and e, 10, "bodies"
    )
    assert len({pid for _k, _w, _a, pid in started}) == 2  # one in each child
    assert [row(pg_dsn, pg_schema, i) for i in ids] == [("running", 1)] * 2
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, sup.log(proc)
    assert time.monotonic() - began < 8  # the bodies unwound at once; no deadline spent
    # Handed back, the attempt uncounted, by both children.
    assert [row(pg_dsn, pg_schema, i) for i in ids] == [("ready", 0)] * 2
    drained = sup.events(proc, "jobs.worker.drained")
    assert sorted(e["drained"] for e in drained) == [1, 1]
    assert len(sup.events(proc, "jobs.supervisor.draining")) == 1
    assert sup.events(proc, "jobs.worker.abandoned") == []
    assert outcome(proc)["outcome"] == "drained"
    check_supervisor_events(sup, proc)


def test_ctrl_c_at_the_terminal_drains_once_and_exits_0(
    sup: Supervisors, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    """The terminal sends SIGINT to its whole foreground process group: the
    children are not in it, so each gets the one SIGTERM the supervisor
    forwards, not a second signal that would abandon its job."""
    proc = sup.supervisor("--concurrency", "1", session=True)
    ids = enqueue(dsn, process_jobs.blocker, "c1", "c2")
    wait_until(lambda: len(effects(sup, pg_schema, pg_dsn, "wait-start")) == 2, 10, "bodies")
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(20) == 0, sup.log(proc)
    assert [row(pg_dsn, pg_schema, i) for i in ids] == [("ready", 0)] * 2
    assert sup.events(proc, "jobs.supervisor.draining")[0]["reason"] == "SIGINT"


def test_a_second_sigterm_abandons_in_every_child_and_exits_3(
    sup: Supervisors, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    proc = sup.supervisor("--concurrency", "1", "--drain-timeout", "30s")
    ids = enqueue(dsn, process_jobs.stubborn, "s1", "s2")
    wait_until(lambda: len(effects(sup, pg_schema, pg_dsn, "stubborn-start")) == 2, 10, "bodies")
    proc.send_signal(signal.SIGTERM)
    sup.wait_events(proc, "jobs.worker.draining", 2)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 3, sup.log(proc)
    assert time.monotonic() - began < 8  # not the 30 s drain deadline
    assert len(sup.events(proc, "jobs.worker.abandoned")) == 2
    assert len(sup.events(proc, "jobs.supervisor.abandoning")) == 1
    # Abandoned, not handed back: the leases lapse and the attempts count.
    assert [row(pg_dsn, pg_schema, i) for i in ids] == [("running", 1)] * 2
    body = outcome(proc)
    assert (body["ok"], body["outcome"]) == (False, "abandoned")
    check_supervisor_events(sup, proc)


# --------------------------------------------------------------------------- restarts


def test_a_sigkilled_child_is_restarted_and_the_jobs_still_finish(
    sup: Supervisors, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    proc = sup.supervisor("--visibility-timeout", "2s", "--idle-poll-max", "250ms")
    first = {e["pid"] for e in sup.events(proc, "jobs.worker.ready")}
    (job_id,) = enqueue(dsn, process_jobs.three_steps, "k1")
    started = wait_until(lambda: effects(sup, pg_schema, pg_dsn, "two-start"), 10, "step two")
    victim = started[0][3]
    assert victim in first
    os.kill(victim, signal.SIGKILL)
    exited = sup.wait_events(proc, "jobs.supervisor.child-exited")[0]
    assert (exited["pid"], exited["signal"], exited["restart_in"]) == (victim, "SIGKILL", 0.5)
    restarted = sup.wait_events(proc, "jobs.supervisor.child-restarted")[0]
    assert restarted["previous_pid"] == victim
    new = restarted["pid"]
    assert new not in first
    ready = sup.wait_events(proc, "jobs.worker.ready", 3)
    assert ready[-1]["pid"] == new  # the replacement claims
    ids = enqueue(dsn, process_jobs.slow, *[f"r{i}" for i in range(4)])
    wait_until(lambda: row(pg_dsn, pg_schema, job_id)[0] == "done", 20, "the killed job")
    wait_until(lambda: done_count(pg_dsn, pg_schema) == len(ids) + 1, 20, "every job to finish")
    assert row(pg_dsn, pg_schema, job_id) == ("done", 2)  # the lapse counted an attempt
    survivors = (first - {victim}) | {new}
    ran = {pid for _k, _w, _a, pid in effects(sup, pg_schema, pg_dsn)} - {victim}
    assert ran <= survivors
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, sup.log(proc)
    body = outcome(proc)
    assert body["restarts"] == 1
    assert {w["pid"] for w in body["workers"]} == survivors
    check_supervisor_events(sup, proc)


def test_a_killed_supervisor_leaves_no_child_running(
    sup: Supervisors, dsn: str, pg_dsn: str, pg_schema: str
) -> None:
    proc = sup.supervisor("--concurrency", "1")
    children = {e["pid"] for e in sup.events(proc, "jobs.worker.ready")}
    (job_id,) = enqueue(dsn, process_jobs.blocker, "o1")
    wait_until(lambda: effects(sup, pg_schema, pg_dsn, "wait-start"), 10, "the body")
    proc.send_signal(signal.SIGKILL)
    proc.wait(5)
    # Each child saw its link close: it drained itself, handing the job back.
    wait_until(lambda: all(gone(pid) for pid in children), 15, "the children to exit")
    assert row(pg_dsn, pg_schema, job_id) == ("ready", 0)
    assert len(sup.events(proc, "jobs.worker.orphaned")) == 2
    assert len(sup.events(proc, "jobs.worker.drained")) == 2


# --------------------------------------------------------------------------- refusals


def test_children_that_refuse_their_configuration_stop_the_supervisor_at_once(
    sup: Supervisors, dsn: str
) -> None:
    began = time.monotonic()
    proc = sup.supervisor(target="tj_no_such_jobs", processes=3, ready=0, json=False)
    assert proc.wait(30) == 1, sup.log(proc)
    assert time.monotonic() - began < 15
    log = sup.log(proc)
    assert log.count("jobs.supervisor.child-started") == 3
    assert "jobs.supervisor.child-restarted" not in log  # no restart loop
    assert log.count("jobs.supervisor.child-refused") == 1
    # The refusal is printed once, by the supervisor, as a lone worker prints it.
    refusals = [line for line in log.splitlines() if line.startswith("X_")]
    assert refusals == [
        "X_CONFIG_INVALID: could not import 'tj_no_such_jobs' (ModuleNotFoundError: No module "
        "named 'tj_no_such_jobs'); run from the folder that holds it, or put it on PYTHONPATH"
    ]
    again = sup.supervisor(target="tj_no_such_jobs", ready=0)
    assert again.wait(30) == 1, sup.log(again)
    body = outcome(again)  # one document on stdout
    assert body["ok"] is False
    assert body["error"]["code"] == "X_CONFIG_INVALID"


def test_a_slot_that_keeps_refusing_after_a_good_start_stops_the_supervisor(
    sup: Supervisors, dsn: str
) -> None:
    """The jobs module imported at start, then vanished (a bad deploy): a child
    that dies is restarted into refusals, backed off, and the third in a row
    stops the supervisor; the other child drains."""
    module = sup.tmp / "vanishing_jobs.py"
    module.write_text("from process_jobs import *  # noqa: F403\n")
    proc = sup.supervisor(target="vanishing_jobs", ready=0)
    ready = sup.wait_events(proc, "jobs.worker.ready", 2)
    module.unlink()
    shutil.rmtree(sup.tmp / "__pycache__", ignore_errors=True)
    os.kill(ready[0]["pid"], signal.SIGKILL)
    assert proc.wait(40) == 1, sup.log(proc)
    exited = sup.events(proc, "jobs.supervisor.child-exited")
    # The kill, then two refusals, each restarted after a longer wait.
    assert [e["restart_in"] for e in exited] == [0.5, 1.0, 2.0]
    assert [e["signal"] for e in exited] == ["SIGKILL", None, None]
    assert [e["code"] for e in exited] == [None, "X_CONFIG_INVALID", "X_CONFIG_INVALID"]
    (refused,) = sup.events(proc, "jobs.supervisor.child-refused")
    assert (refused["refusals"], refused["exit_code"]) == (3, 1)
    assert len(sup.events(proc, "jobs.worker.drained")) == 1  # the other child
    check_supervisor_events(sup, proc)
