"""The projection's progress as the API sees it: a commit by another connection (any process) wakes
every waiter within a tick, a commit between a waiter's read and its wait is not slept through, and
nothing polls while nobody waits."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from ffdl.api.progress import ProjectionProgress
from ffdl.projections.store import Projection

TICK_S = 0.01


def commit_elsewhere(path: Path) -> None:
    """A transaction committed on another connection, as the projector's in another process."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("INSERT OR REPLACE INTO counters VALUES ('bump', random())")
    db.close()


class CountedProbe:
    """The projection file's version, as ``ProjectionProgress`` looks at it, with the looks counted."""

    def __init__(self, projection: Projection) -> None:
        self.projection = projection
        self.looks = 0

    def __call__(self) -> int | None:
        self.looks += 1
        return self.projection.version()


@pytest.fixture
def projection(tmp_path: Path) -> Projection:
    return Projection(tmp_path / "projections.sqlite")


async def test_a_commit_wakes_every_waiter_at_the_next_look(projection: Projection) -> None:
    """One look at the file's version after the commit wakes all 500 (counted in looks, not in
    seconds, which a loaded machine stretches)."""
    probe = CountedProbe(projection)
    progress = ProjectionProgress(probe, TICK_S)
    since = progress.version()
    waiters = [asyncio.create_task(progress.wait_for_change(since, 3600)) for _ in range(500)]
    await asyncio.sleep(5 * TICK_S)
    assert not any(waiter.done() for waiter in waiters)
    before = probe.looks
    commit_elsewhere(projection.path)
    await asyncio.wait_for(asyncio.gather(*waiters), 30)  # a deadline far past the next look
    assert probe.looks - before == 1


async def test_a_commit_between_the_read_and_the_wait_ends_the_wait_at_once(projection: Projection) -> None:
    progress = ProjectionProgress(projection.version, tick_s=3600)  # no poll would notice
    since = progress.version()  # taken before the read ...
    commit_elsewhere(projection.path)  # ... which missed this commit
    await asyncio.wait_for(progress.wait_for_change(since, 3600), 30)  # else it would wait an hour


async def test_a_commit_while_the_poll_runs_before_the_wait_ends_the_wait(projection: Projection) -> None:
    progress = ProjectionProgress(projection.version, TICK_S)
    other = asyncio.create_task(progress.wait_for_change(progress.version(), 10))  # the poll runs
    await asyncio.sleep(2 * TICK_S)
    since = progress.version()
    commit_elsewhere(projection.path)
    # ended by a poll, not by its 10 s timeout (a deadline far past the next poll: a loaded machine stalls)
    await asyncio.wait_for(progress.wait_for_change(since, 10), 5)
    await other


async def test_without_a_change_a_wait_ends_at_its_timeout_and_then_nothing_polls(tmp_path: Path) -> None:
    probe = CountedProbe(Projection(tmp_path / "projections.sqlite"))
    progress = ProjectionProgress(probe, TICK_S)
    started = time.monotonic()
    await progress.wait_for_change(progress.version(), 10 * TICK_S)
    assert time.monotonic() - started >= 10 * TICK_S
    await asyncio.sleep(3 * TICK_S)
    polled = probe.looks
    await asyncio.sleep(10 * TICK_S)
    assert probe.looks == polled
