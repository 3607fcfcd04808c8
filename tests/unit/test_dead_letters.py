"""A dead letter always fits the log, whatever the record it parks: a key near the record limit, a
reason that quotes it. One the log refused raised out of the owner's (or the relay's) processing,
uncommitted; restarted, the role met the same record again, for ever, and the partition stalled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from ffdl.adapters.election import FileElection
from ffdl.events.job_events import QUOTE_MAX, REASON_MAX
from ffdl.handlers.deadletters import DeadLetterTally, reason_class
from ffdl.handlers.messaging import (
    DEAD_LETTER_REASON_HEADER,
    PARKED_KEY_CHARS,
    PRINCIPAL_HEADER,
    Topics,
    dead_letter,
)
from ffdl.handlers.owner import JobOwner
from ffdl.handlers.ports import MAX_RECORD_BYTES, Bus, Record
from tests.services import wait_until_async

TOPICS = Topics()
AS_TENANT = ((PRINCIPAL_HEADER, b"tenant:acme"),)


def command(job_id: str, type_: str = "CancelJob", data: dict[str, object] | None = None) -> bytes:
    """A tenant's command to ``job_id``, as JSON."""
    body = {
        "type": type_,
        "command_id": str(uuid.uuid4()),
        "job_id": job_id,
        "tenant": "acme",
        "issued_at": "2026-01-01T00:00:00Z",
        "producer": "svc",
        "data": data or {},
    }
    return json.dumps(body).encode()


async def parked(bus: Bus) -> list[Record]:
    return [record async for record in bus.read(TOPICS.deadletter, 0)]


def reason(record: Record) -> str:
    return dict(record.headers)[DEAD_LETTER_REASON_HEADER].decode()


async def test_a_command_under_a_key_of_a_megabyte_is_parked_whole_with_a_reason_quoting_its_head(
    bus: Bus, tmp_path: Path
) -> None:
    """The owner's "wrong key" reason quoted the whole key: with the key itself, twice the limit."""
    owner = JobOwner(bus, TOPICS, FileElection(tmp_path / "election"))
    key = "j" * 600_000
    submit = command("job-after", "SubmitJob", {"spec": {"name": "j", "command": "true"}})
    records = [
        Record(TOPICS.commands, 0, 0, key, command("x"), AS_TENANT),
        Record(TOPICS.commands, 0, 1, "job-after", submit, AS_TENANT),
    ]

    await owner.process(records)

    assert "job-after" in owner.book.jobs, "the command behind it was decided"
    [record] = await parked(bus)
    assert (record.key, record.value) == (key, records[0].value)
    assert len(reason(record)) < QUOTE_MAX + 100
    assert reason(record).startswith("record key 'jjj")
    assert reason_class(reason(record)) == "wrong_key"


async def test_a_record_whose_key_leaves_no_room_for_its_reason_is_parked_as_the_heads_of_key_and_value(
    bus: Bus, tmp_path: Path
) -> None:
    owner = JobOwner(bus, TOPICS, FileElection(tmp_path / "election"))
    key = "k" * (MAX_RECORD_BYTES - 300)
    record = Record(TOPICS.commands, 0, 0, key, command("x"), AS_TENANT)

    await owner.process([record])

    [dead] = await parked(bus)
    headers = dict(dead.headers)
    assert (dead.key, dead.value) == (key[:PARKED_KEY_CHARS], record.value)
    assert headers["ffdl_dlq_key_truncated_from"] == str(len(key)).encode()
    assert headers["ffdl_dlq_truncated_from"] == str(len(record.value)).encode()
    assert reason_class(reason(dead)) == "wrong_key"
    assert PRINCIPAL_HEADER not in headers


async def test_a_reason_longer_than_the_record_limit_is_parked_cut_to_a_reasons_length(bus: Bus) -> None:
    """A reason may quote what the record holds (an exception's text, say): it is no record of its own."""
    record = Record(TOPICS.commands, 0, 7, "job-1", b"{}")

    await dead_letter(bus, TOPICS, record, "internal error: " + "e" * (2 * MAX_RECORD_BYTES))

    [dead] = await parked(bus)
    assert (dead.key, dead.value) == ("job-1", b"{}")
    assert len(reason(dead)) == REASON_MAX
    assert reason(dead).startswith("internal error: eee") and reason(dead).endswith("\u2026")


