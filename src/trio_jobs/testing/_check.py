"""``check_jobs``: the crash-proof CI gate over an app's own jobs.

For each job: inputs (the module's ``trio_jobs_examples`` or Hypothesis's
``from_type``, seeded by the job's name), then :func:`crash_proof` at every
boundary of every input with a replay check on every attempt that replays
recorded steps, then :func:`simulate_jobs` over seeds with every input
enqueued and faults on. ``trio-jobs check`` and ``pytest --trio-jobs-check``
are this function with a printer.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import types
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import attrs
import orjson
import trio

from .._declare import Job
from .._task import tasks_of
from ..drivers.memory import MemoryDriver
from ..errors import ErrorCode, JobsError
from ._crash import MEMORY, Ground, _crash_proof, _point, _run_once
from ._simulate import Faults, World, simulate_jobs
from ._wall import Wall, attempt_wall, moved_wall

__all__ = ["CheckFailure", "CheckReport", "JobCheck", "check_jobs"]

#: The faults every seed runs under: each kind of crash the product promises to survive.
GATE_FAULTS = Faults(crash=0.02, pause=0.02, lease_loss=0.01, driver_errors=0.02, drain=0.01)
#: How long (virtual seconds) a seed runs when the jobs hold a scheduled task
#: (a ``task()``, or a consumer's supervisor): a task fires for ever, so such a
#: simulation never goes quiet and runs to its ``max_time``. Ten virtual
#: minutes fire a minutely task ten times (a consumer's supervisor re-arms its
#: keys each minute by default); the examples are enqueued at the start either way.
GATE_TASK_TIME = 600.0
#: Where a task's drawn occurrences start (2026-01-01T00:00:00Z), one an hour after.
TASK_EPOCH = 1_767_225_600.0
#: ``simulate_jobs``' own ``max_time`` (for jobs that do go quiet).
SIMULATION_MAX_TIME = 30 * 86400.0
#: Step names the framework records itself; a body never asks for them.
_FRAMEWORK = ("unwinding", "compensate:")


def _framework_steps(job: Job[Any, Any]) -> tuple[str, ...]:
    """The step names a job of this kind records for the framework, which a
    replay need not ask for again: a consumer's one rolling ``batch`` record
    (its progress is the cursor it commits with each batch, so a replay from
    the committed cursor may find nothing left to batch)."""
    if job.kind == "consumer":
        from .._consumer import BATCH_STEP

        return (*_FRAMEWORK, BATCH_STEP)
    return _FRAMEWORK


@attrs.frozen(kw_only=True)
class CheckFailure:
    """One failure of a job: its ``code``, the 0-based ``example`` (``None``
    when a simulation fails with every example and with none alone), the
    ``boundary`` (``"after-fn:charge"``) or the ``seed``, a ``message``, and the
    ``reproduce`` command (``None`` when the jobs did not come from a module)."""

    code: str
    example: int | None
    message: str
    boundary: str | None = None
    seed: int | None = None
    reproduce: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "example": self.example}
        if self.seed is not None:
            body["seed"] = self.seed
        else:
            body["boundary"] = self.boundary
        body["message"] = self.message
        body["reproduce"] = self.reproduce
        return body


@attrs.frozen(kw_only=True)
class JobCheck:
    """One job's part of a :class:`CheckReport`: how many ``examples``,
    ``boundaries`` (over all its examples) and ``seeds`` were tried, and its
    ``failures``."""

    name: str
    examples: int
    boundaries: int
    seeds: int
    failures: Sequence[CheckFailure]

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "examples": self.examples,
            "boundaries": self.boundaries,
            "seeds": self.seeds,
            "failures": [f.to_json() for f in self.failures],
        }


@attrs.frozen
class CheckReport:
    """What :func:`check_jobs` found: ``ok`` and one :class:`JobCheck` per job;
    ``to_json()`` is what ``trio-jobs check --json`` prints."""

    ok: bool
    jobs: Sequence[JobCheck]

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "jobs": [j.to_json() for j in self.jobs]}


class Progress:
    """What the gate tells its printer; the default tells nobody."""

    def job_started(self, name: str, examples: int) -> None:
        """``examples`` inputs are drawn for job ``name``."""

    def boundary_done(self, name: str, example: int, done: int, total: int) -> None:
        """Example ``example`` has ``done`` of its ``total`` runs behind it."""

    def seed_done(self, name: str, done: int, total: int) -> None:
        """``done`` of ``total`` simulation seeds ran."""

    def job_done(self, result: JobCheck) -> None:
        """The job is checked."""

    def note(self, text: str) -> None:
        """Where the gate runs (said once, before the first job)."""


# --------------------------------------------------------------------------- hooks


def _usage(message: str) -> JobsError:
    return JobsError(ErrorCode.X_CONFIG_INVALID, message)


def _hook(fn: Callable[..., Any] | None, what: str) -> Callable[..., Any] | None:
    """A module's hook, whose exception stops the gate as a usage error (exit 2)
    naming the hook: it runs outside any job, so it is no job's failure."""
    if fn is None:
        return None
    if not callable(fn):
        raise _usage(f"{what} must be a function (sync or async)")

    def call(*args: Any) -> Any:
        try:
            value = fn(*args)
        except Exception as exc:
            raise _usage(f"{what} raised {type(exc).__name__}; fix the hook") from exc
        if inspect.isawaitable(value):
            return _awaited(value, what)
        return value

    return call


