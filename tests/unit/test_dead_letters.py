"""A dead letter always fits the log, whatever the record it parks: a key near the record limit, a
reason that quotes it. One the log refused raised out of the owner's (or the relay's) processing,
uncommitted; restarted, the role met the same record again, for ever, and the partition stalled."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from ffdl.adapters.election import FileElection
from ffdl.events.job_events import QUOTE_MAX, REASON_MAX
from ffdl.handlers.deadletters import reason_class
from ffdl.handlers.messaging import (
    DEAD_LETTER_REASON_HEADER,
    PARKED_KEY_CHARS,
    PRINCIPAL_HEADER,
    Topics,
    dead_letter,
)
from ffdl.handlers.owner import JobOwner
from ffdl.handlers.ports import MAX_RECORD_BYTES, Bus, Record

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
