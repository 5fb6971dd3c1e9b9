"""The wall clock a checked job's body reads, moved between its attempts.

The harness freezes only its own clock: a body that reads ``datetime.now()``
or ``time.time()`` itself sees the real time, which barely moves between a
recorded attempt and its replay, so a branch on it (the hour, the weekday, a
deadline) takes the same way both times and the determinism check would miss
it. For ``check_jobs``' crash runs, the names a job body's module binds to
the clock (``time``, ``datetime``, ``datetime.datetime``, ``datetime.date``,
``time.time``, ...) are swapped for stand-ins that answer a fixed instant
while an attempt of the body runs:

* the first attempt of a run (no recorded steps) reads :data:`FIRST`, a
  Monday morning in the middle of January 2030 (UTC);
* an attempt that replays recorded steps reads one of :data:`REPLAYS`, by
  turns from one run to the next, a Saturday night at the end of May 2031 and a Friday afternoon on the
  first of March 2030, so the hour, the weekday, the day of the month, the
  month, the year and any elapsed time up to a year all differ;
* a step's own function (``step.run``, ``step.transaction``) always reads
  :data:`FIRST`: reading the clock inside a step is the fix, and a step that
  runs again after a crash must not look like a double effect because of it.

Each instant moves on with the real time since the run began (a body that
waits on the clock still sees it move). Outside a checked attempt, and in
every other module, the stand-ins answer the real time. The swap lasts for
one job's crash runs and is undone after them, whatever they raise.
"""

from __future__ import annotations

import contextvars
import datetime as _datetime_module
import inspect
import time as _time_module
import types
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

__all__ = ["FIRST", "REPLAYS", "Wall", "attempt_wall", "moved_wall"]

_UTC = _datetime_module.UTC
#: What the first attempt of a run reads: Monday 2030-01-14 10:00 UTC.
FIRST = _datetime_module.datetime(2030, 1, 14, 10, 0, tzinfo=_UTC)
#: What the replays read, in turn: Saturday 2031-05-31 22:30 UTC and Friday
#: 2030-03-01 15:45 UTC.
REPLAYS = (
    _datetime_module.datetime(2031, 5, 31, 22, 30, tzinfo=_UTC),
    _datetime_module.datetime(2030, 3, 1, 15, 45, tzinfo=_UTC),
)

# The stand-ins answer the real clock when no checked attempt is running, so
# they read the time module's own functions (taken before anything swaps them).
_real_time_ns = _time_module.time_ns
_real_localtime = _time_module.localtime
_real_gmtime = _time_module.gmtime
_real_ctime = _time_module.ctime
_RealDatetime = _datetime_module.datetime
_RealDate = _datetime_module.date


class Wall:
    """The instants one crash walk shows its job's body (see the module's doc)."""

    __slots__ = ("_began", "_runs")

    def __init__(self) -> None:
        self._began = _real_time_ns()
        self._runs = 0

    def restart(self, *, again: bool = False) -> None:
        """A new run begins: its instants count from now, and its replays read
        the next of :data:`REPLAYS` (``again``: the same one as the run before)."""
        self._began = _real_time_ns()
        if not again:
            self._runs += 1

    def attempt(self, state: Any, replay: bool) -> _Attempt:
        """The clock of one attempt: ``replay`` when it starts with recorded steps."""
        body = REPLAYS[self._runs % len(REPLAYS)] if replay else FIRST
        return _Attempt(state, self._began, _ns(body), _ns(FIRST))


def _ns(instant: _datetime_module.datetime) -> int:
    return int(instant.timestamp()) * 1_000_000_000


class _Attempt:
    __slots__ = ("_began", "_body", "_state", "_step")

    def __init__(self, state: Any, began: int, body: int, step: int) -> None:
        self._state = state
        self._began = began
        self._body = body
        self._step = step

    def now_ns(self) -> int:
        anchor = self._step if self._state.running_steps else self._body
        return anchor + (_real_time_ns() - self._began)


_current: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
    "trio_jobs_check_wall", default=None
)


