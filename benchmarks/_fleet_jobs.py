"""The job module the fleet benchmark's workers load (``benchmarks/fleet.py``).

    trio-jobs worker benchmarks._fleet_jobs:JOBS ...

With ``TJ_FLEET_CLAIMS`` set to a folder, importing it (which each worker
process does) wraps ``PostgresDriver.claim`` to time every claim statement (and
count the rows each asked for and got) and the driver's ``ack_many`` (its
statements and rows), and the process writes its samples (and the most
connections its pool held) to ``claims-<pid>.json`` there as it exits.

``TJ_FLEET_POOL_SIZE=N`` gives every worker process's driver ``pool_size=N``
(the CLI takes the driver's default, 10), so a fleet of P processes fits a
server's ``max_connections`` as P x (N + 1).
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
    from trio_jobs.drivers.postgres._driver import PostgresDriver, _PgAcks

    samples: list[float] = []
    pool = [0]
    # claim rows asked, claim rows got, ack_many statements, ack rows
    counts = [0, 0, 0, 0]
    inner = PostgresDriver.claim
    inner_acks = _PgAcks.ack_many

    async def claim(self: PostgresDriver, options: Any) -> Any:
        started = time.perf_counter()
        counts[0] += sum(options.queues.values())
        try:
            result = await inner(self, options)
            counts[1] += len(result.jobs)
            return result
        finally:
            samples.append(time.perf_counter() - started)
            # Pooled connections stay open once opened: the size is the peak.
            pool[0] = max(pool[0], self.db.pool.size)

    async def ack_many(self: _PgAcks, acks: Any) -> Any:
        counts[2] += 1
        counts[3] += len(acks)
        return await inner_acks(self, acks)

    PostgresDriver.claim = claim  # type: ignore[method-assign]
    _PgAcks.ack_many = ack_many  # type: ignore[method-assign]

    def write() -> None:
        body = {"claims": samples, "pool": pool[0], "counts": counts}
        Path(folder, f"claims-{os.getpid()}.json").write_text(json.dumps(body))

    atexit.register(write)


if os.environ.get("TJ_FLEET_CLAIMS"):
    _time_claims(os.environ["TJ_FLEET_CLAIMS"])


if os.environ.get("TJ_FLEET_POOL_SIZE"):
    from trio_jobs.drivers.postgres import _driver as _d

    _pool_size = int(os.environ["TJ_FLEET_POOL_SIZE"])
    _init = _d.PostgresDriver.__init__

    def _sized(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["pool_size"] = _pool_size
        _init(self, *args, **kwargs)

    _d.PostgresDriver.__init__ = _sized  # type: ignore[method-assign]


if os.environ.get("TJ_FLEET_PREFETCH_MAX"):
    # An experiment's knob: the default prefetch's ceiling in every worker process.
    import trio_jobs._worker as _w

    _w.PREFETCH_MAX = int(os.environ["TJ_FLEET_PREFETCH_MAX"])