async def test_a_parked_head_keeps_the_commands_id_when_it_is_short(bus: Bus, tmp_path: Path) -> None:
    """The API finds the refusal of a command it sent by the command's id (``ce_id``): a head kept
    none of the record's headers, so a refusal of a command near the record limit went unnoticed. A
    forged id too long to keep is left out, and the head still fits."""
    key = "k" * (MAX_RECORD_BYTES - 300)
    command_id = str(uuid.uuid4()).encode()
    for ce_id in (command_id, b"x" * 600_000):
        record = Record(TOPICS.commands, 0, 0, key, command("x"), (("ce_id", ce_id),))
        await dead_letter(bus, TOPICS, record, "wrong key")
    short, long = await parked(bus)
    assert dict(short.headers)["ce_id"] == command_id
    assert "ce_id" not in dict(long.headers)
    assert "ffdl_dlq_truncated_from" in dict(long.headers)


def sent(command_id: str, key: str = "job-1", topic: str = TOPICS.commands, offset: int = 0) -> Record:
    return Record(topic, 0, offset, key, b"{}", (("ce_id", command_id.encode()),))


async def test_the_tally_tells_an_awaited_command_its_refusal_and_keeps_nothing_else(bus: Bus) -> None:
    tally = DeadLetterTally()
    command_id = str(uuid.uuid4())
    with tally.awaiting(command_id, "job-1", TOPICS.commands) as awaited:
        await dead_letter(bus, TOPICS, sent(command_id, topic=TOPICS.events), "an event parked")
        await dead_letter(bus, TOPICS, sent(command_id, key="job-2"), "another key")
        await dead_letter(bus, TOPICS, sent(str(uuid.uuid4())), "another command")
        await tally.catch_up(bus, TOPICS.deadletter)
        assert awaited.reason is None
        await dead_letter(bus, TOPICS, sent(command_id), "SubmitJob from tenant:acme refused: no")
        await tally.catch_up(bus, TOPICS.deadletter)
        assert awaited.reason == "SubmitJob from tenant:acme refused: no"
    later = str(uuid.uuid4())
    with tally.awaiting(later, "job-1", TOPICS.commands) as gone:
        pass
    await dead_letter(bus, TOPICS, sent(later), "after the wait")
    await tally.catch_up(bus, TOPICS.deadletter)
    assert gone.reason is None  # no longer awaited: not kept
    assert sum(tally.counts.values()) == 5


class Held:
    """A bus whose reads of the dead-letter topic stop after each record until ``go`` is set."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.go = asyncio.Event()
        self.reads = 0

    async def end_offsets(self, topic: str) -> dict[int, int]:
        return await self.bus.end_offsets(topic)

    async def read(
        self, topic: str, partition: int, start: int = 0, end: int | None = None
    ) -> AsyncIterator[Record]:
        self.reads += 1
        async for record in self.bus.read(topic, partition, start, end):
            yield record
            await self.go.wait()


async def test_catch_ups_at_once_read_each_record_once_and_a_cancelled_one_loses_nothing(bus: Bus) -> None:
    """Each write of the API catches the tally up once the owners decided its command: many at once
    share one read, and one cancelled (its request gave up) neither loses nor counts twice."""
    tally = DeadLetterTally()
    held = Held(bus)
    for offset in range(3):
        await dead_letter(bus, TOPICS, sent(str(uuid.uuid4()), offset=offset), "no job job-1")
    first = asyncio.create_task(tally.catch_up(held, TOPICS.deadletter))  # type: ignore[arg-type]
    await wait_until_async(lambda: tally.counts["unknown_job"] == 1, 5, what="the first record read")
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    held.go.set()
    waiters = [asyncio.create_task(tally.catch_up(held, TOPICS.deadletter)) for _ in range(20)]  # type: ignore[arg-type]
    await asyncio.gather(*waiters)
    assert tally.counts["unknown_job"] == 3
    assert held.reads <= 3  # the cancelled read, then one or two for the twenty