@contextmanager
def attempt_wall(wall: Wall | None, state: Any, replay: bool) -> Iterator[None]:
    """While the body of one attempt runs (and the tasks it starts), the stand-ins
    answer ``wall``'s instant for it; ``wall=None``: the real time."""
    if wall is None:
        yield
        return
    token = _current.set(wall.attempt(state, replay))
    try:
        yield
    finally:
        _current.reset(token)


# --------------------------------------------------------------------------- stand-ins


def _now_ns() -> int:
    attempt = _current.get()
    return _real_time_ns() if attempt is None else attempt.now_ns()


def _now() -> float:
    return _now_ns() / 1e9


def _time() -> float:
    return _now()


def _time_ns() -> int:
    return _now_ns()


def _localtime(secs: float | None = None) -> _time_module.struct_time:
    return _real_localtime(_now() if secs is None else secs)


def _gmtime(secs: float | None = None) -> _time_module.struct_time:
    return _real_gmtime(_now() if secs is None else secs)


def _ctime(secs: float | None = None) -> str:
    return _real_ctime(_now() if secs is None else secs)


class _Same(type):
    """A stand-in class is the real one to ``isinstance`` and ``issubclass``."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls.__mro__[1])

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls.__mro__[1])


class _Datetime(_RealDatetime, metaclass=_Same):
    """``datetime.datetime`` whose ``now``/``utcnow``/``today`` read the moved clock;
    every value it makes is a real ``datetime``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _RealDatetime(*args, **kwargs)

    @classmethod
    def now(cls, tz: _datetime_module.tzinfo | None = None) -> Any:
        return _RealDatetime.fromtimestamp(_now(), tz)

    @classmethod
    def utcnow(cls) -> Any:
        return _RealDatetime.fromtimestamp(_now(), _UTC).replace(tzinfo=None)

    @classmethod
    def today(cls) -> Any:
        return _RealDatetime.fromtimestamp(_now())


class _Date(_RealDate, metaclass=_Same):
    """``datetime.date`` whose ``today`` reads the moved clock."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _RealDate(*args, **kwargs)

    @classmethod
    def today(cls) -> Any:
        return _RealDate.fromtimestamp(_now())


class _Module(types.ModuleType):
    """A module that is ``real`` but for the attributes set on it."""

    def __init__(self, real: types.ModuleType, **moved: Any) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__.update(moved)
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


_TIME = _Module(
    _time_module, time=_time, time_ns=_time_ns, localtime=_localtime, gmtime=_gmtime, ctime=_ctime
)
_DATETIME = _Module(_datetime_module, datetime=_Datetime, date=_Date)

#: What a module may bind, by identity, and its stand-in.
_STAND_INS: dict[int, tuple[Any, Any]] = {
    id(real): (real, stand_in)
    for real, stand_in in (
        (_time_module, _TIME),
        (_datetime_module, _DATETIME),
        (_RealDatetime, _Datetime),
        (_RealDate, _Date),
        (_time_module.time, _time),
        (_real_time_ns, _time_ns),
        (_real_localtime, _localtime),
        (_real_gmtime, _gmtime),
        (_real_ctime, _ctime),
    )
}


def _namespace(body: Callable[..., Any]) -> MutableMapping[str, Any] | None:
    fn = inspect.unwrap(body)
    if inspect.ismethod(fn):
        fn = fn.__func__
    elif not inspect.isfunction(fn):
        fn = type(fn).__call__  # a callable object: its class's method
    space = getattr(fn, "__globals__", None)
    return space if isinstance(space, dict) else None


@contextmanager
def moved_wall(body: Callable[..., Any]) -> Iterator[None]:
    """Swap the clock names of ``body``'s module for the stand-ins for the block,
    and put the real ones back after it (only those still the stand-ins)."""
    space = _namespace(body)
    swapped: list[tuple[str, Any, Any]] = []
    if space is not None:
        for name, value in list(space.items()):
            found = _STAND_INS.get(id(value))
            if found is not None and found[0] is value:
                space[name] = found[1]
                swapped.append((name, value, found[1]))
    try:
        yield
    finally:
        for name, real, stand_in in swapped:
            if space is not None and space.get(name) is stand_in:
                space[name] = real
