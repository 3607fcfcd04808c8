"""Reading only what is needed: a role skips, undecoded, the records whose ``ce_type`` header names a
type its book does not fold (their offsets are committed all the same), decodes a record without the
header as before, and a process decodes the same record once however many of its roles read it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

from ffdl.core.aggregate import Applied, Kinds
from ffdl.core.kinds import JOBS, KINDS
from ffdl.events import nodes as nd
from ffdl.events.codec import DecodeError, event_to_json
from ffdl.handlers.messaging import event_records
from ffdl.handlers.ports import Bus, OutgoingRecord, Record
from ffdl.handlers.runtime import DecodedEvents, EventFollower, consume, event_types, record_type
from tests.job_history import submission

TOPIC = "ffdl.events"
GROUP = "readers"


class Recorder(EventFollower):
    """A role that notes the jobs whose events it was handed, and stops once it saw ``expected``."""

    def __init__(self, bus: Bus, kinds: Kinds, expected: int, stop: asyncio.Event) -> None:
        super().__init__(bus, TOPIC, kinds)
        self.handled: list[str] = []
        self.ready = asyncio.Event()
        self._expected = expected
        self._stop = stop

    async def loaded(self, partitions: list[int]) -> None:
        self.ready.set()

    async def policy(self, applied: Applied[Any, Any]) -> None:
        self.handled.append(applied.kind.identity(applied.event))
        if len(self.handled) == self._expected:
            self._stop.set()


def test_a_book_folds_the_event_types_of_its_kinds() -> None:
    jobs_only = event_types(Kinds(JOBS))
    every = event_types(KINDS)
    assert jobs_only is not None and every is not None
    assert "JobSubmitted" in jobs_only and "NodeJoined" not in jobs_only
    assert every == jobs_only | set(nd.NODE_EVENT_TYPES)


async def handled_by(role: Recorder, stop: asyncio.Event, bus: Bus, *records: OutgoingRecord) -> None:
    """Run ``role`` in its group until it handled what it expects; ``records`` are written once it
    joined, so the consume loop (not the fold on assignment) hands them to it."""
    running = asyncio.create_task(consume(bus, GROUP, [TOPIC], role, stop))
    await asyncio.wait_for(role.ready.wait(), 15)
    for record in records:
        await bus.publish(TOPIC, [record])
    await asyncio.wait_for(running, 15)


async def test_a_role_skips_undecoded_what_it_does_not_fold_and_commits_past_it(bus: Bus) -> None:
    stop = asyncio.Event()
    role = Recorder(bus, Kinds(JOBS), 2, stop)
    with structlog.testing.capture_logs() as logs:
        await handled_by(
            role,
            stop,
            bus,
            *event_records([submission("first")], "test"),
            # Garbage that says it is a node event: a role that folds jobs only never decodes it.
            OutgoingRecord("node:a", b"garbage", (("ce_type", b"io.ffdl.NodeJoined.v1"),)),
            # No header (an older producer): decoded, as before.
            OutgoingRecord("old", event_to_json(submission("old"))),
        )

    assert role.handled == ["first", "old"]
    assert [entry for entry in logs if entry["log_level"] == "error"] == []
    assert await bus.committed(GROUP, TOPIC) == {0: 3}


async def test_a_role_that_folds_the_type_decodes_it_and_says_when_it_cannot(bus: Bus) -> None:
    stop = asyncio.Event()
    role = Recorder(bus, KINDS, 1, stop)
    with structlog.testing.capture_logs() as logs:
        await handled_by(
            role,
            stop,
            bus,
            OutgoingRecord("node:a", b"garbage", (("ce_type", b"io.ffdl.NodeJoined.v1"),)),
            *event_records([submission("after")], "test"),
        )

    assert role.handled == ["after"]
    errors = [entry["event"] for entry in logs if entry["log_level"] == "error"]
    assert errors == ["undecodable event skipped"]


def test_the_type_comes_from_the_cloudevents_header() -> None:
    event = submission("a")
    record = event_records([event], "test")[0]
    assert dict(record.headers)["ce_type"] == f"io.ffdl.JobSubmitted.v{event.schema_version}".encode()
    assert record_type(Record(TOPIC, 0, 0, record.key, record.value, record.headers)) == "JobSubmitted"
    assert record_type(Record(TOPIC, 0, 0, record.key, record.value)) is None


def test_the_same_bytes_are_decoded_once_and_the_oldest_entry_goes_first() -> None:
    decoded = DecodedEvents(size=2)
    one, two, three = (event_to_json(submission(name)) for name in ("one", "two", "three"))

    first = decoded.decode(one)
    assert decoded.decode(bytes(one)) is first  # another reader's copy of the same record
    assert (decoded.hits, decoded.misses) == (1, 1)

    decoded.decode(two)
    decoded.decode(three)  # evicts "one"
    assert decoded.decode(one) is not first
    assert (decoded.hits, decoded.misses) == (1, 4)


def test_what_cannot_be_decoded_is_refused_every_time() -> None:
    decoded = DecodedEvents()
    for _ in range(2):
        with pytest.raises(DecodeError):
            decoded.decode(b"garbage")
    assert decoded.misses == 2


def test_what_a_writer_remembers_is_never_decoded() -> None:
    decoded = DecodedEvents()
    event = submission("written-here")
    value = event_to_json(event)

    decoded.remember(value, event)

    assert decoded.decode(bytes(value)) is event
    assert (decoded.hits, decoded.misses) == (1, 0)
