"""The scenarios: jobs, a workload, faults and an invariant each."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
import trio

from trio_jobs import (
    Concurrency,
    ConsumerBatch,
    JobContext,
    JobsError,
    Occurrence,
    Retry,
    Signal,
    Transaction,
    consumer,
    current_jobs,
    job,
    publish_event,
    rate_limiter,
    task,
)
from trio_jobs.testing import Faults, SimulationResult, World, simulate_jobs


@attrs.frozen
class Item:
    n: int
    key: str = "k"


# ----------------------------------------------------------------------- jobs


@job(
    input=Item,
    idempotency_key=lambda i: f"three:{i.n}",
    retry=Retry(attempts=10, base="1s", max_delay="10s"),
)
async def three_steps(ctx: JobContext[Item]) -> int:
    a = await ctx.step.run("a", lambda: ctx.input.n)
    b = await ctx.step.run("b", lambda: 2)
    await ctx.step.sleep("30s")
    c = await ctx.step.run("c", lambda: 3)
    return int(a) + int(b) + int(c)


async def _slow(value: int) -> int:
    await trio.sleep(5)  # virtual time: the run is in flight while workers stall
    return value


@job(
    input=Item,
    idempotency_key=lambda i: f"slow:{i.n}",
    retry=Retry(attempts=20, base="1s", max_delay="10s"),
)
async def slow_steps(ctx: JobContext[Item]) -> int:
    a = await ctx.step.run("a", lambda: _slow(1))
    b = await ctx.step.run("b", lambda: _slow(2))
    return int(a) + int(b)


def slow_done(world: World) -> None:
    all_settled(world)
    for view in world.jobs:
        assert view.state == "done", f"{view.id} ended {view.state}"
        assert view.result == 3


@job(
    input=Item,
    idempotency_key=lambda i: f"keyed:{i.n}",
    concurrency=Concurrency(limit=1, key=lambda i: i.key),
    retry=Retry(attempts=10, base="1s", max_delay="10s"),
)
async def keyed(ctx: JobContext[Item]) -> None:
    await ctx.step.run("work", lambda: ctx.input.n)


@job(
    input=Item,
    tenant=lambda i: i.key,
    idempotency_key=lambda i: f"tenant-job:{i.n}",
    retry=Retry(attempts=10, base="1s", max_delay="10s"),
)
async def per_tenant(ctx: JobContext[Item]) -> str:
    return str(await ctx.step.run("work", lambda: ctx.tenant_id))


TENANTS = ("org-a", "org-b", "org-c")
TENANT_JOBS = 8


def one_job_per_tenant_key(world: World) -> None:
    all_settled(world)
    seen: dict[str, int] = {}
    for view in world.jobs:
        assert view.tenant_id is not None
        seen[view.tenant_id] = seen.get(view.tenant_id, 0) + 1
        assert view.result == view.tenant_id, "a run acted for another tenant"
    assert seen == dict.fromkeys(TENANTS, TENANT_JOBS), f"jobs per tenant: {seen}"


COMPENSATIONS: dict[int, list[str]] = {}


def _compensate(n: int, step: str) -> Callable[[Any], None]:
    def undo(_output: Any) -> None:
        COMPENSATIONS.setdefault(n, []).append(step)

    return undo


@job(
    input=Item,
    idempotency_key=lambda i: f"saga:{i.n}",
    compensates=True,
    retry=Retry(attempts=3, base="1s", max_delay="5s"),
)
async def saga(ctx: JobContext[Item]) -> None:
    n = ctx.input.n
    await ctx.step.run("charge", lambda: "c", compensate=_compensate(n, "charge"))
    await ctx.step.run("reserve", lambda: "r", compensate=_compensate(n, "reserve"))
    if n % 2 == 0:
        await ctx.step.run("ship", _fail_ship)


def _fail_ship() -> None:
    raise RuntimeError("the carrier refused the parcel")


TOKENS = itertools.count(1)


def _reset_tokens() -> None:
    global TOKENS
    TOKENS = itertools.count(1)


@attrs.frozen
class Receipt:
    parent: int
    token: int


@job(input=Receipt, idempotency_key=lambda r: f"receipt:{r.token}")
async def receipt(ctx: JobContext[Receipt]) -> None:
    return None


@job(
    input=Item,
    idempotency_key=lambda i: f"handoff:{i.n}",
    retry=Retry(attempts=10, base="1s", max_delay="10s"),
)
async def handoff(ctx: JobContext[Item]) -> int:
    async def enqueue(tx: Any) -> int:
        # A fresh key per execution: only the transaction keeps a re-run from
        # leaving a second receipt.
        token = next(TOKENS)
        await receipt.enqueue(Receipt(ctx.input.n, token))
        return token

    return int(await ctx.step.transaction("handoff", enqueue))


def one_receipt_per_handoff(world: World) -> None:
    all_settled(world)
    receipts: dict[int, list[int]] = {}
    parents: dict[int, Any] = {}
    for view in world.jobs:
        if view.name == receipt.name:
            receipts.setdefault(int(view.payload["parent"]), []).append(int(view.payload["token"]))
        else:
            parents[int(view.payload["n"])] = view
    for n, view in parents.items():
        got = receipts.get(n, [])
        assert len(got) <= 1, f"handoff {n} left {len(got)} receipts"
        if view.state == "done":
            assert got == [view.result], f"handoff {n}: receipts {got}, recorded {view.result}"


@attrs.frozen
class Paid:
    n: int
    amount: int


@job(
    input=Item,
    idempotency_key=lambda i: f"order:{i.n}",
    retry=Retry(attempts=10, base="1s", max_delay="10s"),
)
async def order(ctx: JobContext[Item]) -> int | None:
    n = ctx.input.n
    await ctx.step.run("placed", lambda: n)
    paid = await ctx.step.wait_for_event(
        "payment", f"paid:{n}", schema=Paid, timeout="90s", match=lambda p: p.n == n
    )
    if paid is None:
        return None
    return int(await ctx.step.run("ship", lambda: paid.amount))


@job(
    input=Item,
    idempotency_key=lambda i: f"payer:{i.n}:{i.key}",
    retry=Retry(attempts=10, base="1s", max_delay="10s"),
)
async def payer(ctx: JobContext[Item]) -> None:
    # Publishes after a spread of durable sleeps, so payments land before, while
    # and after the orders wait; a second payer of the same order publishes again.
    n, second = ctx.input.n, ctx.input.key == "again"
    await ctx.step.sleep(f"{(n * 7 + (25 if second else 0)) % 120}s")
    amount = n * 100 + (1 if second else 0)
    await ctx.step.run("pay", lambda: publish_event(f"paid:{n}", {"n": n, "amount": amount}))


def _orders_and_payments() -> list[tuple[Any, Any]]:
    work: list[tuple[Any, Any]] = [(order, Item(n)) for n in range(16)]
    work += [(payer, Item(n)) for n in range(16)]
    work += [(payer, Item(n, key="again")) for n in range(0, 16, 3)]
    return work


@job(
    input=Item,
    idempotency_key=lambda i: f"target:{i.n}",
    retry=Retry(attempts=10, base="1s", max_delay="10s"),
)
async def target(ctx: JobContext[Item]) -> int:
    n = ctx.input.n
    await ctx.step.run("a", lambda: n)
    await ctx.step.sleep(f"{n % 5 * 3}s")
    await ctx.step.run("b", lambda: n)
    return n


@job(
    input=Item,
    idempotency_key=lambda i: f"operator:{i.n}",
    retry=Retry(attempts=10, base="1s", max_delay="10s"),
)
async def operator(ctx: JobContext[Item]) -> str:
    # Enqueues its target (exactly once, in the step's transaction), waits a
    # while, then cancels it: before it starts, while it runs or sleeps, or
    # after it finished.
    n = ctx.input.n

    async def enqueue(tx: Any) -> str:
        return (await target.enqueue(Item(n))).id

    job_id = str(await ctx.step.transaction("enqueue", enqueue))
    await ctx.step.sleep(f"{(n * 3) % 11}s")

    async def cancel() -> str:
        try:
            return (await current_jobs().cancel(job_id, reason="the simulation")).state
        except JobsError as exc:
            if exc.code != "X_JOB_NOT_CANCELLABLE":
                raise  # a transient driver error: the step fails and is retried
            return str(exc.code)

    return str(await ctx.step.run("cancel", cancel))


@task(every="10s", catch_up="all", name="sim.every10", retry=Retry(attempts=10, base="1s"))
async def every10(ctx: JobContext[Occurrence]) -> str:
    return str(await ctx.step.run("tick", lambda: ctx.input.at.isoformat()))


@task(cron="* * * * *", catch_up="all", name="sim.minutely", retry=Retry(attempts=10, base="1s"))
async def minutely(ctx: JobContext[Occurrence]) -> None:
    await ctx.step.run("tick", lambda: None)


#: How long the tasks scenario runs (virtual seconds), and the end of the window
#: every occurrence must have fired in: a leader that dies near the end may
#: leave its last occurrences to an heir that arrives after the simulation
#: stops (a lease ttl, plus a replacement worker's start).
TASKS_RUN = 900.0
TASKS_SETTLE = 120.0


#: The consumers scenario: each key's stream, its items' arrival gaps, and how
#: long it runs (its supervisor re-arms every minute, so it runs all of it).
STREAM_KEYS = ("k0", "k1", "k2")
STREAM_ITEMS = 12
CONSUMERS_RUN = 420.0


async def _stream(key: str, cursor: str | None, signal: Signal) -> Any:
    after = -1 if cursor is None else int(cursor)
    for n in range(after + 1, STREAM_ITEMS):
        # Bursts and pauses: full batches, and part-filled ones the linger commits.
        await trio.sleep(0.3 if n % 5 == 4 else 0.01)
        yield n


async def _handle_stream(batch: ConsumerBatch) -> str:
    # The effect is written through the batch's transaction: it lands with the
    # batch's commit or not at all (published on commit, as a row would be).
    await batch.tx.driver_tx.publish(f"sim.handled:{batch.key}", list(batch.items))
    return str(batch.items[-1])


async def _load_cursor(key: str, tx: Transaction) -> str | None:
    found, _now = await tx.jobs.driver.events.poll(f"sim.cursor:{key}", -math.inf)
    return str(found[-1].payload) if found else None


async def _save_cursor(key: str, cursor: str, tx: Transaction) -> None:
    await tx.driver_tx.publish(f"sim.cursor:{key}", cursor)


streams = consumer(
    name="sim.streams",
    keys=lambda: list(STREAM_KEYS),
    open=_stream,
    handle=_handle_stream,
    load_cursor=_load_cursor,
    save_cursor=_save_cursor,
    batch=4,
    rearm="1m",
    retry=Retry(attempts=10, base="1s", max_delay="10s"),
)


# ----------------------------------------------------------------------- invariants


def streams_kept(world: World) -> None:
    """Every item of every key's stream was handled at least once (its effect
    committed), and no key's committed cursor is ahead of a committed effect:
    every item up to the cursor has one."""
    events = world.driver._events
    for key in STREAM_KEYS:
        handled = {int(n) for e in events if e.name == f"sim.handled:{key}" for n in e.payload}
        cursors = [int(e.payload) for e in events if e.name == f"sim.cursor:{key}"]
        for at in cursors:
            ahead = sorted(set(range(at + 1)) - handled)
            assert not ahead, (
                f"{key}: the cursor moved to {at} ahead of items never handled: {ahead}"
            )
        missing = sorted(set(range(STREAM_ITEMS)) - handled)
        assert not missing, f"{key}: items never handled: {missing}"
        assert cursors, f"{key}: no cursor was ever committed"
        assert cursors[-1] == STREAM_ITEMS - 1, f"{key}: cursors {cursors}"


def each_occurrence_once(world: World) -> None:
    """Every occurrence of each task after its arming, up to the window's end,
    fired exactly once: a run per occurrence, none twice, none skipped."""
    store = world.driver.tasks
    assert store is not None
    for handle in (every10, minutely):
        state = store._tasks.get(handle.name)
        assert state is not None, f"{handle.name} was never armed"
        fired = Counter(
            handle.parse(v.payload).at.timestamp() for v in world.jobs if v.name == handle.name
        )
        twice = sorted(at for at, n in fired.items() if n > 1)
        assert not twice, f"{handle.name}: occurrences fired twice: {twice}"
        due, _more = handle.schedule.newest(state.armed_at, world.now - TASKS_SETTLE, 10_000)
        missed = sorted(set(due) - set(fired))
        assert not missed, f"{handle.name}: occurrences never fired: {missed}"
        assert due, f"{handle.name}: no occurrence fell due in the window"


@job(
    input=Item,
    idempotency_key=lambda i: f"part:{i.key}:{i.n}",
    retry=Retry(attempts=20, base="1s", max_delay="10s"),
)
async def part(ctx: JobContext[Item]) -> int:
    return ctx.input.n * ctx.input.n


#: Children per parent: one invoke, then a gather of PARTS.
PARTS = 4


@job(
    input=Item,
    idempotency_key=lambda i: f"fanout:{i.n}",
    retry=Retry(attempts=20, base="1s", max_delay="10s"),
    event_poll="10m",
)
async def fanout(ctx: JobContext[Item]) -> list[int]:
    n = ctx.input.n
    first = await ctx.step.invoke("first", part, Item(n, key=f"f{n}"))
    rest = await ctx.step.gather("rest", [(part, Item(n + k, key=f"r{n}")) for k in range(PARTS)])
    return [int(first), *(int(r) for r in rest)]


def families_kept(world: World) -> None:
    """Every parent resumes exactly once with its children's results in order:
    its invoke and gather records completed once, holding the results of the
    children they name, which are its children and done; no child is enqueued
    twice (one row per parent and key, as many as the steps asked for)."""
    all_settled(world)
    views = {v.id: v for v in world.jobs}
    for view in world.jobs:
        if view.name != fanout.name:
            continue
        n = int(view.payload["n"])
        expected = [n * n, *((n + k) ** 2 for k in range(PARTS))]
        assert view.state == "done", f"parent {n} ended {view.state}: {view.last_error}"
        assert view.result == expected, f"parent {n} resumed with {view.result}, not {expected}"
        steps = world.driver._steps[view.id]
        for name, count in (("first", 1), ("rest", PARTS)):
            record = steps[name]
            assert record.status == "completed", f"parent {n}'s {name} is {record.status}"
            assert record.executions == 1, f"parent {n}'s {name} ran {record.executions} times"
            assert len(record.output) == count, f"parent {n}'s {name} holds {record.output}"
        kids = [views[c] for c in view.children]
        keys = Counter(k.idempotency_key for k in kids)
        twice = sorted(k for k, c in keys.items() if c > 1)
        assert not twice, f"parent {n}: children enqueued twice under {twice}"
        assert len(kids) == 1 + PARTS, f"parent {n} has {len(kids)} children, not {1 + PARTS}"
        assert all(k.state == "done" and k.parent_id == view.id for k in kids), (
            f"parent {n}: children {[(k.id[:8], k.state) for k in kids]}"
        )


def all_settled(world: World) -> None:
    unsettled = [v.id for v in world.jobs if v.state not in ("done", "dead", "failed", "cancelled")]
    assert not unsettled, f"{len(unsettled)} jobs never settled"


def three_done(world: World) -> None:
    all_settled(world)
    for view in world.jobs:
        if view.state == "done":
            assert {s.name: s.status for s in view.steps}.get("c") == "completed"


def one_lease_per_key(world: World) -> None:
    driver = world.driver
    now = driver.now()
    held: dict[str, int] = {}
    for (lease_key, _slot), (_job, _fence, expires) in driver._leases.items():
        if expires > now:
            held[lease_key] = held.get(lease_key, 0) + 1
    assert all(count <= 1 for count in held.values()), f"a concurrency=1 key is held {held}"
    waiters_woken(world)


def waiters_woken(world: World) -> None:
    """A run waiting on a busy key sleeps only while something can free or take
    the key: a slot of it is held (live, or lapsed and not yet reaped), or a run
    of the key is due or running. A release that wakes no waiter leaves the key
    with neither, and every waiter asleep until its bound."""
    driver = world.driver
    now = driver.now()
    rows = driver._rows.values()
    # It runs at every event: first the (usually no) runs asleep on a key no
    # slot of which is held, and only then what could still take that key.
    asleep = [r for r in rows if r.busy_key is not None and r.state == "ready" and r.run_at > now]
    if not asleep:
        return
    held = {lease_key for (lease_key, _slot) in driver._leases}
    waiting: dict[str, list[str]] = {}
    for row in asleep:
        if row.name == keyed.name:
            key = keyed.lease_key(row.concurrency_key)
            if key not in held:
                waiting.setdefault(key, []).append(row.id[:8])
    if not waiting:
        return
    movable = {
        keyed.lease_key(row.concurrency_key)
        for row in rows
        if row.name == keyed.name
        and (row.state == "running" or (row.state == "ready" and row.run_at <= now))
    }
    stranded = {k: ids for k, ids in waiting.items() if k not in movable}
    assert not stranded, f"runs wait on keys nothing holds or takes: {stranded}"


def compensated_lifo(world: World) -> None:
    all_settled(world)
    for view in world.jobs:
        if view.name != saga.name:
            continue
        n = int(view.idempotency_key.split(":")[1])
        done = COMPENSATIONS.get(n, [])
        first_seen = list(dict.fromkeys(done))
        lifo = [
            s.name
            for s in reversed(view.steps)
            if s.name in ("charge", "reserve") and s.status == "completed"
        ]
        buried = view.state == "dead" and view.error_code == "X_JOB_LEASE_LOST"
        if buried and view.attempts >= view.max_attempts:
            # The spec's "crash on the final attempt": the unwind has UNWIND_MARGIN
            # attempts past the retry's own, and "two more lapses bury it". Lapses
            # that spent those too leave the unwind where it was (seed 66597: five
            # lapses in a row): what ran of it ran last-in first-out, and only that.
            assert first_seen == lifo[: len(first_seen)], (
                f"saga {n} compensated {done}, not a last-in first-out start of {lifo}"
            )
        elif n % 2 == 0:
            assert view.state == "dead", f"saga {n} should have failed for good"
            assert first_seen == lifo, f"saga {n} compensated {done}, expected {lifo}"
        elif view.state == "dead":
            # Crashes may spend every attempt of a saga that would have
            # succeeded: its leases lapse, and the final lapse unwinds it.
            assert view.error_code == "X_JOB_LEASE_LOST", (
                f"saga {n} died of {view.error_code}, not of lapsed leases"
            )
            assert first_seen == lifo, f"saga {n} compensated {done}, expected {lifo}"
        else:
            assert view.state == "done", f"saga {n} ended {view.state}"
            assert done == [], f"saga {n} compensated although it succeeded: {done}"


def payments_kept(world: World) -> None:
    """An order's wait answers the first matching payment published at or after
    the wait began, or times out only when none was published before its
    deadline; never another order's payment, never a lost one."""
    all_settled(world)
    events = world.driver._events
    for view in world.jobs:
        if view.name != order.name:
            continue
        assert view.state == "done", f"order {view.payload} ended {view.state}: {view.last_error}"
        n = int(view.payload["n"])
        wait = world.driver._steps[view.id]["payment"]
        assert wait.since is not None
        assert wait.deadline is not None
        since, deadline = wait.since, wait.deadline
        seen = [e for e in events if e.name == f"paid:{n}" and e.published_at >= since]
        if wait.output is None:
            # Published before the deadline: there before any poll at or past it.
            # (One published at the deadline's very instant may come after the
            # poll that timed the wait out.)
            early = [e.published_at for e in seen if e.published_at < deadline]
            assert not early, (
                f"order {n} timed out at {deadline} though paid at {early} (waiting since {since})"
            )
            assert view.result is None
        else:
            assert seen, f"order {n} got {wait.output} with no payment since {since}"
            assert wait.output == seen[0].payload, (
                f"order {n} got {wait.output}, the first payment since {since} was {seen[0].payload}"
            )
            assert view.result == wait.output["amount"]


