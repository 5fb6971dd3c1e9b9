"""``python -m trio_jobs.cli``: the ``trio-jobs`` command."""

from ._main import main

main(prog_name="trio-jobs")
