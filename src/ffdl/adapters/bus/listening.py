"""What both buses share about a member's rebalance listener: telling it, and naming partitions in logs.

A listener's failure is logged, never raised into the member's fetch: the roles' own listeners
(``handlers/runtime.py``) retry what the world makes fail and skip poison, so what reaches here is a
bug, and the member keeps serving the partitions rather than stalling the whole group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from ffdl.handlers.ports import RebalanceListener, TopicPartition


def partition_names(partitions: Iterable[TopicPartition]) -> list[str]:
    """Partitions as ``topic[p]`` strings, sorted, for log lines."""
    return [f"{tp.topic}[{tp.partition}]" for tp in sorted(partitions)]


async def tell_listener(
    listener: RebalanceListener | None,
    callback: Literal["on_assigned", "on_revoked"],
    partitions: frozenset[TopicPartition],
    logger: Any,
) -> None:
    """Call ``listener``'s ``callback`` with ``partitions``; log (to ``logger``) what it raises."""
    if listener is None:
        return
    try:
        if callback == "on_assigned":
            await listener.on_assigned(partitions)
        else:
            await listener.on_revoked(partitions)
    except Exception:
        logger.exception(
            "rebalance listener failed", callback=callback, partitions=partition_names(partitions)
        )
