"""Testing tools: the harness, crash_proof, and simulate_jobs."""

from ._crash import CrashReport, crash_proof
from ._harness import Harness, HarnessClock, StepTrace, Trace, open_harness
from ._simulate import Faults, SimulationResult, World, simulate_jobs

__all__ = [
    "CrashReport",
    "Faults",
    "Harness",
    "HarnessClock",
    "SimulationResult",
    "StepTrace",
    "Trace",
    "World",
    "crash_proof",
    "open_harness",
    "simulate_jobs",
]
