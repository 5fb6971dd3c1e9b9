"""``trio-jobs worker --processes N``: N worker processes under one supervisor.

The supervisor is a Trio program that starts N children, each an ordinary
``trio-jobs worker`` process with the same arguments minus ``--processes``
(``python -m trio_jobs.cli worker ...``: a new interpreter, never a fork of a
Trio process). It

* forwards SIGTERM to every child on its own SIGTERM or SIGINT; each child
  drains itself (exit 0, or 3 when it had to abandon jobs) and the supervisor
  waits for them all. A second signal is forwarded too: the children abandon
  at once. A child still running ``KILL_GRACE`` past its own drain deadline is
  SIGKILLed (its leases lapse: abandoned);
* restarts a child that ends while the supervisor is not draining (a crash, a
  SIGKILL, any exit), after a backoff of 0.5 s doubling to 30 s per slot, back
  to 0.5 s once a child stayed up a minute;
* stops when a child refuses its configuration before it was ready (exit 1 or
  2: a module that does not import, a database that does not answer) while no
  child has been ready yet, or when one slot refused ``MAX_REFUSALS`` times in
  a row: it drains the others and exits with that child's code, printing its
  refusal once.

The children run in a process group of their own: a Ctrl-C at the terminal
reaches the supervisor only, which forwards one SIGTERM (a child that got the
terminal's SIGINT too would take the forwarded signal for a second one and
abandon its jobs). Each child holds one end of a socket pair, its descriptor
in ``$TRIO_JOBS_SUPERVISOR_FD`` (:class:`ChildLink`): it says there when it is
ready, why it refused and what it did; and the end of the stream tells it that
the supervisor is gone, so it drains itself rather than run unsupervised.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import socket
import subprocess
import sys
from typing import Any

import attrs
import click
import orjson
import trio

from ..errors import ErrorCode, JobsError
from ._common import EXIT_ABANDONED, EXIT_REFUSED, log_event
from ._usage import EXIT_USAGE

__all__ = [
    "MAX_PROCESSES",
    "Backoff",
    "ChildLink",
    "Ending",
    "Outcome",
    "Plan",
    "Supervisor",
    "child_command",
    "ending",
]

#: The most worker processes one supervisor runs (``--processes``).
MAX_PROCESSES = 64
#: The first restart's delay; it doubles on each restart of a slot, up to
#: ``RESTART_MAX``, and is back to ``RESTART_FIRST`` once a child stayed up
#: ``STABLE_AFTER`` seconds.
RESTART_FIRST = 0.5
RESTART_MAX = 30.0
STABLE_AFTER = 60.0
#: A slot whose children refused this many times in a row stops the supervisor.
MAX_REFUSALS = 3
#: How long past a child's own drain deadline the supervisor waits before SIGKILL.
KILL_GRACE = 5.0
#: The environment variable that hands a child its end of the link.
LINK_ENV = "TRIO_JOBS_SUPERVISOR_FD"


def child_command(ctx: click.Context, skip: str = "processes") -> list[str]:
    """A child's command line: ``python -m trio_jobs.cli`` and this command's
    parameters as parsed, minus ``--processes``.

    Rebuilt from the parsed values rather than cut out of ``sys.argv``: every
    option as ``--flag=value`` (a value that starts with ``-`` stays a value),
    the arguments after ``--``."""
    options: list[str] = []
    arguments: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        if name == skip or name not in ctx.params:
            continue
        value = ctx.params[name]
        if isinstance(param, click.Argument):
            arguments.append(str(value))
        elif isinstance(param, click.Option):
            flag = max(param.opts, key=len)
            if param.is_flag and param.secondary_opts:
                options.append(flag if value else max(param.secondary_opts, key=len))
            elif param.is_flag:
                options += [flag] if value else []
            elif value is not None:
                options.append(f"{flag}={value}")
    name = ctx.info_name or ctx.command.name or "worker"
    return [sys.executable, "-m", "trio_jobs.cli", name, *options, "--", *arguments]


# --------------------------------------------------------------------------- the child's side


class ChildLink:
    """A supervised worker's end of the link to its supervisor.

    Each message is one JSON line: ``{"ready": {"worker_id"}}`` once it claims,
    ``{"summary": {...}}`` as it exits, ``{"refused": {"code", "message"}}``
    instead of printing a refusal (the supervisor prints it once)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def from_env(cls) -> ChildLink | None:
        """This process's link, when a supervisor started it. The variable is
        taken out of the environment: a process the jobs start is not a child
        of the supervisor."""
        fd = os.environ.pop(LINK_ENV, None)
        if fd is None:
            return None
        try:
            sock = socket.socket(fileno=int(fd))
        except (ValueError, OSError):
            return None  # not a socket this process holds: run unsupervised
        sock.set_inheritable(False)
        return cls(sock)

    def _say(self, kind: str, body: Any) -> None:
        # A blocking send of one short line: the socket pair's buffer holds far
        # more than the three lines a child ever sends.
        try:
            self._sock.sendall(orjson.dumps({kind: body}, default=str) + b"\n")
        except OSError:
            pass  # the supervisor is gone; `orphaned` has drained the worker

    def ready(self, worker_id: str) -> None:
        self._say("ready", {"worker_id": worker_id})

    def summary(self, summary: dict[str, Any]) -> None:
        self._say("summary", summary)

    def refused(self, error: JobsError) -> None:
        self._say("refused", {"code": str(error.code), "message": error.message})

    async def orphaned(self) -> None:
        """Return when the supervisor's end closed: it exited, or was killed."""
        while True:
            await trio.lowlevel.wait_readable(self._sock)
            try:
                data = self._sock.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not data:
                return


