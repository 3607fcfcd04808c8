"""Roles of a new data directory open its projection at the same moment, each in its own process."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

from ffdl.projections.store import Projection

PROCESSES = 6
FRESH_FILES = 40


def _open_each(paths: list[Path], barrier: Barrier) -> None:
    for path in paths:
        barrier.wait(timeout=30)  # all open the same new file together; one that died breaks it
        projection = Projection(path)
        projection.positions()
        projection.close()


def test_processes_opening_a_new_projection_together_all_open_it(tmp_path: Path) -> None:
    """Turning a new file to WAL while another process holds its write lock is refused at once by
    SQLite, whatever the busy timeout (a scheduler died of it at start); about one round in ten
    raced that way before the open tried again."""
    paths = [tmp_path / f"projection-{n}.sqlite" for n in range(FRESH_FILES)]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    processes = [context.Process(target=_open_each, args=(paths, barrier)) for _ in range(PROCESSES)]
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.join(timeout=120)
    finally:
        for process in processes:
            process.kill()
    assert [process.exitcode for process in processes] == [0] * PROCESSES
    assert all(Projection(path).positions() == {} for path in paths)