async def _awaited(value: Any, what: str) -> Any:
    try:
        return await value
    except Exception as exc:
        raise _usage(f"{what} raised {type(exc).__name__}; fix the hook") from exc


# --------------------------------------------------------------------------- examples


def _key(job: Job[Any, Any], value: Any) -> bytes | None:
    """The input's identity in the queue (its tenant and idempotency key), or
    ``None`` when the job would refuse it."""
    try:
        payload = job._payload(value)
        job.parse(payload)
        return orjson.dumps([job.tenant_of(value), job.idempotency_key_for(value)])
    except JobsError:
        return None


def _how_to_provide(job: Job[Any, Any]) -> str:
    return (
        f"define trio_jobs_examples = {{{job.name!r}: [...]}} in the module with inputs "
        "for it (a list of its input values)"
    )


def draw_examples(job: Job[Any, Any], count: int) -> list[Any]:
    """Up to ``count`` distinct inputs the job accepts, drawn by Hypothesis from
    ``from_type(job.input)`` with a seed of the job's name: the same every run."""
    if job.input is None:
        return [None]
    try:
        from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
        from hypothesis import strategies as st
    except ImportError:
        raise _usage(
            f"drawing inputs for {job.name} needs Hypothesis: pip install 'trio-jobs[check]', "
            f"or {_how_to_provide(job)}"
        ) from None

    found: list[Any] = []
    keys: set[bytes] = set()

    class Enough(Exception):
        pass

    @seed(zlib.crc32(job.name.encode()))
    @settings(
        max_examples=max(10 * count, 50),
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(_strategy(job, st))
    def collect(value: Any) -> None:
        if len(found) >= count:
            raise Enough
        key = _key(job, value)
        if key is None or key in keys:
            return  # the job refuses it, or it is one the gate has
        keys.add(key)
        found.append(value)
        if len(found) >= count:
            raise Enough

    try:
        collect()
    except Enough:
        pass
    except Exception as exc:
        name = getattr(job.input, "__name__", repr(job.input))
        raise _usage(
            f"Hypothesis cannot build inputs for {job.name} (its input {name}: "
            f"{type(exc).__name__}); {_how_to_provide(job)}"
        ) from None
    if not found:
        raise _usage(f"Hypothesis drew no input {job.name} accepts; {_how_to_provide(job)}")
    return found


def _strategy(job: Job[Any, Any], st: Any) -> Any:
    """What the gate draws a job's inputs from: ``from_type`` of its input, but
    for a task (occurrences on its schedule) and for a webhook receiver's (whose payload is any JSON value, which
    ``from_type`` cannot draw) an event id, a JSON payload and path parameters."""
    from .._receiver import ReceivedWebhook
    from .._task import Occurrence, Task

    if isinstance(job, Task):
        # Occurrences on the task's own schedule (from_type would draw any
        # datetime, naive ones among them, which the task refuses).
        schedule = job.schedule
        return st.integers(0, 10_000).map(
            lambda k: Occurrence(schedule.local(schedule.next_after(TASK_EPOCH + k * 3600.0)))
        )
    if job.input is not ReceivedWebhook:
        return st.from_type(job.input)
    ascii_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1)
    scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
    payload = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=8,
    )
    return st.builds(
        ReceivedWebhook,
        event_id=ascii_text.filter(lambda t: len(t) <= 64),
        payload=payload,
        params=st.dictionaries(ascii_text, ascii_text, max_size=2),
    )


