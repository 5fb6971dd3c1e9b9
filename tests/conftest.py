"""Suite-wide hooks.

``python -m pytest -n auto --dist loadfile`` (the README's command) runs the
suite on pytest-xdist workers, one test file per worker at a time: the tests
mostly wait on servers, subprocesses and sleeps, so two workers on two cores
take about half the time of one. Every worker shares one PostgreSQL (the
embedded server's start is serialised by pgserver's own file lock), so ``auto``
is capped at four workers: more would press the server's 100 connections.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

#: The most workers ``-n auto`` starts (see the module's docstring).
MAX_AUTO_WORKERS = 4


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own answer: the number that variable names
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_AUTO_WORKERS, cpus or 1))


#: What pytest-xdist's workers find changed in their environment: a worker
#: starts with COLUMNS=80 and LINES=24 whatever the run's own environment said,
#: and the CLI's tables (``trio-jobs list``, ``backfills``) take COLUMNS as their
#: width, where a pipe is otherwise 160 wide. Each worker restores the run's.
_TERMINAL = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, run in the controller per worker
def pytest_configure_node(node: Any) -> None:
    node.workerinput["trio_jobs_terminal"] = {name: os.environ.get(name) for name in _TERMINAL}


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    for name, value in (workerinput or {}).get("trio_jobs_terminal", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
