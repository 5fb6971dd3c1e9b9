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
"""

from __future__ import annotations

import gc
from types import TracebackType

__all__ = ["paused_gc"]


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
