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
    async test that forgets ``autojump_clock`` would run in real time.
    ``mock_clock`` (a MockClock that stands still until the test jumps it) is
    virtual time too."""
    if inspect.iscoroutinefunction(request.function):
        parameters = inspect.signature(request.function).parameters
        if "autojump_clock" not in parameters and "mock_clock" not in parameters:
            pytest.fail(f"{request.node.name} must take the autojump_clock fixture")


@pytest.fixture(autouse=True)
def _clean_retry_classes():
    yield
    reset_retry_classes()


@pytest.fixture(autouse=True)
def _capture_job_logs(caplog):
    caplog.set_level(logging.DEBUG, logger="trio_jobs")
    return caplog
