"""The job module the fleet benchmark's workers load (``benchmarks/fleet.py``).

    trio-jobs worker benchmarks._fleet_jobs:JOBS ...

With ``TJ_FLEET_CLAIMS`` set to a folder, importing it (which each worker
process does) wraps ``PostgresDriver.claim`` to time every claim statement, and
the process writes its samples (and the most connections its pool held) to
``claims-<pid>.json`` there as it exits.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path
from typing import Any

from trio_jobs import JobContext, job


@job(name="bench.fleet.noop", input=int, idempotency_key=lambda i: f"fleet:{i}")
async def fleet_noop(ctx: JobContext[int]) -> None:
    return None


JOBS = [fleet_noop]


def _time_claims(folder: str) -> None:
    from trio_jobs.drivers.postgres._driver import PostgresDriver

    samples: list[float] = []
    pool = [0]
    inner = PostgresDriver.claim

    async def claim(self: PostgresDriver, options: Any) -> Any:
        started = time.perf_counter()
        try:
            return await inner(self, options)
        finally:
            samples.append(time.perf_counter() - started)
            # Pooled connections stay open once opened: the size is the peak.
            pool[0] = max(pool[0], self.db.pool.size)

    PostgresDriver.claim = claim  # type: ignore[method-assign]

    def write() -> None:
        body = {"claims": samples, "pool": pool[0]}
        Path(folder, f"claims-{os.getpid()}.json").write_text(json.dumps(body))

    atexit.register(write)


if os.environ.get("TJ_FLEET_CLAIMS"):
    _time_claims(os.environ["TJ_FLEET_CLAIMS"])


if os.environ.get("TJ_FLEET_PREFETCH_MAX"):
    # An experiment's knob: the default prefetch's ceiling in every worker process.
    import trio_jobs._worker as _w

    _w.PREFETCH_MAX = int(os.environ["TJ_FLEET_PREFETCH_MAX"])
