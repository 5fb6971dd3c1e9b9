"""procrastinate's side of ``python -m benchmarks postgres`` (not imported by trio-jobs).

Run by ``benchmarks/postgres.py`` with the interpreter of the separate venv it
installs under ``benchmarks/.work/``; procrastinate is never a dependency of
trio-jobs. One invocation is one run, in its own (fresh) schema::

    python _peer_procrastinate.py '{"dsn": ..., "schema": ..., "workload": "noop",
                                    "jobs": 20000, "concurrency": 32}'

It prints one JSON object on its last line. Workloads:

``noop``
    ``jobs`` no-op tasks deferred with ``batch_defer_async`` (1,000 per call, not
    timed), then one worker (``run_worker_async``, ``concurrency`` as given, a
    connection per concurrent job) is timed from its start until it has finished
    every job (the N-th ``finish_job`` landed).
``chain3``
    procrastinate has no durable steps; the nearest natural shape is a chain of
    three tasks, each deferring the next (three durable writes per workflow, as a
    3-step trio-jobs job makes). Timed until the N-th third link finished;
    reported as workflows per second.
``enqueue_many``
    ``batch_defer_async`` of 1,000, timed per call.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any

from procrastinate import App, PsycopgConnector
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def _conninfo(dsn: str, schema: str) -> str:
    params = conninfo_to_dict(dsn)
    params["options"] = f"{params.get('options') or ''} -c search_path={schema}".strip()
    return make_conninfo("", **params)


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    n = int(spec["jobs"])
    concurrency = int(spec.get("concurrency", 1))
    workload = spec["workload"]
    connector = PsycopgConnector(
        conninfo=_conninfo(spec["dsn"], spec["schema"]),
        min_size=1,
        max_size=concurrency + 4,
    )
    app = App(connector=connector)
    finished = 0
    done = asyncio.Event()
    finished_at = 0.0

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    @app.task(name="link3")
    async def link3(i: int) -> None:
        return None

    @app.task(name="link2")
    async def link2(i: int) -> None:
        await link3.defer_async(i=i)

    @app.task(name="link1")
    async def link1(i: int) -> None:
        await link2.defer_async(i=i)

    last_task = "link3" if workload == "chain3" else "noop"
    first = link1 if workload == "chain3" else noop

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        if workload == "enqueue_many":
            samples = []
            for k in range(int(spec.get("samples", 15)) + 3):
                started = time.perf_counter()
                await noop.batch_defer_async(*({"i": k * 1000 + i} for i in range(1000)))
                samples.append(time.perf_counter() - started)
            ms = [s * 1000.0 for s in samples[3:]]
            return {"median_ms": statistics.median(ms), "samples_ms": ms}

        for start in range(0, n, 1000):
            await first.batch_defer_async(*({"i": i} for i in range(start, min(n, start + 1000))))

        # What autovacuum would do after a bulk insert, before a long run: every
        # system in the benchmark gets the same (see benchmarks/README.md).
        await connector.execute_query_async("ANALYZE procrastinate_jobs")
        manager = app.job_manager
        inner = manager.finish_job

        async def finish_job(job: Any, status: Any, delete_job: bool) -> None:
            nonlocal finished, finished_at
            await inner(job, status, delete_job)
            if job.task_name == last_task and status.value == "succeeded":
                finished += 1
                if finished == n:
                    finished_at = time.perf_counter()
                    done.set()

        manager.finish_job = finish_job  # type: ignore[method-assign]
        started = time.perf_counter()
        worker = asyncio.create_task(
            app.run_worker_async(
                concurrency=concurrency,
                wait=True,
                install_signal_handlers=False,
                delete_jobs="never",
            )
        )
        waiter = asyncio.create_task(done.wait())
        await asyncio.wait({worker, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not done.is_set():
            worker.result()  # the worker died: raise its error
            raise RuntimeError("the procrastinate worker stopped before finishing")
        elapsed = finished_at - started
        worker.cancel()
        try:
            await worker
        except asyncio.CancelledError:
            pass
        return {"rate": n / elapsed, "seconds": elapsed, "finished": finished}


def main() -> int:
    spec = json.loads(sys.argv[1])
    result = asyncio.run(_run(spec))
    import procrastinate

    result["version"] = getattr(procrastinate, "__version__", "?")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
