"""What an inventory source sees becomes, through the node decider, what the scheduler places on.

The scheduler leader diffs each observation of its inventory source against the folded nodes
(:func:`inventory_changes`) and sends the commands; once they are decided, the same observation
must ask for nothing more, and :func:`schedulable_inventory` must list exactly the observed nodes,
closed where the source or an operator cordons them. Admission then weighs jobs against that
inventory with every cordon lifted.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.allocator import Node
from ffdl.core.cluster import Admission
from ffdl.core.nodes import (
    Cordon,
    InventoryObservation,
    NodePresence,
    NodeRecord,
    decide_node,
    evolve_node,
    inventory_changes,
    schedulable_inventory,
    spec_of,
)
from ffdl.events import nodes as nd
from ffdl.events.envelope import NodeCommand, NodeCommandData
from ffdl.events.model import JobSpec

#: node-d is never in the folded records: the source reports it first
NODES = ("node-a", "node-b", "node-c", "node-d")
AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
COMMAND_IDS = uuid.UUID("9e7b51c2-4a0d-4f3e-8c1a-2d6f0b5e9a47")
LEADER_TOKEN = 7

gpu_counts = st.sampled_from((4, 8))
gpu_types = st.sampled_from(("a100", "h100"))
specs = st.builds(
    nd.NodeSpec, gpus=gpu_counts, gpu_type=gpu_types, cpus=st.just(64.0), memory_mb=st.just(262_144)
)
history_commands = st.one_of(
    st.builds(nd.ObserveNode, spec=specs, cordoned=st.booleans(), cordon_reason=st.just("kubectl cordon")),
    st.builds(nd.ReportNodeLost, reason=st.just("NotReady")),
    st.builds(nd.RemoveNode, reason=st.just("deleted")),
    st.builds(nd.CordonNode, reason=st.just("bad DIMM"), drain=st.booleans()),
    st.builds(nd.UncordonNode),
)


def decided(record: NodeRecord | None, command: NodeCommand) -> NodeRecord | None:
    """The record after ``command``, which must be accepted."""
    for event in decide_node(record, command, AT, leader_token=LEADER_TOKEN):
        assert not isinstance(event.data, nd.NodeCommandRejected), event.data
        record = evolve_node(record, event)
    return record


@st.composite
def folded_records(draw: st.DrawFn) -> dict[str, NodeRecord]:
    """Records of node-a..node-c as random histories of observations and operator requests left them
    (refusals included)."""
    records: dict[str, NodeRecord] = {}
    for name in NODES[:3]:
        record: NodeRecord | None = None
        for index, data in enumerate(draw(st.lists(history_commands, max_size=6), label=name)):
            if record is None and not isinstance(data, nd.ObserveNode):
                continue  # an unknown node takes only an observation
            command_id = uuid.uuid5(COMMAND_IDS, f"{name}:{index}")
            command = NodeCommand(command_id=command_id, node=name, issued_at=AT, producer="test", data=data)
            for event in decide_node(record, command, AT):
                record = evolve_node(record, event)
        if record is not None:
            records[name] = record
    return records


@st.composite
def observations(draw: st.DrawFn) -> InventoryObservation:
    """A source's view: each node ready, cordoned by the source, not ready (lost), both, or gone."""
    nodes: dict[str, Node] = {}
    lost: dict[str, str] = {}
    for name in NODES:
        fate = draw(st.sampled_from(("ready", "cordoned", "lost", "ready-and-lost", "gone")), label=name)
        if fate in ("ready", "cordoned", "ready-and-lost"):
            spec = draw(specs)
            nodes[name] = Node(
                name, spec.gpus, spec.gpu_type, spec.cpus, spec.memory_mb, schedulable=fate != "cordoned"
            )
        if fate in ("lost", "ready-and-lost"):
            lost[name] = "NotReady"
    return InventoryObservation(nodes=nodes, lost=lost, source="configuration")


def applied(
    records: Mapping[str, NodeRecord], changes: Mapping[str, NodeCommandData]
) -> dict[str, NodeRecord]:
    """The records once the scheduler leader's commands for ``changes`` are decided."""
    after = dict(records)
    for name, data in changes.items():
        command = NodeCommand(
            command_id=uuid.uuid5(COMMAND_IDS, f"change:{name}"),
            node=name,
            issued_at=AT,
            producer="scheduler",
            fencing_token=LEADER_TOKEN,
            data=data,
        )
        record = decided(records.get(name), command)
        assert record is not None
        after[name] = record
    return after


def operator_cordon(record: NodeRecord | None) -> Cordon | None:
    """The record's cordon if an operator put it there."""
    cordon = record.cordon if record else None
    return cordon if cordon and cordon.source is nd.CordonSource.OPERATOR else None


