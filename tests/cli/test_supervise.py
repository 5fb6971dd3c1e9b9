"""``worker --processes N``'s decisions, without processes: how a child's end
is read, the restart backoff, a child's command line, the link's environment.
tests/drivers/postgres/test_worker_processes.py runs the supervisor for real."""

from __future__ import annotations

import os
import socket
import sys

import pytest
from click.testing import CliRunner

from trio_jobs.cli import main
from trio_jobs.cli._supervise import (
    LINK_ENV,
    MAX_PROCESSES,
    RESTART_FIRST,
    RESTART_MAX,
    STABLE_AFTER,
    Backoff,
    Child,
    ChildLink,
    ChildState,
    Ending,
    child_command,
    ending,
)

WORKER = main.commands["worker"]


@pytest.mark.parametrize(
    ("returncode", "ready", "told", "expected"),
    [
        # Told to drain: 0 is a clean drain, 3 an abandonment.
        (0, True, True, Ending.DRAINED),
        (3, True, True, Ending.ABANDONED),
        # Killed or crashed mid-drain after it claimed: its leases lapse.
        (-9, True, True, Ending.ABANDONED),
        (1, True, True, Ending.ABANDONED),
        # Gone mid-drain before it was ready: it held no job.
        (-15, False, True, Ending.DRAINED),
        (1, False, True, Ending.DRAINED),
        (3, False, True, Ending.ABANDONED),
        # Untold: a refusal before ready, else a death to restart.
        (1, False, False, Ending.REFUSED),
        (2, False, False, Ending.REFUSED),
        (1, True, False, Ending.DIED),
        (-9, False, False, Ending.DIED),
        (-9, True, False, Ending.DIED),
        (0, True, False, Ending.DIED),
        (3, True, False, Ending.DIED),
        (70, False, False, Ending.DIED),
    ],
)
def test_how_a_child_ended(returncode: int, ready: bool, told: bool, expected: Ending) -> None:
    assert ending(returncode, ready=ready, told=told) is expected


def test_the_backoff_doubles_to_its_ceiling_and_resets_after_a_stable_run() -> None:
    backoff = Backoff()
    delays = [backoff.after(uptime=1.0) for _ in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert (RESTART_FIRST, RESTART_MAX) == (0.5, 30.0)
    assert backoff.after(uptime=STABLE_AFTER) == RESTART_FIRST
    assert backoff.after(uptime=STABLE_AFTER - 1) == 2 * RESTART_FIRST


def test_a_child_state_moves_only_forward() -> None:
    child = Child(slot=0, process=None, link=None, started=0.0)  # type: ignore[arg-type]
    child.move(ChildState.READY)
    child.move(ChildState.EXITED)
    with pytest.raises(AssertionError, match="cannot move from exited to ready"):
        child.move(ChildState.READY)


@pytest.mark.parametrize(
    "args",
    [
        ["myapp.jobs", "--processes", "4"],
        [
            "myapp.jobs:ALL", "--processes=3", "--queues", "-odd,mail", "--concurrency",
            "mail=2,-odd=1", "--max-in-flight", "5", "--no-purge", "--json", "--idle-poll-max",
            "1s", "--database-url", "postgresql://u@h/db?options=-c%20x", "--drain-timeout", "0",
        ],
    ],
)  # fmt: skip
def test_a_child_gets_the_same_arguments_minus_processes(args: list[str]) -> None:
    ctx = WORKER.make_context("worker", list(args))
    command = child_command(ctx)
    assert command[:4] == [sys.executable, "-m", "trio_jobs.cli", "worker"]
    assert not any(a.startswith("--processes") for a in command)
    again = WORKER.make_context("worker", command[4:])
    expected = {**ctx.params, "processes": 1}
    assert again.params == expected


def test_the_link_comes_from_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LINK_ENV, raising=False)
    assert ChildLink.from_env() is None
    for bad in ("", "x", "99999"):
        monkeypatch.setenv(LINK_ENV, bad)
        assert ChildLink.from_env() is None  # not a socket it holds: unsupervised
    mine, theirs = socket.socketpair()
    with mine, theirs:
        monkeypatch.setenv(LINK_ENV, str(theirs.fileno()))
        link = ChildLink.from_env()
        assert link is not None
        assert LINK_ENV not in os.environ  # a process the jobs start is no child
        assert not theirs.get_inheritable()
        link.ready("w-1")
        assert mine.recv(100) == b'{"ready":{"worker_id":"w-1"}}\n'


@pytest.mark.parametrize(
    ("value", "exit_code"),
    [("0", 1), ("-1", 1), (str(MAX_PROCESSES + 1), 1), ("x", 2), ("1.5", 2), ("", 2)],
)
def test_a_bad_processes_count_is_refused_before_any_io(value: str, exit_code: int) -> None:
    out = CliRunner().invoke(
        main,
        [
            "worker", "trio_jobs.examples.onboarding", "--processes", value,
            "--database-url", "postgresql://127.0.0.1:1/x",
        ],
    )  # fmt: skip
    assert out.exit_code == exit_code, out.output
    assert out.output.startswith("X_CONFIG_INVALID: "), out.output
    assert "--processes" in out.output
