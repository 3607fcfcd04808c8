"""The inventory as aggregates: a node's state folded from its events, and its decider.

A node is decided like a job (architecture §5): its owner folds its events, checks each command
against that state (and the sender's fencing token) and appends what follows, numbered from the
node's ``seq`` with ids derived from the command's, so a redelivered command decides nothing new.

Two things are kept apart on a node: whether it is *present* (in the inventory, lost, removed)
and whether it is *cordoned* (by whom, and whether it is being drained). The inventory sources
report presence and their own cordon (:func:`inventory_changes` turns what a source sees into
the commands that bring the log in line); operators cordon, drain and uncordon. The scheduler
reads the result through :func:`schedulable_inventory`: present nodes, cordoned ones closed to new
learners, draining ones emptied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from ffdl.core.aggregate import (
    Address,
    AggregateKind,
    Decision,
    EventHead,
    EvolveError,
    UnknownAggregate,
    is_deposed,
    remember,
    seen,
)
from ffdl.core.allocator import Node
from ffdl.core.authorization import Senders, node_senders
from ffdl.events import nodes as nd
from ffdl.events.envelope import NodeCommand, NodeCommandData, NodeEvent, NodeEventData, node_key


class UnknownNode(UnknownAggregate):
    """A command for a node the inventory never had (other than an observation): a dead letter."""


class NodePresence(StrEnum):
    PRESENT = "PRESENT"  # in the inventory
    LOST = "LOST"  # unreachable or not ready: out of the inventory until it is observed again
    REMOVED = "REMOVED"  # taken out of the inventory


class NodeStatus(StrEnum):
    """What a node is, in one word, for listings: presence and cordon together."""

    READY = "READY"
    CORDONED = "CORDONED"
    DRAINING = "DRAINING"
    LOST = "LOST"
    REMOVED = "REMOVED"

    @property
    def present(self) -> bool:
        """In the inventory (its GPUs count), whether open to new learners or not."""
        return self not in (NodeStatus.LOST, NodeStatus.REMOVED)


@dataclass(frozen=True, slots=True)
class Cordon:
    reason: str
    source: nd.CordonSource
    drain: bool = False


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node as its events left it."""

    name: str
    seq: int
    spec: nd.NodeSpec
    presence: NodePresence
    since: datetime  # when presence or cordon last changed
    reason: str  # why they did
    cordon: Cordon | None = None
    recent_commands: tuple[int, ...] = field(default=(), repr=False)  # the ids' ints (``remember``)

    @property
    def status(self) -> NodeStatus:
        if self.presence is NodePresence.LOST:
            return NodeStatus.LOST
        if self.presence is NodePresence.REMOVED:
            return NodeStatus.REMOVED
        if self.cordon is None:
            return NodeStatus.READY
        return NodeStatus.DRAINING if self.cordon.drain else NodeStatus.CORDONED

    def inventory_node(self) -> Node:
        """The node as the scheduler places learners on it."""
        spec = self.spec
        return Node(
            self.name,
            spec.gpus,
            spec.gpu_type,
            spec.cpus,
            spec.memory_mb,
            schedulable=self.cordon is None,
            draining=self.cordon is not None and self.cordon.drain,
        )


def schedulable_inventory(records: Iterable[NodeRecord]) -> list[Node]:
    """The present nodes, by name: what the scheduler places on (cordoned ones closed to new learners)."""
    present = (record for record in records if record.presence is NodePresence.PRESENT)
    return [record.inventory_node() for record in sorted(present, key=lambda record: record.name)]


# -- evolve ---------------------------------------------------------------------------------------


def evolve_node(record: NodeRecord | None, event: NodeEvent) -> NodeRecord:
    """The node after ``event``; raises :class:`EvolveError` for an event that cannot follow."""
    data = event.data
    if record is not None and event.node != record.name:
        raise EvolveError(f"an event of node {event.node} cannot apply to node {record.name}")
    expected = record.seq + 1 if record else 1
    if event.seq != expected:
        raise EvolveError(f"node {event.node}: seq {event.seq} does not follow {expected - 1}")
    if record is None:
        if not isinstance(data, nd.NodeJoined):
            raise EvolveError(f"node {event.node} must begin with NodeJoined, not {event.type}")
        return NodeRecord(
            event.node, event.seq, data.spec, NodePresence.PRESENT, event.occurred_at, data.reason,
            recent_commands=remember((), event.causation_id),
        )  # fmt: skip
    recent = remember(record.recent_commands, event.causation_id)
    changed = _changed(record, data, event.node)
    if changed is None:
        return replace(record, seq=event.seq, recent_commands=recent)
    return replace(changed, seq=event.seq, since=event.occurred_at, recent_commands=recent)