CHANGES = settings(max_examples=200, deadline=None)


@CHANGES
@given(records=folded_records(), seen=observations())
def test_deciding_the_changes_leaves_nothing_to_change(
    records: dict[str, NodeRecord], seen: InventoryObservation
) -> None:
    after = applied(records, inventory_changes(records, seen))

    assert inventory_changes(after, seen) == {}


@CHANGES
@given(records=folded_records(), seen=observations())
def test_the_log_follows_what_the_source_sees(
    records: dict[str, NodeRecord], seen: InventoryObservation
) -> None:
    after = applied(records, inventory_changes(records, seen))

    for name, node in seen.nodes.items():
        assert (after[name].presence, after[name].spec) == (NodePresence.PRESENT, spec_of(node))
    for name in seen.lost.keys() - seen.nodes.keys():
        before = records.get(name)
        if before is None:
            assert name not in after, "a node the log never had was recorded lost"
        elif before.presence is NodePresence.PRESENT:
            assert after[name].presence is NodePresence.LOST
        else:
            assert after[name] == before, f"a {before.presence} node changed on being reported lost"
    for name in records.keys() - seen.nodes.keys() - seen.lost.keys():
        assert (after[name].presence, after[name].cordon) == (NodePresence.REMOVED, None)
    for name in records.keys() & (seen.nodes.keys() | seen.lost.keys()):
        if operator_cordon(records[name]):
            assert after[name].cordon == records[name].cordon, "the source changed an operator's cordon"


@CHANGES
@given(records=folded_records(), seen=observations())
def test_the_scheduler_places_on_exactly_the_observed_nodes(
    records: dict[str, NodeRecord], seen: InventoryObservation
) -> None:
    after = applied(records, inventory_changes(records, seen))

    inventory = schedulable_inventory(after.values())

    assert [node.name for node in inventory] == sorted(seen.nodes)
    for node in inventory:
        by_operator = operator_cordon(records.get(node.name))
        assert node.schedulable is (seen.nodes[node.name].schedulable and by_operator is None)
        assert node.draining is (by_operator is not None and by_operator.drain)
        assert spec_of(node) == spec_of(seen.nodes[node.name])


def test_a_source_that_agrees_with_the_log_asks_for_nothing() -> None:
    seen = InventoryObservation(
        nodes={"node-a": Node("node-a", 8, "a100"), "node-b": Node("node-b", 4, "a100", schedulable=False)},
        lost={"node-c": "NotReady"},
    )
    records = applied({}, inventory_changes({}, seen))

    assert sorted(records) == ["node-a", "node-b"]
    assert inventory_changes(records, seen) == {}


# -- admission against the folded inventory ----------------------------------------------------


def _inventory(*history: tuple[str, NodeCommandData]) -> list[Node]:
    records: dict[str, NodeRecord] = {}
    for index, (name, data) in enumerate(history):
        command_id = uuid.uuid5(COMMAND_IDS, f"admission:{index}")
        command = NodeCommand(command_id=command_id, node=name, issued_at=AT, producer="test", data=data)
        record = decided(records.get(name), command)
        assert record is not None
        records[name] = record
    return schedulable_inventory(records.values())


BIG = nd.NodeSpec(gpus=8, gpu_type="a100", cpus=64.0, memory_mb=262_144)
SMALL = nd.NodeSpec(gpus=2, gpu_type="a100", cpus=64.0, memory_mb=262_144)


def _job(gpus: int) -> JobSpec:
    return JobSpec(name="train", command="python train.py", learners=1, gpus=gpus, gpu_type="a100")


def test_a_gang_that_fits_only_on_a_cordoned_node_waits_rather_than_being_rejected() -> None:
    inventory = _inventory(
        ("node-a", nd.ObserveNode(spec=BIG, cordoned=True, cordon_reason="kubectl cordon")),
        ("node-b", nd.ObserveNode(spec=BIG)),
        ("node-b", nd.CordonNode(reason="bad DIMM", drain=True)),
        ("node-c", nd.ObserveNode(spec=SMALL)),
    )
    assert [node.schedulable for node in inventory] == [False, False, True]

    assert Admission(inventory).why_never_fits(_job(gpus=8)) is None


def test_a_gang_bigger_than_any_node_is_rejected_naming_its_gpus() -> None:
    inventory = _inventory(("node-a", nd.ObserveNode(spec=BIG)), ("node-c", nd.ObserveNode(spec=SMALL)))

    reason = Admission(inventory).why_never_fits(_job(gpus=16))

    assert reason is not None
    assert "1 learner(s) x 16 GPU(s) of type a100" in reason
    assert "at most 8 matching GPUs on one node" in reason