def _given_examples(job: Job[Any, Any], values: Any) -> list[Any]:
    if not isinstance(values, list | tuple):
        raise _usage(f"trio_jobs_examples[{job.name!r}] must be a list of inputs")
    if not values:
        raise _usage(f"trio_jobs_examples[{job.name!r}] is empty; give at least one input")
    out = list(values)
    for index, value in enumerate(out):
        if _key(job, value) is None:
            raise _usage(
                f"trio_jobs_examples[{job.name!r}][{index}] is not an input {job.name} accepts "
                "(enqueue refuses it); fix that example"
            )
    return out


# --------------------------------------------------------------------------- replays


class _Replays:
    """Watches every attempt that starts with recorded steps: it must ask for
    them in the recorded order, with the recorded names, before any new one.

    Steps asked from a task other than the body's own (a nursery in the body)
    may come in any order, new ones among them: Trio decides it. The first difference is kept;
    the run goes on, so what it does next is crash_proof's to judge."""

    def __init__(self, name: str, framework: tuple[str, ...] = _FRAMEWORK) -> None:
        self.name = name
        self.framework = framework
        self.found: JobsError | None = None
        #: The crash_proof run going on (its boundary; ``None``: the clean run).
        self.point: str | None = None
        self.found_at: str | None = None
        #: The wall clock the body's module reads, moved between attempts (``_wall.py``).
        self.wall = Wall()

    def wrap(self, job: Job[Any, Any]) -> Job[Any, Any]:
        watched = copy.copy(job)
        body = job.run

        async def run(ctx: Any) -> Any:
            watch = self._watch(ctx)
            with attempt_wall(self.wall, ctx._state, replay=watch is not None):
                value = body(ctx)
                if inspect.isawaitable(value):
                    value = await value
            if watch is not None:
                watch.returned()
            return value

        watched.run = run
        return watched

    def _watch(self, ctx: Any) -> _Attempt | None:
        state = ctx._state
        recorded = [
            r.name
            for r in sorted(state.records.values(), key=lambda r: r.seq)
            if not r.name.startswith(self.framework)
        ]
        if not recorded:
            return None
        attempt = _Attempt(self, recorded, trio.lowlevel.current_task())
        claim = state.claim_name

        def claim_name(name: object, *, what: str) -> str:
            claimed: str = claim(name, what=what)
            attempt.asked(claimed)
            return claimed

        state.claim_name = claim_name
        return attempt

    def differ(self, message: str, step: str) -> None:
        if self.found is None:
            self.found_at = self.point
            self.found = JobsError(
                ErrorCode.X_JOB_NONDETERMINISTIC,
                f"{self.name}: {message}; the body branches on something it did not read "
                "through a step (the clock, randomness, outside state): read it inside a "
                "step (`value = await ctx.step.run('read-it', fn)`), so a replay gets the "
                "recorded value",
                meta={"job": self.name, "step": step},
            )


class _Attempt:
    def __init__(self, replays: _Replays, recorded: list[str], root: Any) -> None:
        self.replays = replays
        self.recorded = recorded
        self.remaining = list(recorded)
        self.root = root

    def asked(self, name: str) -> None:
        remaining = self.remaining
        if not remaining:
            return
        if name == remaining[0]:
            remaining.pop(0)
            return
        if trio.lowlevel.current_task() is not self.root:
            # A step of a nursery in the body: Trio orders its siblings, and a
            # new one may start before a recorded one is asked again.
            if name in remaining:
                remaining.remove(name)
            return
        at = len(self.recorded) - len(remaining) + 1
        self.replays.differ(
            f"a replay asked for step {name!r} where the recorded run has {remaining[0]!r} "
            f"(step {at} of {len(self.recorded)})",
            remaining[0],
        )
        remaining.clear()

    def returned(self) -> None:
        if self.remaining:
            at = len(self.recorded) - len(self.remaining) + 1
            self.replays.differ(
                f"a replay returned without asking for the recorded step "
                f"{self.remaining[0]!r} (step {at} of {len(self.recorded)})",
                self.remaining[0],
            )


# --------------------------------------------------------------------------- the gate


