"""Testing tools: the harness, crash_proof, simulate_jobs, and the check_jobs gate."""

from ._check import CheckFailure, CheckReport, JobCheck, check_jobs
from ._crash import CrashReport, crash_proof
from ._harness import Harness, HarnessClock, StepTrace, Trace, open_harness
from ._simulate import Faults, SimulationResult, World, simulate_jobs

__all__ = [
    "CheckFailure",
    "CheckReport",
    "CrashReport",
    "Faults",
    "Harness",
    "HarnessClock",
    "JobCheck",
    "SimulationResult",
    "StepTrace",
    "Trace",
    "World",
    "check_jobs",
    "crash_proof",
    "open_harness",
    "simulate_jobs",
]
