"""The dead-letter tally: records on the dead-letter topic, counted by the class of their reason,
and the refusals of the commands someone waits on.

The API role's process follows the topic (every second) so that one scrape of ``/metrics`` sees
the whole platform's dead letters, whichever process parked them. Reasons are free text; the
tally labels them by class, as the owner and the codec word them.

The API also learns from it that the owner dead-lettered a command it sent (a refusal that leaves no
event: architecture §3): it registers the command before sending it (:meth:`DeadLetterTally.awaiting`)
and, once the owners have committed past the command, has the tally read the topic to its end
(:meth:`DeadLetterTally.catch_up`). The owner parks a dead letter before it commits the command, so
the topic's end as read after that commit is past it. The tally keeps only the reasons of commands
registered and still waited on, and reads each record once for every waiter of its process.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import structlog

from ffdl.handlers.aio import sleep_or_stop
from ffdl.handlers.messaging import DEAD_LETTER_REASON_HEADER, DEAD_LETTER_TOPIC_HEADER
from ffdl.handlers.ports import Bus, BusUnavailable, Record

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
        (r"\S+ decided an event of \d+ bytes", "too_large"),
        (r"internal error: ", "internal_error"),
    )
)


def reason_class(reason: str) -> str:
    """The class of a dead letter's reason, a label value of the metric ("other" when unknown)."""
    return next((label for pattern, label in _REASON_CLASSES if pattern.match(reason)), "other")


@dataclass
class Awaited:
    """A command sent on ``topic`` under ``key`` whose dead letter someone waits to hear of:
    ``reason`` is its dead letter's, once the tally has read one."""

    command_id: str
    key: str
    topic: str
    reason: str | None = None

    def parked(self, record: Record, headers: dict[str, bytes]) -> bool:
        """Whether ``record`` (of the dead-letter topic) is this command, parked by its owner."""
        return (
            headers.get("ce_id") == self.command_id.encode()
            and headers.get(DEAD_LETTER_TOPIC_HEADER) == self.topic.encode()
            and record.key == self.key
        )


class DeadLetterTally:
    """Records on the dead-letter topic, by reason class, read from the topic (from its start); and
    the reasons of the commands awaited (:meth:`awaiting`)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._next_offsets: dict[int, int] = {}
        self._awaited: dict[str, Awaited] = {}
        # one reader at a time; the catch-ups begun, and the number of the last one that finished
        self._reading = asyncio.Lock()
        self._begun = 0
        self._finished = 0

    @contextmanager
    def awaiting(self, command_id: str, key: str, topic: str) -> Iterator[Awaited]:
        """Note the dead letter of the command ``command_id`` (sent on ``topic`` under ``key``) while
        the block runs: enter it before sending the command, so none is read unnoticed."""
        awaited = Awaited(command_id, key, topic)
        self._awaited[command_id] = awaited
        try:
            yield awaited
        finally:
            if self._awaited.get(command_id) is awaited:
                del self._awaited[command_id]

    async def catch_up(self, bus: Bus, topic: str) -> None:
        """Read the records appended before this call (once it returns, every record the topic held
        when it was called is counted, and matched to what is awaited). Concurrent calls share one
        reader: a read begun after a call covers it. Cancelling a call loses nothing: the position
        moves on with each record read."""
        asked = self._begun
        async with self._reading:
            if self._finished > asked:
                return  # a catch-up begun after this call has read the topic to where it ended then
            self._begun += 1
            number = self._begun
            for partition, end in sorted((await bus.end_offsets(topic)).items()):
                start = self._next_offsets.get(partition, 0)
                if start >= end:
                    continue
                async for record in bus.read(topic, partition, start, end):
                    self._read(record)
                    self._next_offsets[partition] = record.offset + 1
                self._next_offsets[partition] = end
            self._finished = number

    def _read(self, record: Record) -> None:
        headers = dict(record.headers)
        reason = headers.get(DEAD_LETTER_REASON_HEADER, b"").decode(errors="replace")
        self.counts[reason_class(reason)] += 1
        command_id = headers.get("ce_id")
        awaited = self._awaited.get(command_id.decode(errors="replace")) if command_id else None
        if awaited is not None and awaited.parked(record, headers):
            awaited.reason = reason

    async def follow(self, bus: Bus, topic: str, stop: asyncio.Event, every_s: float = 1.0) -> None:
        """Catch up every ``every_s`` until ``stop``."""
        while not stop.is_set():
            try:
                await self.catch_up(bus, topic)
            except BusUnavailable as exc:
                log.warning("cannot count dead letters now", topic=topic, error=str(exc))
            await sleep_or_stop(stop, every_s)
