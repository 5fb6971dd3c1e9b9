"""The ``trio-jobs`` command."""

from ._main import main

__all__ = ["main"]