@attrs.frozen(kw_only=True)
class _Plan:
    handles: list[Job[Any, Any]]
    given: Mapping[str, Any]
    observe: Callable[[], Any] | None
    reset: Callable[[], Any] | None
    setup: Callable[[Any], Any] | None
    invariant: Callable[[World], Any] | None
    examples: int
    seeds: int
    job: str | None
    example: int | None
    seed: int | None
    reproduce: Callable[[str, int | None, int | None], str] | None


def _module_jobs(module: types.ModuleType) -> list[Job[Any, Any]]:
    found: list[Job[Any, Any]] = []
    for value in vars(module).values():
        if isinstance(value, Job) and all(value is not h for h in found):
            found.append(value)
    return found


def _plan_of(jobs: Any, **given: Any) -> _Plan:
    module: types.ModuleType | None = None
    if isinstance(jobs, types.ModuleType):
        module = jobs
        handles = _module_jobs(module)
        if not handles:
            raise _usage(f"{module.__name__} has no job at its top level")
    elif isinstance(jobs, Job):
        handles = [jobs]
    elif isinstance(jobs, list | tuple) and jobs and all(isinstance(j, Job) for j in jobs):
        handles = list(jobs)
    else:
        raise _usage("check_jobs takes a module of jobs, a job, or a non-empty list of jobs")
    names = [h.name for h in handles]
    if len(set(names)) != len(names):
        raise _usage("two jobs share a name; every job checked needs its own")

    def attr(name: str) -> Any:
        return getattr(module, name, None) if module is not None else None

    examples = given.pop("examples_given", None)
    if examples is None:
        examples = attr("trio_jobs_examples") or {}
    if not isinstance(examples, Mapping):
        raise _usage("trio_jobs_examples must be a dict of job name to a list of inputs")
    unknown = sorted(set(examples) - set(names))
    if unknown:
        raise _usage(f"trio_jobs_examples names no job of the module: {', '.join(unknown)}")
    observe = given.pop("observe") or attr("trio_jobs_observe")
    reset = given.pop("reset") or attr("trio_jobs_reset")
    setup = given.pop("setup", None) or attr("trio_jobs_setup")
    invariant = given.pop("invariant") or attr("trio_jobs_invariant")
    job = given.pop("job")
    if job is not None and job not in names:
        raise _usage(f"no job named {job!r} here; the jobs are: {', '.join(names)}")
    for flag in ("examples", "seeds"):
        value = given[flag]
        if isinstance(value, bool) or not isinstance(value, int) or value < (flag == "examples"):
            low = 1 if flag == "examples" else 0
            raise _usage(f"{flag} is a whole number, {low} or more")
    return _Plan(
        handles=handles,
        given=examples,
        observe=_hook(observe, "trio_jobs_observe()"),
        reset=_hook(reset, "trio_jobs_reset()"),
        setup=_hook(setup, "trio_jobs_setup(tx)"),
        invariant=invariant,
        job=job,
        **given,
    )


async def check_jobs(
    jobs: Any,
    *,
    examples: int = 20,
    seeds: int = 100,
    observe: Callable[[], Any] | None = None,
    reset: Callable[[], Any] | None = None,
    driver: Any = None,
    invariant: Callable[[World], Any] | None = None,
    setup: Callable[[Any], Any] | None = None,
    job: str | None = None,
    example: int | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    reproduce: Callable[[str, int | None, int | None], str] | None = None,
) -> CheckReport:
    """Check every job of ``jobs`` (a module, a job, or a list of jobs) as
    ``trio-jobs check`` does, and answer the :class:`CheckReport`.

    A module's ``trio_jobs_examples``, ``trio_jobs_observe``, ``trio_jobs_reset``,
    ``trio_jobs_invariant`` and ``trio_jobs_setup`` are used when the arguments
    do not give them. ``setup(tx)`` (PostgreSQL only) runs before every crash
    run in the throwaway schema, emptied just before: it creates the app's own
    tables (``CREATE TABLE IF NOT EXISTS``) and inserts the rows its jobs read.
    ``job``, ``example`` and ``seed`` narrow the check to one job, one of its
    examples (0-based) and one simulation seed (then only the simulation runs).
    ``driver``: ``None`` (or a memory driver) runs everything on the memory
    driver; a PostgreSQL driver (``postgres_driver(dsn)``, not opened) runs the
    crash runs and the replay checks in a throwaway schema on its database,
    made for the gate and dropped after it (so ``step.transaction`` jobs are
    checked too). ``simulate_jobs`` is a deterministic scheduler over the
    memory driver: the seeds run there in both cases, and ``progress.note`` says so.

    Raises ``JobsError(X_CONFIG_INVALID)`` when the gate cannot run (no jobs,
    inputs that cannot be drawn, a hook that raises); a job's failure is in the
    report, never raised.

    >>> report = await check_jobs(myapp.jobs, examples=5, seeds=20)
    >>> assert report.ok, report.to_json()
    """
    plan = _plan_of(
        jobs,
        observe=observe,
        reset=reset,
        setup=setup,
        invariant=invariant,
        job=job,
        examples=examples,
        seeds=seeds,
        example=example,
        seed=seed,
        reproduce=reproduce,
    )
    tell = progress or Progress()
    results = []
    async with _ground(driver, crash_runs=plan.seed is None, tell=tell, setup=plan.setup) as ground:
        for handle in plan.handles:
            if plan.job is not None and handle.name != plan.job:
                continue
            results.append(await _check_one(plan, handle, tell, ground))
    return CheckReport(all(r.ok for r in results), results)


