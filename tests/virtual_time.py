"""Fixtures shared by the folders whose tests run on Trio's MockClock only
(tests/harness, tests/steps, tests/worker): each folder's conftest imports them."""

import inspect
import logging

import pytest

from jobs_support import reset_retry_classes


@pytest.fixture(autouse=True)
def _virtual_time_only(request):
    """Every async test here runs on Trio's MockClock: no wall-clock sleeps.

    pytest-trio hands ``trio.run`` only a clock the test itself declares, so an
    async test that forgets ``autojump_clock`` would run in real time."""
    if inspect.iscoroutinefunction(request.function):
        if "autojump_clock" not in inspect.signature(request.function).parameters:
            pytest.fail(f"{request.node.name} must take the autojump_clock fixture")


@pytest.fixture(autouse=True)
def _clean_retry_classes():
    yield
    reset_retry_classes()


@pytest.fixture(autouse=True)
def _capture_job_logs(caplog):
    caplog.set_level(logging.DEBUG, logger="trio_jobs")
    return caplog
