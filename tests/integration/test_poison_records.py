"""Poison records never stall a partition or crash a role, on the embedded log and on Kafka (tansu).

Records no role can handle are written straight onto the commands and the events topics, on the
partition of the job that an honest client then submits: JSON nested thousands of levels deep (the
parser's own recursion limit), nested just past the codec's limit, valid JSON of the wrong types, an
event for a learner rank the job does not have, and an event with a seq already taken. Every role
(owner, reactor, scheduler, projector) must go on: the honest job still runs to COMPLETED on that
very partition, the commands are dead-lettered with their reason, and the projector parks the
events it cannot decode. The events topic is written by owners only; these records stand for a
broken or hostile writer, which is why readers must survive them.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ffdl.adapters.bus import open_bus
from ffdl.core.aggregate import Skipped, fold_step
from ffdl.core.authorization import Principal
from ffdl.core.kinds import JOBS
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import (
    MAX_DEPTH,
    DecodeError,
    any_command_from_json,
    any_event_from_json,
    command_to_json,
    event_to_json,
)
from ffdl.events.envelope import Command, Event
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.events.position import Position
from ffdl.handlers.messaging import PARKED_HEAD_BYTES, PRINCIPAL_HEADER, Topics, dead_letter
from ffdl.handlers.ports import OutgoingRecord, Record, RecordTooLarge
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import FAST_KAFKA, Api, bus_under_test, fast_settings
from tests.job_history import submission
from tests.services import TansuBroker, wait_until_async

pytestmark = pytest.mark.integration

AS_TENANT = ((PRINCIPAL_HEADER, b"tenant:default"),)
AT = datetime(2026, 1, 1, tzinfo=UTC)


def nested(levels: int) -> bytes:
    """A command whose payload nests ``levels`` deep."""
    return ('{"type": "SubmitJob", "data": ' + '{"a": ' * levels + "1" + "}" * levels + "}").encode()


def submitted(job_id: str) -> Event:
    return submission(job_id, AT)


def test_the_codec_refuses_deep_nesting_with_a_reason_instead_of_raising_anything_else() -> None:
    for levels in (MAX_DEPTH + 1, 100_000):
        with pytest.raises(DecodeError, match="nested deeper than"):
            any_command_from_json(nested(levels))
        with pytest.raises(DecodeError, match="nested deeper than"):
            any_event_from_json(nested(levels))


@pytest.mark.parametrize("type_value", [["SubmitJob"], {"a": 1}, 7])
def test_a_type_that_is_no_string_is_refused_with_a_reason(type_value: object) -> None:
    record = json.dumps({"type": type_value, "data": {}})
    with pytest.raises(DecodeError, match="'type' must be a string"):
        any_command_from_json(record)
    with pytest.raises(DecodeError, match="'type' must be a string"):
        any_event_from_json(record)


def test_an_event_for_a_rank_the_job_does_not_have_is_skipped_by_the_fold_not_raised() -> None:
    first = submitted("job-r")
    placement = Placement(learners=(LearnerPlacement(rank=0, node="node-a", gpus=(0,)),))
    history = [
        ev.JobAccepted(),
        ev.JobQueued(reason="waiting for GPUs"),
        ev.GpusAllocated(placement=placement, reason="fits"),
        ev.JobLaunching(attempt=1),
    ]
    job = JOBS.evolve(None, first)
    for seq, data in enumerate(history, start=2):
        job = JOBS.evolve(job, first.model_copy(update={"seq": seq, "data": data}))
    assert job.state is JobState.LAUNCHING
    poison = first.model_copy(update={"seq": 6, "data": ev.LearnerProgressed(rank=99, attempt=1, step=1)})
    skipped = fold_step(JOBS, job, poison)
    assert isinstance(skipped, Skipped)
    assert "no learner of rank 99" in skipped.detail


@pytest.fixture(params=["embedded", "kafka"])
async def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return fast_settings(tmp_path / "ffdl", launcher="instant", **bus_under_test(request))


async def parked(platform: Platform) -> list[Record]:
    return [
        record
        for partition in range(platform.bus.partitions)
        async for record in platform.bus.read(platform.topics.deadletter, partition)
    ]


async def test_poison_on_the_commands_and_events_topics_leaves_every_role_running(
    api: Api, platform: Platform
) -> None:
    job_id = f"steady-{uuid.uuid4().hex[:8]}"
    topics = platform.topics
    honest = Command(
        command_id=uuid.uuid4(),
        job_id=job_id,
        tenant="default",
        issued_at=AT,
        producer="test",
        data=cmd.SubmitJob(spec=JobSpec(name="steady", command="true", learners=1, gpus=1)),
    )
    submit = json.loads(command_to_json(honest))
    wrong_types = json.dumps({**submit, "data": {"spec": {"name": ["not", "a", "name"]}}}).encode()
    # Poison commands, on the partition of the job submitted below.
    await platform.bus.publish(
        topics.commands,
        [
            OutgoingRecord(job_id, nested(100_000), AS_TENANT),
            OutgoingRecord(job_id, nested(MAX_DEPTH + 1), AS_TENANT),
            OutgoingRecord(job_id, wrong_types, AS_TENANT),
        ],
    )
    # Poison events on the same partition: undecodable ones, and a decodable one that cannot apply.
    other = f"ghost-{uuid.uuid4().hex[:8]}"
    ghost = submitted(other).model_copy(update={"job_id": job_id, "seq": 7})  # a gap: seq 7 of nothing
    await platform.bus.publish(
        topics.events,
        [
            OutgoingRecord(job_id, nested(100_000)),
            OutgoingRecord(job_id, b"\xff not JSON at all"),
            OutgoingRecord(job_id, event_to_json(ghost)),
        ],
    )
    # The partition keeps moving: an honest submission on it runs to COMPLETED.
    await platform.sender.send(honest, principal=Principal.tenant("default"))

    async def projected() -> bool:
        return (await api.http.get(f"/v1/jobs/{job_id}")).status_code == 200

    await wait_until_async(projected, 30, interval_s=0.1, what="the honest job projected")
    await api.wait(job_id, "COMPLETED", released=True)

    records: list[Record] = []

    async def all_parked() -> bool:
        records[:] = await parked(platform)
        return len(records) >= 5

    await wait_until_async(all_parked, 30, interval_s=0.2, what="the poison records dead-lettered")
    reasons = sorted(dict(record.headers)["ffdl_dlq_reason"].decode() for record in records)
    assert sum("nested deeper than" in reason for reason in reasons) == 3  # two commands, one event
    assert any(reason.startswith("invalid SubmitJob") for reason in reasons)
    assert any(reason.startswith("not JSON") for reason in reasons)


class SizeLimited:
    """A log that refuses records over ``limit`` bytes, as a broker does."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parked: list[OutgoingRecord] = []

    async def publish(self, topic: str, records: list[OutgoingRecord]) -> list[Position]:
        for record in records:
            size = len(record.value) + sum(len(k) + len(v) for k, v in record.headers)
            if size > self.limit:
                raise RecordTooLarge(f"{size} bytes")
        self.parked.extend(records)
        return [Position(topic, 0, offset) for offset, _ in enumerate(records)]


