"""The conformance rules of a driver's rate-limit store (``driver.rate_limits``):
part of :class:`~trio_jobs.testing.conformance.DriverConformance`.

The target's ``advance`` moves the store's clock (the memory driver's clock,
PostgreSQL's and Redis's test-only override of the server's now), so every
window is exact: a test asserts the seconds a refusal answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from ..drivers._protocol import JobDriver, RateGrant

if TYPE_CHECKING:
    from .conformance import Target

__all__ = ["RateLimitConformance"]


def _rates(driver: JobDriver) -> Any:
    if driver.rate_limits is None:
        pytest.skip(f"the {driver.name} driver declares no rate-limit store")
    return driver.rate_limits


class RateLimitConformance:
    """A sliding window per ``(name, key)``: at most ``limit`` grants in any
    interval of length ``per``, a refusal answering when one would be granted."""

    async def test_rate_store_declares_whether_it_is_shared(self, target: Target) -> None:
        assert type(_rates(target.driver).shared) is bool

    async def test_rate_grants_up_to_the_limit_then_answers_the_wait(self, target: Target) -> None:
        rates = _rates(target.driver)
        assert await rates.acquire("conf.vendor", "", 2, 10.0) == RateGrant(True)
        await target.advance(4.0)
        assert await rates.acquire("conf.vendor", "", 2, 10.0) == RateGrant(True)
        await target.advance(1.0)
        refused = await rates.acquire("conf.vendor", "", 2, 10.0)
        assert refused.granted is False
        assert refused.retry_after == pytest.approx(5.0, abs=1e-6)  # the first leaves at 10

    async def test_rate_window_slides(self, target: Target) -> None:
        rates = _rates(target.driver)
        await rates.acquire("conf.slide", "k", 2, 10.0)  # t0
        await target.advance(4.0)
        await rates.acquire("conf.slide", "k", 2, 10.0)  # t0 + 4
        await target.advance(6.0)  # t0 + 10: the first is out of (now - 10, now]
        assert (await rates.acquire("conf.slide", "k", 2, 10.0)).granted
        await target.advance(1.0)  # t0 + 11: t0 + 4 and t0 + 10 in the window
        refused = await rates.acquire("conf.slide", "k", 2, 10.0)
        assert refused.retry_after == pytest.approx(3.0, abs=1e-6)  # t0 + 4 leaves at 14
        await target.advance(refused.retry_after)
        assert (await rates.acquire("conf.slide", "k", 2, 10.0)).granted

    async def test_rate_refusals_spend_nothing(self, target: Target) -> None:
        rates = _rates(target.driver)
        assert (await rates.acquire("conf.spend", "", 1, 10.0)).granted
        for _ in range(5):
            await target.advance(1.0)
            assert not (await rates.acquire("conf.spend", "", 1, 10.0)).granted
        await target.advance(5.0)  # the one grant leaves; the refusals were never counted
        assert (await rates.acquire("conf.spend", "", 1, 10.0)).granted

    async def test_rate_names_and_keys_are_apart(self, target: Target) -> None:
        rates = _rates(target.driver)
        assert (await rates.acquire("conf.a", "k", 1, 60.0)).granted
        assert not (await rates.acquire("conf.a", "k", 1, 60.0)).granted
        assert (await rates.acquire("conf.a", "other", 1, 60.0)).granted
        assert (await rates.acquire("conf.b", "k", 1, 60.0)).granted
        # names and keys that would join to the same text stay apart
        assert (await rates.acquire("conf.x:y", "z", 1, 60.0)).granted
        assert (await rates.acquire("conf.x", "y:z", 1, 60.0)).granted
        assert (await rates.acquire("conf.x", "", 1, 60.0)).granted
        assert (await rates.acquire("conf.x:", "", 1, 60.0)).granted

    async def test_rate_a_lower_limit_waits_for_enough_to_leave(self, target: Target) -> None:
        rates = _rates(target.driver)
        for _ in range(3):
            assert (await rates.acquire("conf.lower", "", 3, 10.0)).granted
            await target.advance(1.0)
        # t0 + 3, hits at t0, t0 + 1, t0 + 2: a limit of 1 needs all three gone
        refused = await rates.acquire("conf.lower", "", 1, 10.0)
        assert refused.retry_after == pytest.approx(9.0, abs=1e-6)

    async def test_rate_concurrent_acquirers_share_one_budget(self, target: Target) -> None:
        rates = _rates(target.driver)
        answers: list[bool] = []

        async def one() -> None:
            answers.append((await rates.acquire("conf.race", "", 5, 60.0)).granted)

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(one)
        assert sorted(answers) == [False] * 15 + [True] * 5

    async def test_rate_a_refusal_waits_at_least_a_millisecond(self, target: Target) -> None:
        rates = _rates(target.driver)
        assert (await rates.acquire("conf.edge", "", 1, 1.0)).granted
        await target.advance(1.0 - 1e-5)  # 10 µs before the grant leaves
        refused = await rates.acquire("conf.edge", "", 1, 1.0)
        assert not refused.granted
        assert refused.retry_after >= 0.001

    async def test_rate_the_refused_are_spread_one_freed_slot_each(self, target: Target) -> None:
        rates = _rates(target.driver)
        assert (await rates.acquire("conf.queue", "", 2, 10.0)).granted
        await target.advance(4.0)
        assert (await rates.acquire("conf.queue", "", 2, 10.0)).granted
        await target.advance(1.0)  # t0 + 5; the slots free at t0 + 10 and t0 + 14
        waits = [(await rates.acquire("conf.queue", "", 2, 10.0)).retry_after for _ in range(5)]
        # places: t0 + 10, 14, then the same slots a window later, and so on
        assert waits == pytest.approx([5.0, 9.0, 15.0, 19.0, 25.0], abs=1e-6)
        # a refusal near its slot is told the slot and takes no place
        await target.advance(4.5)  # t0 + 9.5
        assert (await rates.acquire("conf.queue", "", 2, 10.0)).retry_after == pytest.approx(
            0.5, abs=1e-6
        )
        await target.advance(0.5)  # t0 + 10: place 0 comes back and is granted
        assert (await rates.acquire("conf.queue", "", 2, 10.0)).granted

    async def test_rate_a_queue_the_window_outran_is_opened_again(self, target: Target) -> None:
        rates = _rates(target.driver)
        for _ in range(2):
            assert (await rates.acquire("conf.outrun", "", 2, 2.0)).granted
        for _ in range(3):  # places at t0 + 2, t0 + 2, t0 + 4
            assert not (await rates.acquire("conf.outrun", "", 2, 2.0)).granted
        await target.advance(3.0)  # others take both slots at t0 + 3
        for _ in range(2):
            assert (await rates.acquire("conf.outrun", "", 2, 2.0)).granted
        # the old queue's next place (t0 + 4) is before a grant can leave (t0 + 5)
        refused = await rates.acquire("conf.outrun", "", 2, 2.0)
        assert refused.retry_after == pytest.approx(2.0, abs=1e-6)