def _changed(record: NodeRecord, data: NodeEventData, node: str) -> NodeRecord | None:
    """The node's new presence, cordon and reason after ``data`` (None: only its seq moves)."""
    present = record.presence is NodePresence.PRESENT
    match data:
        case nd.NodeJoined(spec=spec, reason=reason) if not present:
            return replace(record, spec=spec, presence=NodePresence.PRESENT, reason=reason)
        case nd.NodeResized(spec=spec) if present:
            return replace(record, spec=spec)
        case nd.NodeCordoned(reason=reason, source=source, drain=drain) if (
            record.presence is not NodePresence.REMOVED
        ):
            return replace(record, cordon=Cordon(reason, source, drain), reason=reason)
        case nd.NodeUncordoned(reason=reason) if record.cordon is not None:
            return replace(record, cordon=None, reason=reason)
        case nd.NodeLost(reason=reason) if present:
            return replace(record, presence=NodePresence.LOST, reason=reason)
        case nd.NodeRemoved(reason=reason) if record.presence is not NodePresence.REMOVED:
            return replace(record, presence=NodePresence.REMOVED, cordon=None, reason=reason)
        case nd.NodeCommandRejected():
            return None
    raise EvolveError(f"node {node}: {data.type_name()} cannot follow {record.status}")


# -- decide ---------------------------------------------------------------------------------------


#: The events decided so far for one command on a node, with the node as they leave it.
_NodeDecision = Decision[NodeRecord, NodeEvent, NodeCommand, NodeEventData]


def decide_node(
    record: NodeRecord | None,
    command: NodeCommand,
    now: datetime,
    *,
    producer: str = "decider",
    leader_token: int | None = None,
) -> list[NodeEvent]:
    """The events ``command`` causes on the node (``record`` None: the inventory never had it).

    Observations that change nothing decide nothing, so a source may repeat itself freely;
    ``leader_token`` refuses fenced commands of a deposed scheduler, as for jobs.
    """
    decision = _NodeDecision(NODES, command, now, producer, record)
    data = command.data
    deposed = is_deposed(command.fencing_token, None, leader_token)
    if record is None:
        if not isinstance(data, nd.ObserveNode):
            raise UnknownNode(f"no node {command.node} for {command.type}")
        if not deposed:  # a node's first event is its join: a deposed leader's is dropped unrecorded
            _observe(decision, data)
        return decision.events
    if seen(record, command.command_id):
        return []
    if deposed:
        decision.reject(f"fencing token {command.fencing_token} is not the leader's: sender was deposed")
    else:
        _decide(decision, record, data)
    return decision.events


def _decide(d: _NodeDecision, record: NodeRecord, data: NodeCommandData) -> None:
    present = record.presence is NodePresence.PRESENT
    removed = record.presence is NodePresence.REMOVED
    match data:
        case nd.ObserveNode():
            _observe(d, data)
        case nd.ReportNodeLost(reason=reason) if present:
            d.emit(nd.NodeLost(reason=reason))
        case nd.RemoveNode(reason=reason) if not removed:
            d.emit(nd.NodeRemoved(reason=reason))
        case nd.ReportNodeLost() | nd.RemoveNode():
            pass  # already out of the inventory: nothing changes
        case nd.CordonNode() if removed:
            d.reject(f"node {record.name} was removed from the inventory")
        case nd.CordonNode(reason=reason, drain=drain):
            # The operator's cordon replaces the inventory's (so it outlives the source lifting its
            # own) and only ever adds a drain to the operator's.
            cordon = record.cordon
            if cordon is None or cordon.source is nd.CordonSource.INVENTORY or (drain and not cordon.drain):
                d.emit(nd.NodeCordoned(reason=reason, source=nd.CordonSource.OPERATOR, drain=drain))
        case nd.UncordonNode() if (
            record.cordon is not None and record.cordon.source is nd.CordonSource.INVENTORY
        ):
            d.reject(
                f"node {record.name} is cordoned by its inventory ({record.cordon.reason}): lift it there"
            )
        case nd.UncordonNode(reason=reason) if record.cordon is not None:
            d.emit(nd.NodeUncordoned(reason=reason))
        case nd.UncordonNode():
            pass  # not cordoned: nothing to lift
        case _:
            d.reject(f"{data.type_name()} is not a node command this owner knows")


