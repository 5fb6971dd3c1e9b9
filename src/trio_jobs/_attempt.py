"""One claimed job's attempt, and the one table of its legal moves.

A worker holds an :class:`Attempt` per claim, from the claim until its slot is
freed. Its :class:`Phase` is the single answer to "what may this worker still
do with the row": renew its lease, settle it, or nothing. Every change of phase
goes through :meth:`Attempt.move`, checked against :data:`LEGAL`; an illegal
move is a bug of the worker and raises ``X_INVARIANT`` (the simulation fails on
it, see ``testing/_simulate.py``).

The phases:

============  =====================================================================
CLAIMED       claimed; the body has not started (input parsed, tenant checked,
              lease taken, steps loaded)
RUNNING       the body (or an unwind's compensator) runs under the attempt's signal
ABORTING      the signal aborted (a drain, the timeout, an operator cancel); the body
              is unwinding and the attempt will settle by the abort's reason
SETTLING      a settle (an ack or a nack) is in flight; a heartbeat's ``lost`` may
              only mean it landed
SETTLED       the settle landed: the row is no longer this worker's
LOST          the lease is gone as this worker knows it (a renewal said so, its
              window closed, a fenced write was refused, or a settle never landed)
ABANDONED     the body ignored its abort past the drain deadline: its lease is left
              to lapse and the queue redelivers the job (the attempt is counted)
============  =====================================================================
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ._context import Signal
from .errors import ErrorCode, JobsError

if TYPE_CHECKING:
    from ._context import RunState
    from ._declare import Job
    from .drivers._protocol import ClaimedJob

__all__ = ["LEGAL", "Attempt", "Phase"]


class Phase(enum.Enum):
    CLAIMED = "claimed"
    RUNNING = "running"
    ABORTING = "aborting"
    SETTLING = "settling"
    SETTLED = "settled"
    LOST = "lost"
    ABANDONED = "abandoned"

    # Members are singletons: hashing by identity keeps the table lookups of
    # every move in C (Enum's own __hash__ is a Python function).
    __hash__ = object.__hash__


_P = Phase

#: Every legal move, and only those. A settle may start from any phase but
#: SETTLED (a run refused before its body ran settles from CLAIMED; a drain
#: abandons a run whose hand-back then still goes out, fenced); it ends SETTLED
#: or, unowned, LOST. LOST may still end SETTLED: a settle in flight whose lease
#: window closed here can have landed first (its answer is the truth). ABORTING
#: goes back to RUNNING only when a timeout's run starts its unwind (each
#: compensator gets the timeout afresh). SETTLED is final.
LEGAL: dict[Phase, frozenset[Phase]] = {
    _P.CLAIMED: frozenset({_P.RUNNING, _P.ABORTING, _P.SETTLING, _P.LOST, _P.ABANDONED}),
    _P.RUNNING: frozenset({_P.ABORTING, _P.SETTLING, _P.LOST, _P.ABANDONED}),
    _P.ABORTING: frozenset({_P.RUNNING, _P.SETTLING, _P.LOST, _P.ABANDONED}),
    _P.SETTLING: frozenset({_P.SETTLED, _P.LOST}),
    _P.SETTLED: frozenset(),
    _P.LOST: frozenset({_P.SETTLING, _P.SETTLED, _P.ABANDONED}),
    _P.ABANDONED: frozenset({_P.SETTLING}),
}

#: Phases whose lease the heartbeat still renews and whose window it watches.
WATCHED = frozenset({_P.CLAIMED, _P.RUNNING, _P.ABORTING, _P.SETTLING})


class Attempt:
    """One claim, held by one worker: its phase, its signal, and what the
    heartbeat and the settle need to know of it."""

    __slots__ = (
        "abort_at",
        "claimed",
        "handle",
        "last_landed",
        "lost_while_settling",
        "on_move",
        "outcome",
        "pending",
        "phase",
        "ran",
        "state",
        "traced",
    )

    def __init__(
        self,
        claimed: ClaimedJob,
        now: float,
        on_move: Callable[[Attempt, Phase, Phase], None] | None = None,
    ) -> None:
        self.claimed = claimed
        self.phase = Phase.CLAIMED
        #: Told of every move (the simulation checks them); None in production.
        self.on_move = on_move
        self.traced = False
        self.state: RunState | None = None
        #: A run state was attached (the slot ran the attempt), kept once the
        #: state itself is let go (:meth:`let_go`).
        self.ran = False
        self.handle: Job[Any, Any] | None = None
        #: When the signal aborted (the drain deadline runs from there).
        self.abort_at: float | None = None
        #: The last renewal that landed (the lease window runs from there).
        self.last_landed = now
        #: A heartbeat said "lost" while a settle was in flight: the settle's own
        #: answer decides whether that was its landing or the truth.
        self.lost_while_settling = False
        #: An abort that came before the run state existed; applied on attach.
        self.pending: tuple[ErrorCode, str] | None = None
        #: How the attempt ended (an outcome of _observe.OUTCOMES, its code), for
        #: the attempt's span.
        self.outcome: tuple[str, str | None] | None = None

    def __repr__(self) -> str:
        return f"<Attempt {self.claimed.id}:{self.claimed.fence.claim} {self.phase.value}>"

    # ------------------------------------------------------------------ moves

    def move(self, to: Phase) -> None:
        """Change phase, checked against :data:`LEGAL` (a same-phase move is a no-op)."""
        was = self.phase
        if to is was:
            return
        if self.on_move is not None:
            self.on_move(self, was, to)
        if to not in LEGAL[was]:
            raise JobsError(
                ErrorCode.X_INVARIANT,
                f"attempt {self.claimed.id}:{self.claimed.fence.claim}: illegal move "
                f"{was.value} -> {to.value}",
            )
        self.phase = to

    @property
    def watched(self) -> bool:
        return self.phase in WATCHED

    def attach(self, state: RunState) -> None:
        """The run state exists: an abort that came first applies now, and a
        write the state finds refused marks the attempt lost."""
        self.state = state
        self.ran = True
        state.on_lost = self._state_lost
        if self.pending is not None:
            state.signal.abort(*self.pending)
            if self.phase is Phase.LOST:
                state.lost = True

    def detach(self) -> None:
        """The slot is done with the attempt: drop the run state's link back to it."""
        if self.state is not None:
            self.state.on_lost = None

    def let_go(self) -> None:
        """The body is done and its ack built: the run state (input, steps,
        records, signal) dies now, not when the ack answers (fewer objects
        alive across the round trip, less for the garbage collector to walk).
        Settling needs only the claim, the phase and the ack itself."""
        state = self.state
        if state is not None:
            state.on_lost = None
            self.state = None

    def _state_lost(self) -> None:
        # A write found the lease gone. An abandoned body may still be writing:
        # it stays abandoned (its verdict is taken already).
        if self.phase in WATCHED:
            self.move(Phase.LOST)

    def start(self) -> None:
        """The body (or a compensator) starts: RUNNING, unless already aborting."""
        if self.phase is Phase.CLAIMED:
            self.move(Phase.RUNNING)

    def abort(self, code: ErrorCode, message: str) -> None:
        """Abort the attempt's signal with ``code``; the first abort of a live
        attempt moves it to ABORTING and starts the drain deadline."""
        if self.state is not None:
            fresh = self.state.signal.abort(code, message)
        else:
            fresh = self.pending is None
            if fresh:
                self.pending = (code, message)
        if fresh and self.abort_at is None:
            self.abort_at = trio.current_time()
        if self.phase in (Phase.CLAIMED, Phase.RUNNING):
            self.move(Phase.ABORTING)

    def lose(self) -> None:
        """The lease is gone as this worker knows it (not counted here). An
        abandoned attempt stays abandoned; its run state learns it all the same."""
        if self.phase is not Phase.ABANDONED:
            self.move(Phase.LOST)
        if self.state is not None:
            self.state.lost = True

    def unwind_phase(self) -> None:
        """A timeout that failed the body must not cancel the compensators before
        they start: a fresh signal, and RUNNING again (each compensator gets the
        job's ``timeout`` afresh; a drain, a lost lease or a cancel still stops it)."""
        state = self.state
        assert state is not None
        reason = state.signal.reason
        if reason is not None and reason.code == ErrorCode.X_JOB_TIMEOUT:
            state.signal = Signal()
            self.abort_at = None
            if self.phase is Phase.ABORTING:
                self.move(Phase.RUNNING)

    def settling(self) -> None:
        self.lost_while_settling = False
        self.move(Phase.SETTLING)
