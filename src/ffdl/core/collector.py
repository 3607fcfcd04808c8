"""Python's cyclic garbage collector paused for a long computation that makes no reference cycle.

A fold over a whole log and a simulation over a whole trace each make millions of short-lived
objects, all freed by reference counting, while what they keep grows; the collector's passes then
find nothing and cost a large share of the run (40% of rebuilding a 400,000-event log, 2% of the
Philly replay). Each caller's tests hold that it leaves nothing unreachable.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cyclic collector off for the block, then as it was (on only if it was on before)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