# --------------------------------------------------------------------------- the supervisor's side


class Ending(enum.Enum):
    """How one child's run ended, as the supervisor reads it."""

    #: Exit 0 once told to drain; or gone before it was ready (it held no job).
    DRAINED = "drained"
    #: Exit 3, or any other end after it was ready, once told to drain: jobs it
    #: held were abandoned (their leases lapse; the attempt counts).
    ABANDONED = "abandoned"
    #: Exit 1 or 2 before it was ready, untold: it refused its configuration.
    REFUSED = "refused"
    #: Any other end, untold: a crash, a SIGKILL, a drain someone else asked for.
    DIED = "died"


def ending(returncode: int, *, ready: bool, told: bool) -> Ending:
    """How a child that exited ``returncode`` ended; ``ready``: it said it was
    claiming; ``told``: the supervisor had forwarded it a signal."""
    if told:
        if returncode == 0:
            return Ending.DRAINED
        if returncode == EXIT_ABANDONED or ready:
            return Ending.ABANDONED
        return Ending.DRAINED
    if not ready and returncode in (EXIT_REFUSED, EXIT_USAGE):
        return Ending.REFUSED
    return Ending.DIED


@attrs.define
class Backoff:
    """One slot's restart delay: ``RESTART_FIRST`` doubling to ``RESTART_MAX``,
    back to ``RESTART_FIRST`` after a child that stayed up ``STABLE_AFTER``."""

    next: float = RESTART_FIRST

    def after(self, uptime: float) -> float:
        """The delay before restarting a child that ran ``uptime`` seconds."""
        if uptime >= STABLE_AFTER:
            self.next = RESTART_FIRST
        delay = self.next
        self.next = min(delay * 2, RESTART_MAX)
        return delay


class ChildState(enum.Enum):
    STARTING = "starting"  # spawned; not claiming yet
    READY = "ready"  # said on the link that it claims
    EXITED = "exited"  # reaped; its slot decides what comes next


#: The legal moves of a child's state.
_MOVES: dict[ChildState, frozenset[ChildState]] = {
    ChildState.STARTING: frozenset({ChildState.READY, ChildState.EXITED}),
    ChildState.READY: frozenset({ChildState.EXITED}),
    ChildState.EXITED: frozenset(),
}


@attrs.define(eq=False)
class Child:
    slot: int
    process: trio.Process
    link: socket.socket
    started: float
    state: ChildState = ChildState.STARTING
    #: How many SIGTERMs the supervisor forwarded to it.
    told: int = 0
    worker_id: str | None = None
    refusal: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None

    def move(self, to: ChildState) -> None:
        if to not in _MOVES[self.state]:
            raise AssertionError(f"a child cannot move from {self.state.value} to {to.value}")
        self.state = to

    @property
    def ready(self) -> bool:
        return self.state is ChildState.READY or (
            self.state is ChildState.EXITED and self.worker_id is not None
        )


@attrs.frozen
class Plan:
    """What to supervise: ``processes`` children running ``command``; a child
    drains within ``drain_budget`` seconds (its ``--drain-timeout`` and grace)."""

    command: list[str]
    processes: int
    drain_budget: float