def cancels_hold(world: World) -> None:
    """A target ends done (its steps all recorded) or cancelled, and a cancel
    that answered "cancelled" leaves it cancelled."""
    all_settled(world)
    targets = {v.id: v for v in world.jobs if v.name == target.name}
    for view in world.jobs:
        if view.name != operator.name:
            continue
        assert view.state == "done", f"operator {view.payload} ended {view.state}"
        enqueued = world.driver._steps[view.id]["enqueue"].output
        answer = view.result
        tv = targets[enqueued]
        assert tv.state in ("done", "cancelled"), f"target {tv.payload} ended {tv.state}"
        if answer == "cancelled":
            assert tv.state == "cancelled", f"target {tv.payload} cancelled, then {tv.state}"
        else:
            # Refused: it had ended, or an earlier execution's cancel landed.
            assert answer == "X_JOB_NOT_CANCELLABLE", f"cancel answered {answer}"
        if tv.state == "done":
            assert tv.result == int(tv.payload["n"])
            done = {s.name for s in tv.steps if s.status == "completed"}
            assert {"a", "b"} <= done, f"target {tv.payload} done with steps {done}"
    assert len(targets) == sum(1 for v in world.jobs if v.name == operator.name)


#: The fleet's budget in the rate-limits scenario, and when each grant was seen.
METER = rate_limiter("sim.vendor", limit=3, per="10s")
GRANTS: list[float] = []


