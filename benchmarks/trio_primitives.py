"""``python -m benchmarks trio-primitives``: what one Trio primitive costs here.

The worker's per-job path is mostly Trio's: cancel scopes (a run's own scope,
each shielded step write, the settle, the idle wait) and trips through the
scheduler (each wait that blocks). This prints the CPU time of each, per
operation, against an empty loop, so a profile's counts can be read as time:
``python -m benchmarks trio-primitives [--n 20000]``. Instructions, which do not
vary with the load on a shared machine, come from the same loops under
``valgrind --tool=cachegrind`` (docs/how-to/test-with-crash-proof-and-simulate.md).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable, Sequence

import trio


async def _empty(n: int) -> None:
    for _ in range(n):
        pass


async def _scope(n: int) -> None:
    for _ in range(n):
        with trio.CancelScope():  # noqa: ASYNC100 - the scope itself is measured
            pass


async def _shielded_scope_with_deadline(n: int) -> None:
    for _ in range(n):
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 10):  # noqa: ASYNC100
            pass


async def _checkpoint(n: int) -> None:
    for _ in range(n):
        await trio.lowlevel.checkpoint()


async def _spawn(n: int) -> None:
    async def child() -> None:
        return None

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(child)


CASES: dict[str, Callable[[int], Awaitable[None]]] = {
    "empty loop": _empty,
    "CancelScope()": _scope,
    "CancelScope(shield=True, deadline=...)": _shielded_scope_with_deadline,
    "checkpoint (a scheduler round trip)": _checkpoint,
    "start_soon + task exit": _spawn,
}


def measure(n: int) -> dict[str, float]:
    """CPU microseconds per operation, by case (one fresh ``trio.run`` each)."""
    out: dict[str, float] = {}
    for name, case in CASES.items():
        started = time.process_time()
        trio.run(case, n)
        out[name] = (time.process_time() - started) / n * 1e6
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks trio-primitives")
    parser.add_argument("--n", type=int, default=20_000, help="operations per case")
    args = parser.parse_args(argv)
    print("| primitive | CPU µs per operation |")
    print("|---|---:|")
    for name, micros in measure(args.n).items():
        print(f"| {name} | {micros:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