@attrs.frozen
class Outcome:
    """The supervisor's end: its exit code, and the refusal to print when a
    child refused its configuration."""

    exit_code: int
    outcome: str
    processes: int
    restarts: int
    workers: list[dict[str, Any]]
    refusal: JobsError | None = None

    def body(self) -> dict[str, Any]:
        """What ``--json`` prints."""
        return {
            "ok": self.exit_code == 0,
            "outcome": self.outcome,
            "processes": self.processes,
            "restarts": self.restarts,
            "workers": self.workers,
        }


def _exit_fields(returncode: int | None) -> dict[str, Any]:
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return {"exit_code": None, "signal": name}
    return {"exit_code": returncode, "signal": None}


class Supervisor:
    """Runs a :class:`Plan` until a signal drains it, or a child refuses."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.live: dict[int, Child] = {}
        #: SIGTERMs forwarded to the children so far (at most two).
        self.forwarded = 0
        self.draining = trio.Event()
        self.ever_ready = False
        self.restarts = 0
        #: The last child of each slot, and how it ended.
        self.ends: dict[int, tuple[Child, Ending]] = {}
        self.refused: Child | None = None
        self._nursery: trio.Nursery | None = None

    async def run(self) -> Outcome:
        # Installed before the first child starts: a signal from now on drains.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            log_event(
                logging.INFO,
                "jobs.supervisor.started",
                pid=os.getpid(),
                processes=self.plan.processes,
            )
            async with trio.open_nursery() as outer:
                self._nursery = outer
                outer.start_soon(self._watch, signals)
                async with trio.open_nursery() as slots:
                    for slot in range(self.plan.processes):
                        slots.start_soon(self._slot, slot)
                outer.cancel_scope.cancel()
        return self._outcome()

    # ----------------------------------------------------------------- signals

    async def _watch(self, signals: Any) -> None:
        async for signum in signals:
            self._forward(signal.Signals(signum).name)

    def _forward(self, reason: str) -> None:
        """Tell every child once more: the first time drains, the second abandons."""
        if self.forwarded >= 2:
            return
        self.forwarded += 1
        if self.forwarded == 1:
            log_event(
                logging.INFO, "jobs.supervisor.draining", reason=reason, children=len(self.live)
            )
            self.draining.set()
            assert self._nursery is not None
            self._nursery.start_soon(self._deadline)
        else:
            log_event(
                logging.WARNING,
                "jobs.supervisor.abandoning",
                reason=reason,
                children=len(self.live),
            )
        for child in list(self.live.values()):
            self._tell(child)

    def _tell(self, child: Child) -> None:
        while child.told < self.forwarded:
            child.told += 1
            child.process.send_signal(signal.SIGTERM)

    async def _deadline(self) -> None:
        """A child that outlives its own drain deadline (it abandons itself
        then) by ``KILL_GRACE`` is killed."""
        waited = self.plan.drain_budget + KILL_GRACE
        await trio.sleep(waited)
        for child in list(self.live.values()):
            log_event(
                logging.WARNING,
                "jobs.supervisor.child-killed",
                slot=child.slot,
                pid=child.process.pid,
                waited=waited,
            )
            child.process.kill()

    # ----------------------------------------------------------------- slots

    async def _slot(self, slot: int) -> None:
        backoff = Backoff()
        refusals = 0
        previous: Child | None = None
        while not self.draining.is_set():
            child = await self._start(slot, previous)
            await self._until_exit(child)
            returncode = child.process.returncode
            assert returncode is not None
            end = ending(returncode, ready=child.ready, told=child.told > 0)
            self.ends[slot] = (child, end)
            if child.told or self.draining.is_set():
                return
            if end is Ending.REFUSED:
                refusals += 1
                if not self.ever_ready or refusals >= MAX_REFUSALS:
                    self._refuse(child, refusals)
                    return
            elif child.ready:
                refusals = 0
            uptime = trio.current_time() - child.started
            delay = backoff.after(uptime)
            log_event(
                logging.WARNING,
                "jobs.supervisor.child-exited",
                slot=slot,
                pid=child.process.pid,
                worker_id=child.worker_id,
                **_exit_fields(returncode),
                code=(child.refusal or {}).get("code"),
                uptime=round(uptime, 3),
                restart_in=delay,
            )
            with trio.move_on_after(delay):
                await self.draining.wait()
            previous = child

    async def _start(self, slot: int, previous: Child | None) -> Child:
        mine, theirs = socket.socketpair()
        try:
            env = {**os.environ, LINK_ENV: str(theirs.fileno())}
            process = await trio.lowlevel.open_process(
                self.plan.command,
                stdin=subprocess.DEVNULL,
                env=env,
                pass_fds=(theirs.fileno(),),
                # Out of the terminal's process group: Ctrl-C reaches the
                # supervisor only, and it forwards one SIGTERM.
                process_group=0,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        child = Child(slot=slot, process=process, link=mine, started=trio.current_time())
        self.live[slot] = child
        self._tell(child)  # a drain that began while it was being spawned
        if previous is None:
            log_event(logging.INFO, "jobs.supervisor.child-started", slot=slot, pid=process.pid)
        else:
            self.restarts += 1
            log_event(
                logging.INFO,
                "jobs.supervisor.child-restarted",
                slot=slot,
                pid=process.pid,
                previous_pid=previous.process.pid,
                restarts=self.restarts,
            )
        return child

    async def _until_exit(self, child: Child) -> None:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(child.link))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._listen, child, stream)
                await child.process.wait()
                # Its last line may still be in flight; the stream ends when
                # the child's end closed, which its exit did.
                nursery.cancel_scope.deadline = trio.current_time() + 1.0
        finally:
            # Closed here (also when this task is cancelled): a child still
            # running sees its supervisor gone and drains itself.
            stream.socket.close()
            self.live.pop(child.slot, None)
            child.move(ChildState.EXITED)

    async def _listen(self, child: Child, stream: trio.SocketStream) -> None:
        pending = b""
        async for chunk in stream:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._heard(child, line)

    def _heard(self, child: Child, line: bytes) -> None:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            return
        if not isinstance(message, dict):
            return
        if isinstance(message.get("ready"), dict) and child.state is ChildState.STARTING:
            child.worker_id = str(message["ready"].get("worker_id"))
            child.move(ChildState.READY)
            self.ever_ready = True
        elif isinstance(message.get("refused"), dict):
            child.refusal = message["refused"]
        elif isinstance(message.get("summary"), dict):
            child.summary = message["summary"]

    def _refuse(self, child: Child, refusals: int) -> None:
        """Stop: a child refused its configuration; the others drain."""
        if self.refused is None:
            self.refused = child
        log_event(
            logging.ERROR,
            "jobs.supervisor.child-refused",
            slot=child.slot,
            pid=child.process.pid,
            **_exit_fields(child.process.returncode),
            code=(child.refusal or {}).get("code"),
            refusals=refusals,
        )
        if self.forwarded == 0:
            self._forward("child-refused")

    # ----------------------------------------------------------------- the end

    def _outcome(self) -> Outcome:
        workers = [
            {
                "slot": slot,
                "pid": child.process.pid,
                **_exit_fields(child.process.returncode),
                "ending": end.value,
                **(child.summary or {}),
            }
            for slot, (child, end) in sorted(self.ends.items())
        ]
        refusal: JobsError | None = None
        if self.refused is not None:
            assert self.refused.process.returncode is not None
            exit_code, outcome = self.refused.process.returncode, "refused"
            refusal = _refusal(self.refused)
        elif any(end is Ending.ABANDONED for _child, end in self.ends.values()):
            exit_code, outcome = EXIT_ABANDONED, "abandoned"
        else:
            exit_code, outcome = 0, "drained"
        log_event(
            logging.INFO,
            "jobs.supervisor.stopped",
            outcome=outcome,
            exit_code=exit_code,
            restarts=self.restarts,
        )
        return Outcome(
            exit_code=exit_code,
            outcome=outcome,
            processes=self.plan.processes,
            restarts=self.restarts,
            workers=workers,
            refusal=refusal,
        )


def _refusal(child: Child) -> JobsError:
    """The refusal the child sent, or one saying where to look."""
    said = child.refusal or {}
    try:
        code = ErrorCode(str(said.get("code")))
    except ValueError:
        code = None
    if code is not None and isinstance(said.get("message"), str):
        return JobsError(code, said["message"])
    return JobsError(
        ErrorCode.X_CONFIG_INVALID,
        f"a worker process exited {child.process.returncode} before it was ready; the lines "
        "it printed on stderr say why",
    )
