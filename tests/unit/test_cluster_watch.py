"""The owner's cluster view follows every partition of the events topic, decodes only what it needs,
and never keeps what a failed batch decided."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import structlog

from ffdl.adapters.bus import open_bus
from ffdl.adapters.election import FileElection
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyEvent, command_to_json
from ffdl.events.envelope import Command, Event, NodeEvent
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.events.position import Position
from ffdl.handlers.cluster_watch import ClusterWatch
from ffdl.handlers.messaging import PRINCIPAL_HEADER, Topics, event_records
from ffdl.handlers.owner import SCHEDULER_ROLE, JobOwner
from ffdl.handlers.ports import Bus, BusUnavailable, OutgoingRecord, Record, TopicPartition

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = nd.NodeSpec(gpus=4, gpu_type="a100", cpus=8.0, memory_mb=1024)
HELD = Placement(learners=(LearnerPlacement(rank=0, node="node-a", gpus=(0, 1), gpu_type="a100"),))


def job_event(job_id: str, seq: int, data: ev.EventData) -> Event:
    return Event(
        event_id=uuid.uuid4(), seq=seq, occurred_at=NOW, producer="o", job_id=job_id, tenant="t", data=data
    )


async def test_the_view_catches_up_with_every_partition_and_skips_what_it_does_not_fold(
    tmp_path: Path,
) -> None:
    bus = open_bus(f"embedded://{tmp_path}", 4)
    await bus.start()
    topics = Topics()
    joined = NodeEvent(
        event_id=uuid.uuid4(),
        seq=1,
        occurred_at=NOW,
        producer="o",
        node="node-a",
        data=nd.NodeJoined(spec=SPEC),
    )
    events: list[AnyEvent] = [
        joined,
        job_event("job-1", 4, ev.GpusAllocated(placement=HELD)),
        job_event("job-2", 1, ev.JobQueued()),
    ]
    watch = ClusterWatch(bus, topics.events)
    try:
        await bus.publish(topics.events, event_records(events, "o"))
        # Not decoded: its type is none the view folds. Decoded, and skipped: it claims to be one.
        noise = (("ce_type", b"io.ffdl.LearnerProgressed.v1"),)
        claims = (("ce_type", b"io.ffdl.GpusReleased.v1"),)
        await bus.publish(
            topics.events,
            [OutgoingRecord("job-3", b"garbage", noise), OutgoingRecord("job-1", b"garbage", claims)],
        )
        with structlog.testing.capture_logs() as logs:
            await watch.catch_up()
            await watch.catch_up()  # nothing new: nothing read again

        assert watch.view.nodes["node-a"].spec == SPEC
        assert watch.view.holders == {("node-a", 0): "job-1", ("node-a", 1): "job-1"}
        # Once only: the second catch-up read nothing again. (Debug lines are left out: whether they
        # are emitted depends on the logging an earlier test of the session configured.)
        warnings = [entry for entry in logs if entry["log_level"] != "debug"]
        assert [entry["event"] for entry in warnings] == ["undecodable event skipped"]
        assert warnings[0]["partition"] == bus.partition_for("job-1")

        released = job_event("job-1", 5, ev.GpusReleased(placement=HELD))
        watch.apply(released)  # decided by this owner: in the view at once
        assert watch.view.holders == {}
        watch.reset()
        await watch.catch_up()  # the view again, from the log alone (the release never reached it)
        assert watch.view.holders == {("node-a", 0): "job-1", ("node-a", 1): "job-1"}
    finally:
        await bus.close()


class FlakyBus:
    """The embedded log, whose appends to ``topic`` fail while ``failing``."""

    def __init__(self, bus: Bus, topic: str) -> None:
        self._bus = bus
        self._topic = topic
        self.failing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        if self.failing and topic == self._topic:
            raise BusUnavailable("the log is away")
        return await self._bus.publish(topic, records)


async def test_an_owner_whose_batch_fails_forgets_its_view_and_the_redelivery_decides_again(
    tmp_path: Path,
) -> None:
    log = open_bus(f"embedded://{tmp_path / 'log'}", 2)
    await log.start()
    topics = Topics()
    bus = FlakyBus(log, topics.events)
    election = FileElection(tmp_path / "election")
    token = await election.campaign(SCHEDULER_ROLE)
    queued = [
        job_event("job-1", 1, ev.JobSubmitted(spec=JobSpec(name="j", command="train", gpus=2))),
        job_event("job-1", 2, ev.JobAccepted()),
        job_event("job-1", 3, ev.JobQueued()),
    ]
    joined = NodeEvent(
        event_id=uuid.uuid4(),
        seq=1,
        occurred_at=NOW,
        producer="o",
        node="node-a",
        data=nd.NodeJoined(spec=SPEC),
    )
    owner = JobOwner(cast(Bus, bus), topics, election)
    allocate = Command(
        command_id=uuid.uuid4(),
        job_id="job-1",
        tenant="t",
        issued_at=NOW,
        producer="scheduler@test",
        fencing_token=token,
        data=cmd.AllocateGpus(placement=HELD),
    )
    partition = log.partition_for("job-1")
    record = Record(
        topics.commands, partition, 0, "job-1", command_to_json(allocate), ((PRINCIPAL_HEADER, b"scheduler"),)
    )
    try:
        await log.publish(topics.events, event_records([joined, *queued], "o"))
        await owner.on_assigned(frozenset(TopicPartition(topics.commands, p) for p in range(2)))
        bus.failing = True
        await owner.process([record])  # decided: its events wait for the fetch's one append
        with pytest.raises(BusUnavailable):
            await owner.flush()
        forgotten = (dict(owner.cluster.view.holders), dict(owner.cluster.view.nodes))
        await owner.on_assigned(
            frozenset(TopicPartition(topics.commands, p) for p in range(2))
        )  # the role restarts
        bus.failing = False
        await owner.process([record])  # redelivered
        await owner.flush()
    finally:
        await election.close()
        await log.close()

    assert forgotten == ({}, {})
    assert owner.cluster.view.holders == {("node-a", 0): "job-1", ("node-a", 1): "job-1"}
    assert owner.book.jobs["job-1"].placement == HELD
