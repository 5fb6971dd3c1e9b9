"""The checkers are checked: each planted bug is caught by simulate_jobs or crash_proof."""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from pathlib import Path

import pytest

from trio_jobs import JobsError
from trio_jobs._planted import NAMES, planted

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from simulation.scenarios import run_scenario  # noqa: E402

#: Which scenario exposes each bug, and the seeds tried (the first seed that
#: fails is enough; every seed of the list passes with the bug switched off).
CATCHERS: dict[str, tuple[str, tuple[int, ...]]] = {
    "double-settle": ("concurrent-workers", (1, 2, 3)),
    "unfenced-settle": ("zombie-workers", tuple(range(1, 9))),
    "step-rerun": ("concurrent-workers", (1, 2, 3)),
    "drain-counts": ("drain-under-load", tuple(range(1, 13))),
    "dedupe-ignores-tenant": ("tenants", (1, 2, 3)),
    "lease-not-released": ("keyed-concurrency", (1, 2, 3)),
    "compensation-reversed": ("compensation", (1, 2, 3)),
    "cancelled-body-writes": ("drain-under-load", tuple(range(1, 13))),
    "event-before-wait": ("events", tuple(range(1, 11))),
    "waiter-not-woken": ("keyed-concurrency", (1, 2, 3)),
    "rate-limit-counts": ("rate-limits", (1, 2, 3)),
    "rate-window-halved": ("rate-limits", (1, 2, 3)),
    "watermark-apart": ("scheduled-tasks", (1, 2, 3)),
    "cursor-apart": ("consumers", (1, 2, 3, 4)),
    "children-apart": ("children", (1, 2, 3, 4, 5, 6)),
    "settled-before-ack": ("concurrent-workers", (1, 2, 3)),
}

#: The kind of violation each bug is caught by (a phrase of the checker's message).
VIOLATIONS: dict[str, str | tuple[str, ...]] = {
    "double-settle": "was settled twice",
    # (a renewal, or a settle, of a lease the claim no longer held)
    "unfenced-settle": ("no longer held", "landed after its lease lapsed"),
    "step-rerun": "recorded completed twice",
    "drain-counts": "handed back with its attempt counted but no failure",
    "dedupe-ignores-tenant": "jobs per tenant",
    "lease-not-released": "still holds a concurrency lease",
    "compensation-reversed": "compensated ['charge', 'reserve'], expected ['reserve', 'charge']",
    "cancelled-body-writes": "aborted it (drain)",
    # (an order got a payment published before its wait began: none since, or
    # the first since was not the one it got)
    "event-before-wait": "payment since",
    "waiter-not-woken": "runs wait on keys nothing holds or takes",
    "rate-limit-counts": "a run waiting for a budget spends no attempt",
    "rate-window-halved": "4 grants within 10 s",
    "watermark-apart": "occurrences fired twice",
    "cursor-apart": "ahead of items never handled",
    "children-apart": "children enqueued twice",
    "settled-before-ack": "settled before any settle of its claim landed",
}


def test_every_planted_bug_has_a_catcher() -> None:
    assert set(CATCHERS) == set(NAMES) == set(VIOLATIONS)
    assert len(NAMES) >= 8
    assert importlib.util.find_spec("simulation") is not None


async def _first_failure(scenario: str, seeds: tuple[int, ...]) -> JobsError | None:
    for seed in seeds:
        try:
            await run_scenario(scenario, seed)
        except JobsError as exc:
            return exc
    return None


@pytest.mark.parametrize("bug", sorted(CATCHERS))
async def test_the_simulation_catches_the_planted_bug(
    bug: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL)
    scenario, seeds = CATCHERS[bug]
    clean = await _first_failure(scenario, seeds)
    assert clean is None, f"{scenario} fails with no bug planted: {clean}"
    with planted(bug):
        caught = await _first_failure(scenario, seeds)
    assert caught is not None, f"the planted bug {bug!r} went unnoticed by {scenario}"
    assert caught.code == "X_SIMULATION_INVARIANT"
    assert "seed" in caught.message
    phrases = VIOLATIONS[bug]
    phrases = (phrases,) if isinstance(phrases, str) else phrases
    assert any(p in caught.message for p in phrases), caught.message


