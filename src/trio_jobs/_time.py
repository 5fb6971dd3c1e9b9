"""Durations, clocks, id and jitter sources.

Nothing else in ``src/`` reads the wall clock, draws randomness or makes a
uuid: these sources are injected, so the harness and the simulation drive them.
"""

from __future__ import annotations

import math
import os
import random
import re
import struct
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Protocol

import trio

from .errors import ErrorCode, JobsError

__all__ = [
    "Clock",
    "Duration",
    "IdSource",
    "JitterSource",
    "MAX_DURATION",
    "SystemClock",
    "TrioClock",
    "outside_call",
    "parse_duration",
]

Duration = str | int | float | timedelta

#: The longest duration accepted anywhere (100 years, in seconds): a delay, a
#: sleep or a timeout past it is a bug, not a plan, and ``now + it`` must stay
#: an instant every driver stores and shows (before the year 9999).
MAX_DURATION = 100 * 365.25 * 86_400.0

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# ASCII only: `\d` would otherwise admit any Unicode digit, and `$` a trailing newline.
_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*", re.ASCII)


def parse_duration(value: object, *, field: str = "duration", allow_zero: bool = False) -> float:
    """Turn ``"250ms"``, ``"30s"``, ``"1m"``, ``"2h"``, ``"3d"``, a ``timedelta`` or a
    number of seconds into float seconds.

    A non-positive value is refused (``<= 0`` would read as "no ceiling"), unless
    ``allow_zero``; so is one over :data:`MAX_DURATION` (100 years). Raises
    ``JobsError(X_CONFIG_INVALID)`` naming ``field``.
    """
    seconds: float
    if isinstance(value, bool):
        raise _bad(field, "a bool is not a duration")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise _bad(field, "it is too large") from None
    elif isinstance(value, str):
        match = _DURATION_RE.fullmatch(value)
        if match is None:
            raise _bad(field, 'write it as "250ms", "30s", "1m", "2h", "3d" or a number of seconds')
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise _bad(field, f"a {type(value).__name__} is not a duration")
    if math.isnan(seconds) or math.isinf(seconds):
        raise _bad(field, "it must be finite")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise _bad(field, "it must be positive")
    if seconds > MAX_DURATION:
        raise _bad(field, "it is over 100 years; pass a shorter one")
    return seconds


def _bad(field: str, why: str) -> JobsError:
    return JobsError(ErrorCode.X_CONFIG_INVALID, f"{field} is not a valid duration: {why}")


class Clock(Protocol):
    """A source of the current time as float seconds since the Unix epoch."""

    def now(self) -> float: ...


class SystemClock:
    """The wall clock. The one place the library reads ``time.time()``."""

    def now(self) -> float:
        return time.time()


@asynccontextmanager
async def outside_call(limit: float) -> AsyncIterator[None]:
    """A real call out of the process (a webhook's POST, an app's HTTP request),
    as ``async with outside_call(limit):`` around it.

    Under the seeded simulation (``simulate_jobs``, the ``check`` gate) the call
    waits for its turn, which the seed draws like a driver call's, and virtual
    time stands still while it is in flight (no jump, no other call granted),
    for at most ``limit`` real seconds: its own timeouts read the time the
    outside world took, not the simulation's jumps, and the seed's trace does
    not depend on the outside world's latency. Past ``limit`` time moves again
    (a hung peer cannot hang the run). Anywhere else (a worker in production,
    Trio's ``MockClock``) it does nothing.
    """
    try:
        clock = trio.lowlevel.current_clock()
    except RuntimeError:
        clock = None
    enter = getattr(clock, "outside", None)
    if enter is None:
        yield
        return
    async with enter(limit):
        yield