@job(
    input=Item,
    idempotency_key=lambda i: f"metered:{i.n}",
    retry=Retry(attempts=2, base="1s", max_delay="10s"),
)
async def metered(ctx: JobContext[Item]) -> int:
    """Acquires the budget first; two attempts, far fewer than the deferrals."""
    await METER.acquire()
    GRANTS.append(trio.current_time())  # the store decided at this virtual instant
    return int(await ctx.step.run("send", lambda: ctx.input.n))


def budget_kept(world: World) -> None:
    """Every run done (waiting for the budget never dead-letters it), and at most
    3 grants in any 10 s."""
    all_settled(world)
    for view in world.jobs:
        assert view.state == "done", f"{view.id} ended {view.state} ({view.error_code})"
    grants = sorted(GRANTS)
    for i in range(len(grants) - METER.limit):
        assert grants[i] <= grants[i + METER.limit] - METER.per, (
            f"{METER.limit + 1} grants within {METER.per:g} s: {grants[i : i + METER.limit + 1]}"
        )


# ----------------------------------------------------------------------- scenarios


@attrs.frozen
class Scenario:
    name: str
    jobs: list[Any]
    workload: Callable[[], list[tuple[Any, Any]]]
    invariant: Callable[[World], None]
    faults: Faults = attrs.field(factory=Faults)
    workers: int = 3
    check: str = "quiet"
    reset: Callable[[], None] = lambda: None
    #: Virtual seconds at most (a scenario with scheduled tasks runs all of it).
    max_time: float = 30 * 86400.0


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "concurrent-workers",
            [three_steps],
            lambda: [(three_steps, Item(i)) for i in range(40)],
            three_done,
        ),
        Scenario(
            "crash-everywhere",
            [three_steps],
            lambda: [(three_steps, Item(i)) for i in range(30)],
            three_done,
            Faults(crash=0.03),
        ),
        Scenario(
            "drain-under-load",
            [three_steps],
            lambda: [(three_steps, Item(i)) for i in range(30)],
            three_done,
            Faults(drain=0.02),
        ),
        Scenario(
            "lease-expiry",
            [three_steps],
            lambda: [(three_steps, Item(i)) for i in range(30)],
            three_done,
            Faults(pause=0.02, lease_loss=0.02, skew=3.0),
        ),
        Scenario(
            "zombie-workers",
            [slow_steps],
            lambda: [(slow_steps, Item(i)) for i in range(20)],
            slow_done,
            Faults(pause=0.08, skew=2.0),
        ),
        Scenario(
            "transient-errors",
            [three_steps],
            lambda: [(three_steps, Item(i)) for i in range(30)],
            three_done,
            Faults(driver_errors=0.05, lost_wakeups=True),
        ),
        Scenario(
            "keyed-concurrency",
            [keyed],
            lambda: [(keyed, Item(i, key=f"acct{i % 3}")) for i in range(24)],
            one_lease_per_key,
            Faults(crash=0.01, pause=0.01),
            check="every-event",
        ),
        Scenario(
            "tenants",
            [per_tenant],
            lambda: [(per_tenant, Item(i, key=t)) for t in TENANTS for i in range(TENANT_JOBS)],
            one_job_per_tenant_key,
            Faults(crash=0.01),
        ),
        Scenario(
            "transactional-steps",
            [handoff, receipt],
            lambda: [(handoff, Item(i)) for i in range(20)],
            one_receipt_per_handoff,
            Faults(crash=0.03, lease_loss=0.02, pause=0.01, driver_errors=0.02),
            reset=_reset_tokens,
        ),
        Scenario(
            "compensation",
            [saga],
            lambda: [(saga, Item(i)) for i in range(16)],
            compensated_lifo,
            Faults(crash=0.005),
            reset=COMPENSATIONS.clear,
        ),
        Scenario(
            "operators",
            [operator, target],
            lambda: [(operator, Item(n)) for n in range(20)],
            cancels_hold,
            Faults(crash=0.004, lease_loss=0.004, driver_errors=0.01, pause=0.004),
        ),
        Scenario(
            "rate-limits",
            [metered],
            lambda: [(metered, Item(i)) for i in range(15)],
            budget_kept,
            Faults(driver_errors=0.03, skew=2.0),
            reset=GRANTS.clear,
        ),
        Scenario(
            "events",
            [order, payer],
            _orders_and_payments,
            payments_kept,
            Faults(crash=0.004, lease_loss=0.004, driver_errors=0.01, pause=0.004),
        ),
        Scenario(
            "scheduled-tasks",
            [every10, minutely],
            list,
            each_occurrence_once,
            Faults(crash=0.01, skew=3.0, pause=0.005, driver_errors=0.01),
            max_time=TASKS_RUN,
        ),
        Scenario(
            "children",
            [fanout, part],
            lambda: [(fanout, Item(10 * i)) for i in range(10)],
            families_kept,
            Faults(crash=0.03, lease_loss=0.01, driver_errors=0.02, pause=0.005),
        ),
        Scenario(
            "consumers",
            [streams],
            lambda: [(streams, key) for key in STREAM_KEYS],
            streams_kept,
            Faults(crash=0.02, driver_errors=0.02, pause=0.005, lease_loss=0.005, drain=0.005),
            max_time=CONSUMERS_RUN,
        ),
    ]
}


async def run_scenario(name: str, seed: int) -> SimulationResult:
    scenario = SCENARIOS[name]
    scenario.reset()
    return await simulate_jobs(
        jobs=scenario.jobs,
        workers=scenario.workers,
        seed=seed,
        scenario=scenario.workload(),
        invariant=scenario.invariant,
        faults=scenario.faults,
        check=scenario.check,  # type: ignore[arg-type]
        max_time=scenario.max_time,
    )
