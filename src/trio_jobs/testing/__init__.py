"""Testing tools: the harness, and (from the simulation issue) crash_proof and simulate_jobs."""

from ._harness import Harness, HarnessClock, StepTrace, Trace, open_harness

__all__ = ["Harness", "HarnessClock", "StepTrace", "Trace", "open_harness"]