class TrioClock:
    """Epoch seconds that move with Trio's clock.

    Anchored to the wall clock once, then advanced by ``trio.current_time()``, so
    under ``MockClock`` (pytest-trio's ``autojump_clock``) due times, backoffs and
    lease expiry move with virtual time. Outside a Trio run it reads the anchor
    plus the offset only.
    """

    def __init__(self, origin: float | None = None) -> None:
        self._origin = SystemClock().now() if origin is None else origin
        self._trio_zero: float | None = None
        self._offset = 0.0

    def _trio_now(self) -> float:
        try:
            current = trio.current_time()
        except RuntimeError:
            return 0.0
        if self._trio_zero is None:
            self._trio_zero = current
        return current - self._trio_zero

    def now(self) -> float:
        return self._origin + self._offset + self._trio_now()

    def shift(self, seconds: float) -> None:
        """Move this clock by ``seconds`` without touching Trio's (tests, skew)."""
        self._offset += seconds


class IdSource(Protocol):
    """Makes lowercase canonical uuids."""

    def new_id(self) -> str: ...


class UuidSource:
    """uuid4 ids, or a seeded deterministic stream for the simulation.

    Unseeded, an id's first 32 bits are a 28-bit counter that starts at a
    random value (one per source, so per process) and wraps, then a check
    digit of it; the other 90 free bits are random. Ids a process makes close
    together are close in the primary key's index, so an insert touches the
    pages the previous ones touched, not a random leaf of a large index
    (PostgreSQL server CPU per no-op job down about 13% in
    benchmarks/README.md); they stay unique by their random part. Their first
    eight digits (the short id an operator types) are distinct for the next
    268 million ids of a process, and the check digit (:func:`_head`) makes a
    short id with one digit mistyped, or two neighbours swapped, name no job
    rather than the job made just before or after.
    """

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed) if seed is not None else None
        self._count = int.from_bytes(os.urandom(4), "big") & _COUNTER_MASK

    def _take(self, n: int) -> int:
        """The counter's next ``n`` values start here (mod 2**28)."""
        start = self._count
        self._count = (start + n) & _COUNTER_MASK
        return start

    def new_id(self) -> str:
        if self._rng is None:
            c = self._take(1)
            h = os.urandom(12).hex()
            return f"{_head(c):08x}-{h[:4]}-4{h[5:8]}-{_VARIANT_DIGIT[h[8]]}{h[9:12]}-{h[12:]}"
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    @property
    def seeded(self) -> bool:
        """Whether the ids come from a seeded (deterministic) stream."""
        return self._rng is not None

    def new_pair(self) -> tuple[str, str]:
        """Two ids, as ``new_ids(2)`` makes them (a single enqueue's job and run
        ids): one ``os.urandom`` call, no list."""
        if self._rng is not None:
            return self.new_id(), self.new_id()
        c = self._take(2)
        h = os.urandom(24).hex()
        # uuid4 in hex digits after the counter's 8: digit 12 is the version
        # (4), digit 16 carries the variant (10 in its top bits: 8, 9, a or b,
        # from the random digit).
        v = _VARIANT_DIGIT
        return (
            f"{_head(c):08x}-{h[:4]}-4{h[5:8]}-{v[h[8]]}{h[9:12]}-{h[12:24]}",
            f"{_head((c + 1) & _COUNTER_MASK):08x}-{h[24:28]}-4{h[29:32]}-{v[h[32]]}{h[33:36]}-{h[36:]}",
        )

    def new_ids(self, n: int) -> list[str]:
        """``n`` ids; from one ``os.urandom`` call when unseeded (an enqueue_many
        batch), else ``n`` calls of :meth:`new_id` (the same seeded stream)."""
        if self._rng is not None:
            return [self.new_id() for _ in range(n)]
        c = self._take(n)
        if c + n <= _COUNTER_MASK + 1:
            low, high = _LOW_SUMS, _HIGH_SUMS
            heads = [(x << 4) | (-(low[x & 0xFFFF] + high[x >> 16]) & 15) for x in range(c, c + n)]
        else:  # the counter wraps inside this batch
            heads = [_head(x & _COUNTER_MASK) for x in range(c, c + n)]
        if n < _COLUMNWISE_FROM:
            h = os.urandom(12 * n).hex()
            v = _VARIANT_DIGIT
            return [
                f"{heads[k]:08x}-{h[i : i + 4]}-4{h[i + 5 : i + 8]}-{v[h[i + 8]]}{h[i + 9 : i + 12]}-{h[i + 12 : i + 24]}"
                for k, i in enumerate(range(0, 24 * n, 24))
            ]
        raw = bytearray(os.urandom(16 * n))
        # The head (counter and check digit) in bytes 0-3 of each id, big-endian.
        counters = struct.pack(f">{n}I", *heads)
        for byte in range(4):
            raw[byte::16] = counters[byte::4]
        # uuid4: version 4 in the high nibble of byte 6, variant 10 in byte 8.
        raw[6::16] = raw[6::16].translate(_VERSION_4)
        raw[8::16] = raw[8::16].translate(_VARIANT_RFC)
        h = raw.hex()
        # A batch is laid out column by column: each of the 32 hex digits of
        # every id is one strided slice copy (C loops, not a Python step per
        # id), each id in a 37-character cell ending in a comma; one split
        # then cuts the ids (3x faster than slicing each id for 2,000 ids).
        digits = h.encode()
        cells = bytearray(b"-" * (37 * n))
        for column, at in enumerate(_CELL_AT):
            cells[at::37] = digits[column::32]
        cells[36::37] = b"," * n
        return cells[:-1].decode().split(",")