#: What the gate says when its crash runs are on PostgreSQL.
ON_POSTGRES = (
    "crash runs and replay checks on PostgreSQL, in the throwaway schema {schema} (dropped "
    "afterwards); simulation seeds on the memory driver (simulate_jobs is a deterministic "
    "scheduler over it)"
)


@contextlib.asynccontextmanager
async def _ground(
    driver: Any,
    *,
    crash_runs: bool,
    tell: Progress,
    setup: Callable[[Any], Any] | None = None,
) -> AsyncIterator[Ground]:
    """Where the crash runs happen: the memory driver, or a throwaway schema on
    the PostgreSQL driver's database (made only when crash runs are asked for)."""
    if driver is None or isinstance(driver, MemoryDriver):
        yield MEMORY
        return
    if getattr(driver, "name", None) != "postgres":
        raise JobsError(
            ErrorCode.X_NOT_IMPLEMENTED,
            f"check_jobs runs on the memory driver or PostgreSQL, not the "
            f"{getattr(driver, 'name', type(driver).__name__)} driver; pass driver=None "
            "or postgres_driver(dsn)",
        )
    from ._pg_ground import open_postgres_ground

    if not crash_runs:
        tell.note("simulation seeds on the memory driver (simulate_jobs is a deterministic "
                  "scheduler over it); no crash runs, so nothing runs on PostgreSQL")  # fmt: skip
        yield MEMORY
        return
    async with open_postgres_ground(driver._dsn_arg) as ground:
        ground.setup = setup
        tell.note(ON_POSTGRES.format(schema=ground.schema))
        yield ground


def _inputs(plan: _Plan, handle: Job[Any, Any]) -> list[Any]:
    if handle.name in plan.given:
        values = _given_examples(handle, plan.given[handle.name])
    else:
        values = draw_examples(handle, plan.examples)
    if plan.example is not None and not 0 <= plan.example < len(values):
        raise _usage(
            f"--example {plan.example} is past {handle.name}'s {len(values)} examples "
            f"(0 to {len(values) - 1})"
        )
    return values


async def _check_one(
    plan: _Plan, handle: Job[Any, Any], tell: Progress, ground: Ground
) -> JobCheck:
    values = _inputs(plan, handle)
    indexes = [plan.example] if plan.example is not None else list(range(len(values)))
    tell.job_started(handle.name, len(indexes))
    failures: list[CheckFailure] = []
    boundaries = 0

    def command(example: int | None, seed: int | None = None) -> str | None:
        return plan.reproduce(handle.name, example, seed) if plan.reproduce else None

    if plan.seed is None:
        for index in indexes:
            found, count = await _crash_one(plan, handle, values[index], index, tell, ground)
            boundaries += count
            if found is not None:
                error, boundary = found
                failures.append(
                    CheckFailure(
                        code=str(error.code),
                        example=index,
                        boundary=boundary,
                        message=error.message,
                        reproduce=command(index),
                    )
                )
                break  # one failure of this kind is the job's; the next run finds the next
    seeds = [plan.seed] if plan.seed is not None else list(range(plan.seeds))
    scenario = [values[i] for i in indexes]
    for done, seed in enumerate(seeds, 1):
        broke = await _simulate_one(plan, handle, scenario, seed)
        tell.seed_done(handle.name, done, len(seeds))
        if broke is None:
            continue
        alone: int | None = plan.example
        if alone is None and len(indexes) > 1:
            # Which example fails on its own, for a reproduction of one input.
            for index in indexes:
                if await _simulate_one(plan, handle, [values[index]], seed) is not None:
                    alone = index
                    break
        failures.append(
            CheckFailure(
                code=str(broke.code),
                example=alone,
                seed=seed,
                message=broke.message,
                reproduce=command(alone, seed),
            )
        )
        break
    result = JobCheck(
        name=handle.name,
        examples=len(indexes),
        boundaries=boundaries,
        seeds=len(seeds) if plan.seed is None else 1,
        failures=failures,
    )
    tell.job_done(result)
    return result


