import pathlib
import sys

# The suite imports in importlib mode, which adds nothing to sys.path: make the
# shared helpers (tests/jobs_support.py, tests/rollup_support.py) importable.
_TESTS = str(pathlib.Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# Rollups run on PostgreSQL in real time (as tests/drivers/postgres does): the
# virtual-time guard of the memory suites is left out here.
from virtual_time import (  # noqa: E402, F401 - fixtures, used by name
    _capture_job_logs,
    _clean_retry_classes,
)
