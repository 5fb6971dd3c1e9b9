import pathlib
import sys

# The suite imports in importlib mode, which adds nothing to sys.path: make the
# shared helpers (tests/jobs_support.py, tests/virtual_time.py) importable.
_TESTS = str(pathlib.Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from virtual_time import (  # noqa: E402, F401 - fixtures, used by name
    _capture_job_logs,
    _clean_retry_classes,
    _virtual_time_only,
)
