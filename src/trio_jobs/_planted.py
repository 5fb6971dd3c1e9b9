"""Planted bugs: test-only switches that break one guarantee each.

The checkers (``simulate_jobs``'s invariants and ``crash_proof``) are checked by
switching each on and asserting they catch it (``tests/testing/test_planted_bugs.py``).
Nothing in production sets them: only :func:`planted` does, inside a ``with``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["NAMES", "active", "planted"]

NAMES = frozenset(
    {
        "double-settle",  # the worker settles a run twice, and the driver lets it
        "unfenced-settle",  # a settle lands without holding the claim's lease
        "step-rerun",  # a replay re-runs a step that has a completed record
        "drain-counts",  # a drained attempt is handed back counted
        "dedupe-ignores-tenant",  # the live key leaves the tenant out
        "lease-not-released",  # a settle keeps the run's concurrency lease
        "compensation-reversed",  # compensators run first-in first-out
        "cancelled-body-writes",  # a step starts and records after the abort
        "event-before-wait",  # a wait sees events published before it began
        "waiter-not-woken",  # a released slot leaves the runs waiting on its key asleep
    }
)

_ON: set[str] = set()


def active(name: str) -> bool:
    """Whether the planted bug ``name`` is switched on (always False in production)."""
    return bool(_ON) and name in _ON


@contextlib.contextmanager
def planted(name: str) -> Iterator[None]:
    """Switch the planted bug ``name`` on for the block (tests only)."""
    if name not in NAMES:
        raise ValueError(f"unknown planted bug {name!r}; one of {sorted(NAMES)}")
    _ON.add(name)
    try:
        yield
    finally:
        _ON.discard(name)
