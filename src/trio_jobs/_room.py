"""The fair share of a worker's free slots over its queues, as a pure function."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["share_room"]


def share_room(
    queues: Sequence[str],
    slots: Mapping[str, int],
    in_flight: Mapping[str, int],
    *,
    held: int,
    max_in_flight: int | None,
    rotation: int,
    skip: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """How many rows to ask of each queue: the free room (each queue's free
    slots, the whole capped by ``max_in_flight`` less the ``held`` attempts)
    split ``ceil(room / queues left)`` over the queues, starting at
    ``rotation`` (after the last queue served, so none starves); ``skip`` are
    queues a pass found empty, whose room goes to the next. Queues with no
    share are left out."""
    if len(queues) == 1 and not skip:
        # One queue (the common case): its free slots, capped by max_in_flight.
        q = queues[0]
        room = slots[q] - in_flight[q]
        if max_in_flight is not None:
            room = min(room, max_in_flight - held)
        return {q: room} if room > 0 else {}
    free = {q: slots[q] - in_flight[q] for q in queues if q not in skip}
    total = sum(max(0, n) for n in free.values())
    if max_in_flight is not None:
        total = min(total, max_in_flight - held)
    if total <= 0:
        return {}
    order = [q for q in [*queues[rotation:], *queues[:rotation]] if q in free]
    want: dict[str, int] = {}
    left = len(order)
    for q in order:
        share = min(max(0, free[q]), math.ceil(total / left))
        left -= 1
        if share > 0:
            want[q] = share
            total -= share
    return want