def _observe(d: _NodeDecision, data: nd.ObserveNode) -> None:
    record = d.state
    if record is None or record.presence is not NodePresence.PRESENT:
        d.emit(nd.NodeJoined(spec=data.spec, reason=data.reason))
    elif record.spec != data.spec:
        d.emit(nd.NodeResized(spec=data.spec, reason=data.reason))
    cordon = d.state.cordon if d.state else None
    if data.cordoned and cordon is None:
        d.emit(nd.NodeCordoned(reason=data.cordon_reason, source=nd.CordonSource.INVENTORY))
    elif not data.cordoned and cordon is not None and cordon.source is nd.CordonSource.INVENTORY:
        d.emit(nd.NodeUncordoned(reason="the inventory no longer cordons it"))


class NodeKind(AggregateKind[NodeRecord, NodeEvent, NodeCommand, NodeEventData]):
    """Nodes as an aggregate kind: keyed by ``node:<name>``, belonging to no tenant."""

    name = "node"
    id_field = "node"
    envelopes = (NodeEvent, NodeCommand)

    def identity(self, item: NodeEvent | NodeCommand) -> str:
        return item.node

    def key(self, identity: str) -> str:
        return node_key(identity)

    def senders(self, command: NodeCommand) -> Senders:
        return node_senders(command.data)

    def evolve(self, state: NodeRecord | None, event: NodeEvent) -> NodeRecord:
        return evolve_node(state, event)

    def decide(
        self,
        state: NodeRecord | None,
        command: NodeCommand,
        now: datetime,
        *,
        producer: str,
        leader_token: int | None,
    ) -> list[NodeEvent]:
        return decide_node(state, command, now, producer=producer, leader_token=leader_token)

    def event(
        self, command: NodeCommand, state: NodeRecord | None, head: EventHead, data: NodeEventData
    ) -> NodeEvent:
        return NodeEvent(**head, node=command.node, data=data)

    def rejection(self, command: NodeCommand, reason: str) -> NodeEventData:
        return nd.NodeCommandRejected(
            command_id=str(command.command_id), command_type=command.type, reason=reason
        )

    def address(self, node: str) -> Address[NodeCommand, NodeCommandData]:
        """Where a command for the node goes."""
        return Address(NodeCommand, {"node": node})


NODES = NodeKind()


# -- what an inventory source sees ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InventoryObservation:
    """What an inventory source sees now: its ready nodes (``schedulable`` False where the source
    itself cordons one) and, for nodes it has but cannot use (not ready), the reason."""

    nodes: Mapping[str, Node]
    lost: Mapping[str, str] = field(default_factory=dict)
    source: str = "inventory"


def spec_of(node: Node) -> nd.NodeSpec:
    return nd.NodeSpec(gpus=node.gpus, gpu_type=node.gpu_type, cpus=node.cpus, memory_mb=node.memory_mb)


def inventory_changes(
    records: Mapping[str, NodeRecord], seen: InventoryObservation
) -> dict[str, NodeCommandData]:
    """Per node, the observation that brings the log in line with what the source sees; empty when
    they agree. Deciding these commands and asking again gives nothing (a fixpoint)."""
    changes: dict[str, NodeCommandData] = {}
    for name, node in sorted(seen.nodes.items()):
        record = records.get(name)
        if record is None or _differs(record, node):
            changes[name] = nd.ObserveNode(
                spec=spec_of(node),
                cordoned=not node.schedulable,
                reason=f"seen by the {seen.source}",
                cordon_reason="" if node.schedulable else f"unschedulable in the {seen.source}",
            )
    for name, reason in sorted(seen.lost.items()):
        record = records.get(name)
        if name not in seen.nodes and record is not None and record.presence is NodePresence.PRESENT:
            changes[name] = nd.ReportNodeLost(reason=reason)
    for name, record in sorted(records.items()):
        gone = name not in seen.nodes and name not in seen.lost
        if gone and record.presence is not NodePresence.REMOVED:
            changes[name] = nd.RemoveNode(reason=f"no longer in the {seen.source}")
    return changes


def _differs(record: NodeRecord, node: Node) -> bool:
    if record.presence is not NodePresence.PRESENT or record.spec != spec_of(node):
        return True
    cordon = record.cordon
    if not node.schedulable:
        return cordon is None
    return cordon is not None and cordon.source is nd.CordonSource.INVENTORY