async def test_a_record_too_large_to_park_whole_is_parked_as_its_head_with_its_reason() -> None:
    log = SizeLimited(200 * 1024)
    huge = Record("ffdl.commands", 3, 41, "job-x", b"x" * (200 * 1024), (("big", b"y" * 1000),))

    await dead_letter(log, Topics(), huge, "not JSON: a very long record")  # type: ignore[arg-type]

    [parked] = log.parked
    headers = dict(parked.headers)
    assert parked.value == huge.value[:PARKED_HEAD_BYTES]
    assert headers["ffdl_dlq_reason"] == b"not JSON: a very long record"
    assert headers["ffdl_dlq_truncated_from"] == str(200 * 1024).encode()
    assert (headers["ffdl_dlq_topic"], headers["ffdl_dlq_offset"]) == (b"ffdl.commands", b"41")
    assert "big" not in headers


async def test_the_kafka_bus_refuses_an_over_size_record_as_too_large_not_as_a_kafka_error(
    broker: TansuBroker,
) -> None:
    bus = open_bus(broker.url, 1, kafka=FAST_KAFKA, topics=("oversize",))
    await bus.start()
    try:
        with pytest.raises(RecordTooLarge):
            await bus.publish("oversize", [OutgoingRecord("k", b"x" * (2 * 1024 * 1024))])
    finally:
        await bus.close()
