"""The shared asyncio helpers: backoff delays, the stoppable sleep, stoppable work and the supervisor."""

from __future__ import annotations

import asyncio

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from ffdl.handlers.aio import Backoff, sleep_or_stop, supervise, until_stopped


@given(
    first_s=st.floats(0.01, 5),
    factor=st.floats(1, 100),
    jitter=st.floats(0, 1),
    draws=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=20),
    reset_at=st.integers(0, 20),
)
def test_backoff_delays_double_up_to_the_cap_within_the_jitter_and_start_over_after_a_reset(
    first_s: float, factor: float, jitter: float, draws: list[float], reset_at: int
) -> None:
    max_s = first_s * factor
    pending = iter(draws)
    backoff = Backoff(first_s, max_s, jitter=jitter, draw=lambda: next(pending))
    step = first_s
    for index in range(len(draws)):
        if index == reset_at:
            backoff.reset()
            step = first_s
        delay = backoff.next_delay()
        assert step * (1 - jitter) - 1e-9 <= delay <= step + 1e-9
        assert delay <= max_s + 1e-9
        step = min(max_s, step * 2)


def test_a_backoff_without_jitter_is_the_doubling_sequence() -> None:
    backoff = Backoff(0.5, 3.0, jitter=0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize(("first_s", "max_s", "jitter"), [(0, 1, 0.5), (2, 1, 0.5), (1, 2, 1.5)])
def test_a_backoff_refuses_delays_that_cannot_work(first_s: float, max_s: float, jitter: float) -> None:
    with pytest.raises(ValueError):
        Backoff(first_s, max_s, jitter=jitter)


async def test_sleep_or_stop_returns_as_soon_as_stop_is_set() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, stop.set)
    async with asyncio.timeout(5):
        assert await sleep_or_stop(stop, 60)


async def test_sleep_or_stop_sleeps_the_time_when_nobody_stops() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await sleep_or_stop(asyncio.Event(), 0.05)
    assert loop.time() - started >= 0.05


async def test_until_stopped_gives_the_work_s_result() -> None:
    async def work() -> int:
        return 7

    assert await until_stopped(work(), asyncio.Event()) == 7


async def test_until_stopped_cancels_the_work_when_stop_is_set() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def work() -> int:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 7

    asyncio.get_running_loop().call_later(0.01, stop.set)
    async with asyncio.timeout(5):
        assert await until_stopped(work(), stop) is None
    assert cancelled.is_set()


async def test_until_stopped_raises_what_the_work_raised() -> None:
    async def work() -> int:
        raise LookupError("gone")

    with pytest.raises(LookupError, match="gone"):
        await until_stopped(work(), asyncio.Event())


async def test_a_supervised_role_is_restarted_with_growing_delays_reset_by_a_healthy_run() -> None:
    now = 0.0
    runs = 0
    stop = asyncio.Event()

    async def run() -> None:
        nonlocal now, runs
        runs += 1
        if runs == 4:
            now += 60  # this run lasted long enough to count as healthy before it crashed
        if runs == 7:
            stop.set()
            return
        raise RuntimeError("crash")

    backoff = Backoff(0.001, 0.004, jitter=0)
    with structlog.testing.capture_logs() as logs:
        async with asyncio.timeout(5):
            await supervise("role", run, stop, backoff=backoff, healthy_after_s=30, clock=lambda: now)
    delays = [entry["retry_in_s"] for entry in logs if entry["event"] == "role crashed; restarting"]
    assert delays == [0.001, 0.002, 0.004, 0.001, 0.002, 0.004]


async def test_a_supervised_role_that_returns_is_run_again_until_stop() -> None:
    stop = asyncio.Event()
    runs = 0

    async def run() -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            stop.set()

    async with asyncio.timeout(5):
        await supervise("role", run, stop, backoff=Backoff(1, 1), healthy_after_s=1)
    assert runs == 3
