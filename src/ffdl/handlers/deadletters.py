"""The dead-letter tally: records on the dead-letter topic, counted by the class of their reason.

The API role's process follows the topic (every second) so that one scrape of ``/metrics`` sees
the whole platform's dead letters, whichever process parked them. Reasons are free text; the
tally labels them by class, as the owner and the codec word them.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import structlog

from ffdl.handlers.aio import sleep_or_stop
from ffdl.handlers.messaging import DEAD_LETTER_REASON_HEADER
from ffdl.handlers.ports import Bus, BusUnavailable

log = structlog.get_logger(__name__)

#: Dead-letter reasons as ``events/codec.py`` and ``handlers/owner.py`` word them -> the reason's class.
_REASON_CLASSES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), label)
    for pattern, label in (
        (r"not JSON|not a JSON object|missing 'type'|'data' must be|'schema_version' must be", "undecodable"),
        (r"unknown type ", "unknown_type"),
        (r"no upcaster for |\S+ schema_version \d+ is newer than", "schema_version"),
        (r"invalid ", "invalid"),
        (r"record key .* is not the command's key", "wrong_key"),
        (r"wrong partition: ", "wrong_partition"),
        (r"no job ", "unknown_job"),
        (r"no node ", "unknown_node"),
        (r"bad ffdl_principal header: ", "bad_principal"),
        (r"\S+ from \S+ refused: ", "refused"),
        (r"internal error: ", "internal_error"),
    )
)


def reason_class(reason: str) -> str:
    """The class of a dead letter's reason, a label value of the metric ("other" when unknown)."""
    return next((label for pattern, label in _REASON_CLASSES if pattern.match(reason)), "other")


class DeadLetterTally:
    """Records on the dead-letter topic, by reason class, read from the topic (from its start)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._next_offsets: dict[int, int] = {}

    async def catch_up(self, bus: Bus, topic: str) -> None:
        """Count the records appended since the last call."""
        for partition, end in sorted((await bus.end_offsets(topic)).items()):
            start = self._next_offsets.get(partition, 0)
            if start >= end:
                continue
            async for record in bus.read(topic, partition, start, end):
                reason = dict(record.headers).get(DEAD_LETTER_REASON_HEADER, b"").decode(errors="replace")
                self.counts[reason_class(reason)] += 1
            self._next_offsets[partition] = end

    async def follow(self, bus: Bus, topic: str, stop: asyncio.Event, every_s: float = 1.0) -> None:
        """Catch up every ``every_s`` until ``stop``."""
        while not stop.is_set():
            try:
                await self.catch_up(bus, topic)
            except BusUnavailable as exc:
                log.warning("cannot count dead letters now", topic=topic, error=str(exc))
            await sleep_or_stop(stop, every_s)