async def test_crash_proof_catches_a_step_rerun() -> None:
    import attrs

    from trio_jobs import JobContext, Retry, job
    from trio_jobs.testing import crash_proof

    @attrs.frozen
    class In:
        n: int

    effects: dict[str, int] = {}

    def effect(name: str) -> None:
        effects[name] = effects.get(name, 0) + 1

    @job(input=In, idempotency_key=lambda i: f"k{i.n}", retry=Retry(attempts=3))
    async def two_steps(ctx: JobContext[In]) -> None:
        # once steps: a kill inside one surfaces X_STEP_OUTCOME_UNKNOWN, never a double.
        await ctx.step.run("a", lambda: effect("a"), once=True)
        await ctx.step.sleep("1m")
        await ctx.step.run("b", lambda: effect("b"), once=True)

    report = await crash_proof(two_steps, In(1), observe=lambda: dict(effects), reset=effects.clear)
    assert report.boundaries > 0
    assert report.unknown_outcomes > 0
    with planted("step-rerun"), pytest.raises(JobsError) as err:
        await crash_proof(two_steps, In(1), observe=lambda: dict(effects), reset=effects.clear)
    assert err.value.code == "X_JOB_CRASH_DIVERGED"


def test_planting_an_unknown_bug_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown planted bug"), planted("no-such-bug"):
        pass


#: A product module that reads a planted switch, or imports the planting module.
_READS_A_SWITCH = re.compile(
    r"_planted\.active|\bimport _planted\b|\._planted import|\b_planted import"
)


def test_no_product_module_reads_a_planted_switch() -> None:
    # Planting replaces methods for a block; the product never asks whether a
    # bug is planted, nor imports the planting module.
    assert _READS_A_SWITCH.search('if landed and _planted.active("double-settle"):')
    assert _READS_A_SWITCH.search("from ... import _planted")
    assert _READS_A_SWITCH.search("from trio_jobs._planted import planted")
    src = ROOT / "src" / "trio_jobs"
    planting = src / "_planted.py"
    modules = sorted(src.rglob("*.py"))
    assert planting in modules
    assert len(modules) > 20
    readers = [
        str(path.relative_to(src))
        for path in modules
        if path != planting and _READS_A_SWITCH.search(path.read_text(encoding="utf-8"))
    ]
    assert readers == []


def _replaceable() -> dict[str, object]:
    from trio_jobs import _consumer, _context, _retry, _unwind
    from trio_jobs._context import RunState, Steps
    from trio_jobs._scheduler import Scheduler
    from trio_jobs._worker import Worker
    from trio_jobs.drivers.memory import _driver as memory
    from trio_jobs.drivers.memory import _rate as memory_rate

    owners: list[tuple[str, object, tuple[str, ...]]] = [
        ("Worker", Worker, ("_settle_write", "_nack", "_hand_ack", "_acked", "_send_batch")),
        ("Steps", Steps, ("run", "transaction")),
        ("RunState", RunState, ("refuse_past_abort",)),
        ("_unwind", _unwind, ("compensation_order",)),
        ("memory", memory, ("_key",)),
        ("MemoryDriver", memory.MemoryDriver, ("_owned", "_release_leases", "_wake_waiter")),
        ("_MemoryEvents", memory._MemoryEvents, ("poll",)),
        ("_retry", _retry, ("deferral",)),
        ("MemoryRateLimits", memory_rate.MemoryRateLimits, ("acquire",)),
        ("Scheduler", Scheduler, ("_send",)),
        ("_consumer", _consumer, ("save_in_batch",)),
        ("_context", _context, ("_enqueue_children",)),
    ]
    return {
        f"{label}.{name}": vars(owner)[name] for label, owner, names in owners for name in names
    }


@pytest.mark.parametrize("bug", sorted(NAMES))
def test_planting_replaces_methods_for_the_block_only(bug: str) -> None:
    from trio_jobs._planted import active

    before = _replaceable()
    assert not active(bug)
    with planted(bug):
        assert active(bug)
        during = _replaceable()
        assert {k for k in before if during[k] is not before[k]}, f"{bug} replaced nothing"
        with planted(bug):  # nested: the inner block restores what it found
            pass
        assert _replaceable() == during
    assert not active(bug)
    assert all(after is before[k] for k, after in _replaceable().items())
