"""A log of a job and a node together, decided by the real deciders, for the SRE tools' tests.

The node lives through everything the inventory can do to it: it joins, grows, is drained by an
operator and uncordoned, is cordoned by its inventory (so an operator's uncordon is rejected), is
lost and comes back. A job runs and completes on it meanwhile. Both owners run on one virtual clock
(:class:`tests.golden.record.Owner`'s); the events are merged by time and given the positions their
keys' partitions would give them, as an export writes them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ffdl.adapters.bus.partitioning import partition_for
from ffdl.adapters.log_files import write_log
from ffdl.core.nodes import NodeRecord, decide_node, evolve_node
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyEvent
from ffdl.events.envelope import NodeCommand, NodeCommandData, NodeEvent
from ffdl.projections.store import LoggedEvent
from tests.golden.record import EVENTS_TOPIC, OWNER, PARTITIONS, SCHEDULER, START, JobScript, Owner, spec

NODE = "gpu-node-01"
JOB = "mnist-0n0d"
SMALL = nd.NodeSpec(gpus=4, gpu_type="a100", cpus=64, memory_mb=262_144)
LARGE = nd.NodeSpec(gpus=8, gpu_type="a100", cpus=64, memory_mb=262_144)
OPERATOR = "api@ffdl-0 (sre)"
_NAMESPACE = uuid.UUID("5f0c1f36-8a57-4d3b-9a53-2a0c8f3de7a1")


@dataclass
class NodeOwner:
    """The owner of one node's key: decides each command on the folded node, at the shared clock."""

    owner: Owner
    name: str
    record: NodeRecord | None = None
    events: list[NodeEvent] = field(default_factory=list)
    _sent: int = 0

    def send(
        self, data: NodeCommandData, sender: str, token: int | None = None, after_s: float = 1.0
    ) -> list[NodeEvent]:
        self.owner.tick(after_s)
        self._sent += 1
        command = NodeCommand(
            command_id=uuid.uuid5(_NAMESPACE, f"{self.name}/{self._sent}"),
            node=self.name,
            issued_at=self.owner.now,
            producer=sender,
            fencing_token=token,
            data=data,
        )
        leader = self.owner.leader_token if token is not None else None
        decided = decide_node(self.record, command, self.owner.now, producer=OWNER, leader_token=leader)
        for event in decided:
            self.record = evolve_node(self.record, event)
        self.events.extend(decided)
        return decided

    def observe(self, spec: nd.NodeSpec, *, cordoned: bool = False) -> list[NodeEvent]:
        data = nd.ObserveNode(
            spec=spec,
            cordoned=cordoned,
            reason="seen by the configuration",
            cordon_reason="unschedulable in the configuration" if cordoned else "",
        )
        return self.send(data, SCHEDULER, self.owner.leader_token)


def node_and_job_events() -> list[AnyEvent]:
    """The whole story, merged by time (the node's events first where a job's share their instant)."""
    owner = Owner("node-history", START)
    owner.leader_token = 1
    node = NodeOwner(owner, NODE)
    node.observe(SMALL)
    job = JobScript(owner, JOB, "acme", spec("mnist"), nodes=(NODE,))
    job.queue_and_run(token=1)
    job.train(40)
    node.observe(LARGE)  # NodeResized
    job.complete()
    node.send(nd.CordonNode(reason="disk failing", drain=True), OPERATOR)
    node.send(nd.UncordonNode(reason="disk replaced"), OPERATOR)
    node.observe(LARGE, cordoned=True)  # the inventory's own cordon
    node.send(nd.UncordonNode(reason="try anyway"), OPERATOR)  # rejected: lift it at the source
    node.send(nd.ReportNodeLost(reason="kubelet stopped posting status"), SCHEDULER, 1, after_s=60.0)
    node.observe(LARGE)  # back: NodeJoined, and the inventory's cordon is lifted
    return sorted([*node.events, *owner.events], key=lambda event: event.occurred_at)


def positioned(events: Iterable[AnyEvent], partitions: int = PARTITIONS) -> Iterator[LoggedEvent]:
    """Events in log order, each at the offset its key's partition would give it."""
    next_offset: dict[int, int] = {}
    for event in events:
        partition = partition_for(event.key, partitions)
        offset = next_offset.get(partition, 0)
        next_offset[partition] = offset + 1
        yield LoggedEvent(event, partition, offset)


def write_node_history(path: Path) -> list[LoggedEvent]:
    """Write the story to ``path`` as an exported log, in the order an export of a bus holding it
    writes (by time, then partition and offset); returns its events as written."""
    logged = sorted(
        positioned(node_and_job_events()), key=lambda e: (e.event.occurred_at, e.partition, e.offset)
    )
    with path.open("w", encoding="utf-8") as out:
        write_log(logged, out, EVENTS_TOPIC)
    return logged
