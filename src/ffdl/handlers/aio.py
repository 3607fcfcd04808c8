"""The asyncio patterns every long-running loop of the platform shares, written once.

* :class:`Backoff`: the delays between retries of something that keeps failing;
* :func:`sleep_or_stop`: a pause that the platform's stop event cuts short, so stopping never waits
  out a retry delay;
* :func:`until_stopped`: work that the stop event cancels (a campaign, a watch);
* :func:`supervise`: a role run again after it crashed, with backoff.

Adapters use them too (they sit above this layer), so a retry behaves the same against every service.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")


class Backoff:
    """Delays between retries: a step doubling from ``first_s`` up to ``max_s``, each delay jittered.

    A delay is drawn between ``(1 - jitter)`` times the step and the step itself: the clients of a
    service that went away do not all come back at the same instant, and no delay exceeds ``max_s``.
    Call :meth:`reset` after a success, or after a run long enough to count as healthy: the next
    failure is then retried after a short delay again, not after the cap reached by an outage long ago.
    """

    def __init__(
        self,
        first_s: float,
        max_s: float,
        *,
        jitter: float = 0.5,
        draw: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"need 0 < first_s <= max_s, got {first_s} and {max_s}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"jitter is a fraction of the delay, got {jitter}")
        self.first_s = first_s
        self.max_s = max_s
        self._jitter = jitter
        self._draw = draw
        self._step_s = first_s

    def next_delay(self) -> float:
        """The delay before the next retry; the one after it will be drawn from a step twice as long."""
        delay = self._step_s * (1 - self._jitter * self._draw())
        self._step_s = min(self.max_s, self._step_s * 2)
        return delay

    def reset(self) -> None:
        self._step_s = self.first_s


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``, or less if ``stop`` gets set; returns whether ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def until_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """``work``'s result, or None once ``stop`` is set first (``work`` is then cancelled).

    An exception of ``work`` is raised here; cancelling the caller cancels ``work`` too.
    """
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, stopping, return_exceptions=True)
    return None if task.cancelled() else task.result()


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    *,
    backoff: Backoff,
    healthy_after_s: float,
    clock: Callable[[], float] | None = None,
) -> None:
    """Run ``run`` until ``stop``: again after it returns, and after a crash once a backoff delay passed.

    A run that lasted ``healthy_after_s`` (on ``clock``, the event loop's by default) resets the
    backoff, so a role that crashes once a day restarts at once rather than after the longest delay.
    """
    now = clock or asyncio.get_running_loop().time
    while not stop.is_set():
        started = now()
        try:
            await run()
        except Exception:
            if now() - started >= healthy_after_s:
                backoff.reset()
            delay = backoff.next_delay()
            log.exception("role crashed; restarting", role=name, retry_in_s=delay)
            await sleep_or_stop(stop, delay)