#: The counter of an unseeded id: 28 bits (seven hex digits).
_COUNTER_MASK = (1 << 28) - 1


#: A byte's two hex digits weighted 3 (the low one) and 1, mod 16.
_PAIR_SUMS = bytes((3 * (b & 15) + (b >> 4)) & 15 for b in range(256))
#: For each k, a table adding k to a byte mod 16 (for ``bytes.translate``).
_PLUS = [bytes((v + k) & 15 for v in range(256)) for k in range(16)]
#: The weighted sums (weights 3, 1, 3, 1 from the lowest digit, mod 16) of a
#: counter's low four digits, and of its high three (3, 1, 3: four digits are
#: an even count, so the weights go on alternating): tables built at import
#: from the byte's (a translate a row, well under a millisecond).
_LOW_SUMS = b"".join(_PAIR_SUMS.translate(_PLUS[_PAIR_SUMS[hi]]) for hi in range(256))
_HIGH_SUMS = bytes((_PAIR_SUMS[y & 0xFF] + 3 * (y >> 8)) & 15 for y in range(4096))


def _head(counter: int) -> int:
    """An unseeded id's first 32 bits: the 28-bit ``counter`` and a check digit,
    ``-(sum of its digits weighted 3, 1, 3, ... from the lowest) mod 16``. Odd
    weights make every single-digit change move the sum (an odd weight times a
    change of 1..15 is never a multiple of 16), and the alternating 3 and 1
    catch a swap of two neighbouring digits unless they differ by 8."""
    check = -(_LOW_SUMS[counter & 0xFFFF] + _HIGH_SUMS[counter >> 16]) & 15
    return (counter << 4) | check


_VERSION_4 = bytes((b & 0x0F) | 0x40 for b in range(256))
_VARIANT_RFC = bytes((b & 0x3F) | 0x80 for b in range(256))
#: A random hex digit with the uuid variant's top bits set (10xx): 8, 9, a or b.
_VARIANT_DIGIT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}
#: Where hex digit ``c`` of an id goes in its cell ``8-4-4-4-12,``.
_CELL_AT = [c + (c >= 8) + (c >= 12) + (c >= 16) + (c >= 20) for c in range(32)]
#: From how many ids a batch is laid out column-wise (below, per id is faster).
_COLUMNWISE_FROM = 64


class JitterSource(Protocol):
    """Returns a float in ``[0, 1)``."""

    def random(self) -> float: ...


def default_jitter(seed: int | None = None) -> JitterSource:
    """A jitter source: ``random.Random(seed)`` (system entropy when ``seed`` is None)."""
    return random.Random(seed)
