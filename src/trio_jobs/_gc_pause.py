"""The cyclic garbage collector held off around a synchronous inner loop.

A data job's parse builds thousands of small objects (a row's instance, its
list of cells) that all live until their batch is handled: each gen-0 and
gen-1 collection the allocations trigger traverses them again while none of
them can be garbage. :class:`paused_gc` keeps the collector off strictly
around such a loop and no wider:

- only a loop with no ``await`` inside (the state is the interpreter's, not the
  task's: across an ``await`` other tasks would run with it off);
- only if the collector was on when it began: an app that turned it off keeps
  it off, and a nested pause (which finds it off) does not turn it back on
  before the outer one ends;
- turned back on in ``__exit__`` whatever ended the loop, an exception too.

What the loop allocated is still counted: the first allocation after the pause
runs the gen-0 collection it is due (once for the whole loop, not every 700
objects), so nothing is left uncollected.

:class:`raised_young_threshold` is the worker's: while a :class:`~trio_jobs.Worker`
runs, the collector's youngest generation is collected every 10,000 net
allocations of tracked objects instead of CPython's 700 (see
docs/explanation/design-choices.md, "The worker raises the young GC threshold").
With hundreds of attempts in flight, a collection every 700 objects finds most
of them still alive (a claimed job's objects live until its ack's answer), so
each is traversed again, promoted, and traversed by the older generations'
collections too; at 10,000 most of them are gone by the next collection.
"""

from __future__ import annotations

import gc
import threading
from types import TracebackType

from .errors import ErrorCode, JobsError

__all__ = ["YOUNG_THRESHOLD", "check_young_threshold", "paused_gc", "raised_young_threshold"]


class paused_gc:
    """``with paused_gc(): ...``: the collector off for the block if it was on."""

    __slots__ = ("_was_on",)

    def __enter__(self) -> None:
        self._was_on = gc.isenabled()
        if self._was_on:
            gc.disable()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._was_on:
            gc.enable()


#: The youngest generation's threshold while a worker runs (``Worker(...,
#: gc_young_threshold=)``'s default).
YOUNG_THRESHOLD = 10_000


def check_young_threshold(value: object) -> int | None:
    """``gc_young_threshold`` as given: a whole number, 1 or more, or ``None``
    (leave the collector as the app set it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "gc_young_threshold must be a whole number, 1 or more "
            "(or None to leave the garbage collector's thresholds as they are)",
        )
    return value


# The process-wide raise: held by every running worker that asked for one, set
# by the first, put back by the last (the thresholds are the interpreter's, so
# workers on Trio loops in other threads share them: the lock orders them).
_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] | None = None  # what the first holder found
_ours: int | None = None  # the threshold it set (None: it found one as high)


class raised_young_threshold:
    """``with raised_young_threshold(n): ...``: the youngest generation's
    threshold at least ``n`` inside the block (``None``: untouched).

    A threshold already as high (an app that tuned it) is kept. Blocks may
    overlap (several workers in one process): the first raises it, the last to
    end puts back what the first found, unless something else changed it
    meanwhile, which is then left as it is.
    """

    __slots__ = ("_held", "_value")

    def __init__(self, value: int | None) -> None:
        self._value = value
        self._held = False

    def __enter__(self) -> None:
        global _holders, _saved, _ours
        if self._value is None:
            return
        with _lock:
            if _holders == 0:
                found = gc.get_threshold()
                if found[0] < self._value:
                    _saved, _ours = found, self._value
                    gc.set_threshold(self._value, found[1], found[2])
                else:
                    _saved, _ours = None, None
            _holders += 1
        self._held = True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _holders, _saved, _ours
        if not self._held:
            return
        self._held = False
        with _lock:
            _holders -= 1
            if _holders == 0:
                if _saved is not None and gc.get_threshold()[0] == _ours:
                    gc.set_threshold(*_saved)
                _saved, _ours = None, None
