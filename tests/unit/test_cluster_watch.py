"""The owner's cluster view follows every partition of the events topic, and decodes only what it needs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import structlog

from ffdl.adapters.bus import open_bus
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyEvent
from ffdl.events.envelope import Event, NodeEvent
from ffdl.events.model import LearnerPlacement, Placement
from ffdl.handlers.cluster_watch import ClusterWatch
from ffdl.handlers.messaging import Topics, event_records
from ffdl.handlers.ports import OutgoingRecord

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
        assert [entry["event"] for entry in logs] == ["undecodable event skipped", "cluster view caught up"]
        assert logs[0]["partition"] == bus.partition_for("job-1")

        released = job_event("job-1", 5, ev.GpusReleased(placement=HELD))
        watch.apply(released)  # decided by this owner: in the view at once
        assert watch.view.holders == {}
        watch.reset()
        await watch.catch_up()  # the view again, from the log alone (the release never reached it)
        assert watch.view.holders == {("node-a", 0): "job-1", ("node-a", 1): "job-1"}
    finally:
        await bus.close()
