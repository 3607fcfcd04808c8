"""The inventory on the log: every node's joins, capacity changes, cordons, drains, losses and removals.

A node is an aggregate like a job: its commands and events are keyed by
:func:`~ffdl.events.envelope.node_key`, so one owner numbers and orders them. Observations come
from the inventory sources (the configuration, the Kubernetes nodes), sent by the scheduler
leader with its fencing token; cordon and uncordon come from operators (CLI, HTTP API).
A cordon records who put it there: the inventory's own cordon (a ``schedulable: false`` node in
the configuration, ``kubectl cordon``) is lifted when the inventory lifts it, an operator's only
by an operator.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from ffdl.events.envelope import NodeCommandData, NodeEventData
from ffdl.events.job_events import Reason
from ffdl.events.model import Frozen


class NodeSpec(Frozen):
    """What a node offers to learners."""

    gpus: Annotated[int, Field(ge=0, le=1024)]
    gpu_type: Annotated[str, Field(min_length=1, max_length=63)]
    cpus: Annotated[float, Field(gt=0)]
    memory_mb: Annotated[int, Field(gt=0)]


class CordonSource(StrEnum):
    OPERATOR = "operator"  # ffdl nodes cordon / drain, POST /v1/nodes/{name}:cordon
    INVENTORY = "inventory"  # the inventory source itself marks the node unschedulable


# -- events ---------------------------------------------------------------------------------------


class NodeJoined(NodeEventData):
    """The node is in the inventory: new, or back after it was lost or removed."""

    spec: NodeSpec
    reason: Reason = ""


class NodeResized(NodeEventData):
    """The inventory reports other capacity for the node (a GPU failed, allocatable changed)."""

    spec: NodeSpec
    reason: Reason = ""


class NodeCordoned(NodeEventData):
    """Nothing new is placed on the node; with ``drain`` its jobs are halted with a checkpoint and
    requeued to resume elsewhere. An operator's cordon replaces the inventory's; cordoning an
    operator-cordoned node again only ever adds ``drain``."""

    reason: Reason
    source: CordonSource
    drain: bool = False


class NodeUncordoned(NodeEventData):
    reason: Reason = ""


class NodeLost(NodeEventData):
    """The node is unreachable or not ready: out of the inventory, its jobs resume elsewhere."""

    reason: Reason


class NodeRemoved(NodeEventData):
    """The node left the inventory on purpose (taken out of the configuration, deleted)."""

    reason: Reason


class NodeCommandRejected(NodeEventData):
    """A node command that was illegal in the node's state: recorded, and processing moved on."""

    command_id: str
    command_type: str
    reason: Reason


NODE_EVENT_TYPES: dict[str, type[NodeEventData]] = {
    cls.type_name(): cls
    for cls in (
        NodeJoined,
        NodeResized,
        NodeCordoned,
        NodeUncordoned,
        NodeLost,
        NodeRemoved,
        NodeCommandRejected,
    )
}


# -- commands -------------------------------------------------------------------------------------


class ObserveNode(NodeCommandData):
    """An inventory source sees the node ready with ``spec``; ``cordoned``: the source itself
    marks it unschedulable, for ``cordon_reason``."""

    spec: NodeSpec
    cordoned: bool = False
    reason: Reason = ""
    cordon_reason: Reason = ""


class ReportNodeLost(NodeCommandData):
    reason: Reason


class RemoveNode(NodeCommandData):
    reason: Reason


class CordonNode(NodeCommandData):
    """An operator's request: place nothing new on the node (and with ``drain``, move its jobs off)."""

    reason: Reason
    drain: bool = False


class UncordonNode(NodeCommandData):
    """An operator's request to lift the operator's cordon (the inventory's is lifted at its source)."""

    reason: Reason = ""


NODE_COMMAND_TYPES: dict[str, type[NodeCommandData]] = {
    cls.type_name(): cls for cls in (ObserveNode, ReportNodeLost, RemoveNode, CordonNode, UncordonNode)
}