async def _crash_one(
    plan: _Plan, handle: Job[Any, Any], value: Any, index: int, tell: Progress, ground: Ground
) -> tuple[tuple[JobsError, str | None] | None, int]:
    """``crash_proof`` of one input, watching its replays; the failure (and its
    boundary) and how many boundaries it tried."""
    replays = _Replays(handle.name, _framework_steps(handle))
    watched = replays.wrap(handle)
    total = [0]

    def on_run(at: int | None, of: int, point: str | None) -> None:
        total[0] = of
        replays.point = point
        replays.wall.restart()
        if at is not None:
            tell.boundary_done(handle.name, index, at, of)

    # The body's module reads a moved wall clock for these runs (``_wall.py``).
    with moved_wall(handle.run):
        return await _crash_walk(plan, handle, value, watched, replays, on_run, total, ground)


async def _crash_walk(
    plan: _Plan,
    handle: Job[Any, Any],
    value: Any,
    watched: Job[Any, Any],
    replays: _Replays,
    on_run: Callable[[int | None, int, str | None], None],
    total: list[int],
    ground: Ground,
) -> tuple[tuple[JobsError, str | None] | None, int]:
    others = [h for h in plan.handles if h is not handle]
    try:
        report = await _crash_proof(
            watched,
            value,
            observe=plan.observe,
            reset=plan.reset,
            jobs=others,
            on_run=on_run,
            ground=ground,
        )
    except JobsError as exc:
        if exc.code == ErrorCode.X_CONFIG_INVALID:
            raise  # a hook raised: the gate cannot run
        if replays.found is None and total[0]:
            # A divergence may be a replay taking another path: replay the whole
            # recorded run once (killed at its last boundary) before blaming the crash.
            replays.wall.restart(again=True)  # the replays read what the failed run's did
            hits, *_ = await _run_once(
                watched,
                value,
                [watched, *others],
                plan.observe,
                plan.reset,
                total[0] - 1,
                ground,
            )
            if replays.found is not None and hits:
                replays.found_at = _point(*hits[-1])
        if replays.found is not None:
            return (replays.found, replays.found_at), total[0]
        if exc.code in (ErrorCode.X_JOB_CRASH_DIVERGED, ErrorCode.X_INVARIANT):
            return (exc, _boundary(exc)), total[0]
        raise
    if replays.found is not None:
        return (replays.found, replays.found_at), report.boundaries
    return None, report.boundaries


def _boundary(exc: JobsError) -> str | None:
    value = exc.meta.get("boundary") if isinstance(exc.meta, Mapping) else None
    return value if isinstance(value, str) else None


async def _simulate_one(
    plan: _Plan, handle: Job[Any, Any], scenario: list[Any], seed: int
) -> JobsError | None:
    if plan.reset is not None:
        value = plan.reset()
        if inspect.isawaitable(value):
            await value
    try:
        await simulate_jobs(
            jobs=plan.handles,
            workers=3,
            seed=seed,
            scenario=[(handle, v) for v in scenario],
            invariant=plan.invariant,
            faults=GATE_FAULTS,
            max_time=GATE_TASK_TIME if tasks_of(plan.handles) else SIMULATION_MAX_TIME,
        )
    except JobsError as exc:
        if exc.code != ErrorCode.X_SIMULATION_INVARIANT:
            raise
        # simulate_jobs' own reproduction names the project's scenarios, not this gate's.
        message = exc.message.split(" Reproduce: ")[0]
        return JobsError(exc.code, message, meta=exc.meta)
    return None
