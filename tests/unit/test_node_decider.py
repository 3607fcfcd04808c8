"""The node decider keeps the inventory's log consistent whatever sequence of commands reaches it.

A node is an aggregate like a job: its owner decides observations (from the scheduler leader, fenced)
and operator requests (cordon, drain, uncordon) against the folded record. A random walk over those
commands, with redeliveries and deposed senders, must keep every node's log numbered, foldable and
idempotent, keep operator and inventory cordons apart, and never cordon a removed node. The node
records also travel on the wire: every node event and command must round-trip through the codec.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from ffdl.core.aggregate import COMMAND_WINDOW, EvolveError
from ffdl.core.nodes import (
    Cordon,
    NodePresence,
    NodeRecord,
    NodeStatus,
    UnknownNode,
    decide_node,
    evolve_node,
    schedulable_inventory,
)
from ffdl.events import nodes as nd
from ffdl.events.codec import (
    DecodeError,
    any_command_from_json,
    any_event_from_dict,
    any_event_from_json,
    cloudevent_headers,
    command_from_json,
    command_to_json,
    event_from_json,
    event_to_dict,
    event_to_json,
)
from ffdl.events.envelope import NodeCommand, NodeCommandData, NodeEvent, NodeEventData
from ffdl.events.job_events import REASON_MAX

NODES = ("node-a", "node-b", "node-c")
START = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
COMMAND_IDS = uuid.UUID("3c1d9a57-0f7e-4b8a-9d62-5e4b1f0a7c21")
PRODUCER = "node-property-test"

node_names = st.sampled_from(NODES)
#: few specs, so that observations often repeat a node's spec and sometimes change it
node_specs = st.sampled_from(
    (
        nd.NodeSpec(gpus=8, gpu_type="a100", cpus=64.0, memory_mb=262_144),
        nd.NodeSpec(gpus=7, gpu_type="a100", cpus=64.0, memory_mb=262_144),
        nd.NodeSpec(gpus=8, gpu_type="h100", cpus=96.0, memory_mb=524_288),
        nd.NodeSpec(gpus=0, gpu_type="cpu", cpus=16.0, memory_mb=65_536),
    )
)
reasons = st.sampled_from(("", "maintenance", "kernel upgrade"))
#: who sends a command: an operator (unfenced), the scheduler leader, or a deposed scheduler
senders = st.sampled_from(("operator", "leader", "leader", "deposed"))


def fold(record: NodeRecord | None, events: list[NodeEvent]) -> NodeRecord | None:
    for event in events:
        record = evolve_node(record, event)
    return record


def node_command(
    node: str, data: NodeCommandData, *, token: int | None = None, command_id: uuid.UUID | None = None
) -> NodeCommand:
    return NodeCommand(
        command_id=command_id or uuid.uuid4(),
        node=node,
        issued_at=START,
        producer=PRODUCER,
        fencing_token=token,
        data=data,
    )


def node_event(node: str, seq: int, data: NodeEventData) -> NodeEvent:
    return NodeEvent(
        event_id=uuid.uuid4(), node=node, seq=seq, occurred_at=START, producer=PRODUCER, data=data
    )


def record_after(node: str, *commands: NodeCommandData) -> NodeRecord:
    """The record that deciding and folding ``commands`` in order leaves (the first an observation)."""
    record: NodeRecord | None = None
    for data in commands:
        record = fold(record, decide_node(record, node_command(node, data), START))
    assert record is not None
    return record


def payload_types(events: list[NodeEvent]) -> list[type[NodeEventData]]:
    return [type(event.data) for event in events]


def _facts(record: NodeRecord) -> tuple[object, ...]:
    """What a node is, apart from its seq and the commands it remembers."""
    return (record.presence, record.spec, record.cordon, record.reason, record.since)


class NodeDeciderMachine(RuleBasedStateMachine):
    """A node owner's loop, in miniature: decide a command, check the decision, fold its events."""

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, NodeRecord | None] = dict.fromkeys(NODES)
        self.log: list[NodeEvent] = []
        self.leader_token = 1
        self.sent = 0
        self.now = START
        #: per node, the commands that produced events, oldest first (the ones the window remembers)
        self.effective: dict[str, list[NodeCommand]] = {name: [] for name in NODES}

    # -- the owner's loop ------------------------------------------------------------------

    def _token(self, sender: str) -> int | None:
        return {"operator": None, "leader": self.leader_token, "deposed": self.leader_token - 1}[sender]

    def _command(self, node: str, data: NodeCommandData, token: int | None) -> NodeCommand:
        self.sent += 1
        return node_command(node, data, token=token, command_id=uuid.uuid5(COMMAND_IDS, str(self.sent)))

    def _decide(self, record: NodeRecord | None, command: NodeCommand) -> list[NodeEvent]:
        return decide_node(record, command, self.now, producer=PRODUCER, leader_token=self.leader_token)

    def send(self, node: str, data: NodeCommandData, sender: str = "operator") -> list[NodeEvent]:
        """Decide ``data`` for ``node`` as ``sender``, check the decision, fold it; returns the events."""
        self.now += timedelta(seconds=1)
        token = self._token(sender)
        command = self._command(node, data, token)
        before = self.records[node]
        if before is None and not isinstance(data, nd.ObserveNode):
            with pytest.raises(UnknownNode):
                self._decide(before, command)
            return []
        events = self._decide(before, command)
        assert self._decide(before, command) == events, (
            "the same command on the same node decided differently"
        )
        after = before
        for event in events:
            assert (event.node, event.seq) == (node, (after.seq if after else 0) + 1)
            assert (event.causation_id, event.correlation_id) == (command.command_id, command.command_id)
            assert (event.occurred_at, event.producer) == (self.now, PRODUCER)
            refused = isinstance(event.data, nd.NodeCommandRejected)
            assert event.fencing_token == (None if refused else token), (
                f"{event.type} has the wrong fencing token"
            )
            after = evolve_node(after, event)
        assert after is not None
        if sender == "deposed":
            assert payload_types(events) == [nd.NodeCommandRejected], f"a deposed {command.type} decided"
        self._check_repeats(node, data, token, command, after, events)
        if before is not None and all(isinstance(event.data, nd.NodeCommandRejected) for event in events):
            assert _facts(after) == _facts(before), f"a refused or idle {command.type} changed the node"
        self.records[node] = after
        self.log.extend(events)
        if events:
            self.effective[node].append(command)
        return events

    def _check_repeats(
        self,
        node: str,
        data: NodeCommandData,
        token: int | None,
        command: NodeCommand,
        after: NodeRecord,
        events: list[NodeEvent],
    ) -> None:
        """A redelivered command decides nothing; the same request sent again decides nothing new."""
        assert self._decide(after, command) == [], f"redelivered {command.type} decided again"
        again = payload_types(self._decide(after, self._command(node, data, token)))
        if any(isinstance(event.data, nd.NodeCommandRejected) for event in events):
            assert again == [nd.NodeCommandRejected], f"{command.type} refused once, then {again}"
        else:
            assert again == [], f"{command.type} repeated on the node it shaped decided {again}"

    # -- the inventory source, through the scheduler leader ---------------------------------

    @rule(node=node_names, spec=node_specs, cordoned=st.booleans(), sender=senders)
    def observe(self, node: str, spec: nd.NodeSpec, cordoned: bool, sender: str) -> None:
        before = self.records[node]
        if before is None and sender == "deposed":
            return  # test_a_deposed_scheduler_cannot_bring_an_unseen_node_into_the_inventory
        cordon_reason = "unschedulable in the inventory" if cordoned else ""
        data = nd.ObserveNode(spec=spec, cordoned=cordoned, reason="seen", cordon_reason=cordon_reason)
        self.send(node, data, sender)
        after = self.records[node]
        assert after is not None
        if sender == "deposed":
            return
        assert (after.presence, after.spec) == (NodePresence.PRESENT, spec)
        if (
            before is not None
            and before.cordon is not None
            and before.cordon.source is nd.CordonSource.OPERATOR
        ):
            assert after.cordon == before.cordon, "an observation changed an operator's cordon"
        elif cordoned:
            assert after.cordon is not None and after.cordon.source is nd.CordonSource.INVENTORY
        else:
            assert after.cordon is None, "an inventory cordon outlived the inventory's own"

    @rule(node=node_names, reason=reasons, sender=senders)
    def report_lost(self, node: str, reason: str, sender: str) -> None:
        before = self.records[node]
        events = self.send(node, nd.ReportNodeLost(reason=reason or "not ready"), sender)
        after = self.records[node]
        if before is None or after is None or sender == "deposed":
            return
        if before.presence is NodePresence.PRESENT:
            assert payload_types(events) == [nd.NodeLost]
            assert (after.presence, after.cordon) == (NodePresence.LOST, before.cordon)
        else:
            assert events == [], f"a {before.presence} node was reported lost again"

    @rule(node=node_names, sender=senders)
    def remove(self, node: str, sender: str) -> None:
        before = self.records[node]
        events = self.send(node, nd.RemoveNode(reason="no longer in the inventory"), sender)
        after = self.records[node]
        if before is None or after is None or sender == "deposed":
            return
        assert (after.presence, after.cordon) == (NodePresence.REMOVED, None)
        if before.presence is NodePresence.REMOVED:
            assert events == [], "a removed node was removed again"

    # -- operators -------------------------------------------------------------------------

    @rule(node=node_names, reason=reasons, drain=st.booleans(), sender=senders)
    def cordon(self, node: str, reason: str, drain: bool, sender: str) -> None:
        before = self.records[node]
        events = self.send(node, nd.CordonNode(reason=reason or "operator", drain=drain), sender)
        after = self.records[node]
        if before is None or after is None or sender == "deposed":
            return
        assert after.presence is before.presence
        if before.presence is NodePresence.REMOVED:
            assert payload_types(events) == [nd.NodeCommandRejected], "a removed node took a cordon"
            return
        assert after.cordon is not None
        assert after.cordon.source is nd.CordonSource.OPERATOR, (
            "the inventory's cordon absorbed an operator's"
        )
        assert after.cordon.drain or not drain, "a drain did not drain"
        if before.cordon is None:
            assert after.cordon == Cordon(reason or "operator", nd.CordonSource.OPERATOR, drain)

    @rule(node=node_names, sender=senders)
    def uncordon(self, node: str, sender: str) -> None:
        before = self.records[node]
        events = self.send(node, nd.UncordonNode(reason="done"), sender)
        after = self.records[node]
        if before is None or after is None or sender == "deposed":
            return
        if before.cordon is None:
            assert events == []
        elif before.cordon.source is nd.CordonSource.INVENTORY:
            assert payload_types(events) == [nd.NodeCommandRejected], (
                "an operator lifted the inventory's cordon"
            )
            assert after.cordon == before.cordon
        else:
            assert after.cordon is None

    @rule(node=node_names, reason=reasons, drain=st.booleans())
    def cordon_and_lift_it(self, node: str, reason: str, drain: bool) -> None:
        """An operator's cordon, then its lifting: apart, the two rules seldom met on one node with
        a sender in office, so the lifting of an operator's own cordon went unchecked."""
        self.cordon(node, reason, drain, "operator")
        self.uncordon(node, "operator")

    # -- elections and redeliveries --------------------------------------------------------

    @rule()
    def elect_new_scheduler(self) -> None:
        self.leader_token += 1

    @rule(node=node_names, data=st.data())
    def redeliver_a_recent_command(self, node: str, data: st.DataObject) -> None:
        recent = self.effective[node][-COMMAND_WINDOW:]
        if not recent:
            return
        command = data.draw(st.sampled_from(recent), label="redelivered")
        assert self._decide(self.records[node], command) == [], f"redelivered {command.type} decided again"

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def seq_is_contiguous_per_node(self) -> None:
        for node in NODES:
            seqs = [event.seq for event in self.log if event.node == node]
            assert seqs == list(range(1, len(seqs) + 1))

    @invariant()
    def the_log_folds_to_the_decided_records(self) -> None:
        for node in NODES:
            assert fold(None, [event for event in self.log if event.node == node]) == self.records[node]

    @invariant()
    def event_ids_are_unique(self) -> None:
        assert len({event.event_id for event in self.log}) == len(self.log)

    @invariant()
    def status_follows_presence_and_cordon(self) -> None:
        for record in self.records.values():
            if record is None:
                continue
            match record.presence:
                case NodePresence.REMOVED:
                    assert record.cordon is None, "a removed node is cordoned"
                    assert record.status is NodeStatus.REMOVED
                case NodePresence.LOST:
                    assert record.status is NodeStatus.LOST
                case NodePresence.PRESENT if record.cordon is None:
                    assert record.status is NodeStatus.READY
                case NodePresence.PRESENT:
                    assert record.cordon is not None
                    drained = NodeStatus.DRAINING if record.cordon.drain else NodeStatus.CORDONED
                    assert record.status is drained

    @invariant()
    def the_scheduler_sees_present_nodes_closed_while_cordoned(self) -> None:
        present = sorted(
            (
                record
                for record in self.records.values()
                if record and record.presence is NodePresence.PRESENT
            ),
            key=lambda record: record.name,
        )
        inventory = schedulable_inventory(record for record in self.records.values() if record)
        assert [node.name for node in inventory] == [record.name for record in present]
        for node, record in zip(inventory, present, strict=True):
            assert node.gpus == record.spec.gpus
            assert node.schedulable is (record.cordon is None)
            assert node.draining is (record.cordon is not None and record.cordon.drain)


def test_random_node_command_sequences_keep_every_invariant() -> None:
    run_state_machine_as_test(
        NodeDeciderMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=30,
            deadline=None,
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# -- decisions the random walk skips or cannot tell --------------------------------------------

SPEC = nd.NodeSpec(gpus=8, gpu_type="a100", cpus=64.0, memory_mb=262_144)


def test_a_deposed_scheduler_cannot_bring_an_unseen_node_into_the_inventory() -> None:
    observed = node_command("node-a", nd.ObserveNode(spec=SPEC, reason="seen"), token=1)

    events = decide_node(None, observed, START, leader_token=2)

    assert events == [], f"a deposed scheduler's observation decided {payload_types(events)}"


def test_an_operator_cordon_asked_for_on_an_inventory_cordoned_node_outlives_the_inventory_cordon() -> None:
    cordoned_by_inventory = nd.ObserveNode(spec=SPEC, cordoned=True, cordon_reason="kubectl cordon")
    operator_cordon = nd.CordonNode(reason="bad DIMM")
    inventory_lifts = nd.ObserveNode(spec=SPEC, cordoned=False)

    record = record_after("node-a", cordoned_by_inventory, operator_cordon, inventory_lifts)

    assert record.status is NodeStatus.CORDONED, "the operator's cordon was lifted by the inventory"


def test_an_uncordon_refused_for_an_inventory_cordon_of_a_whole_reason_is_refused_within_one() -> None:
    """The refusal quotes the inventory's reason, itself as long as a reason may be: too long, the
    refusal was invalid, and the operator's command dead-lettered as an internal error."""
    cordon_reason = "x" * REASON_MAX
    record = record_after("node-a", nd.ObserveNode(spec=SPEC, cordoned=True, cordon_reason=cordon_reason))

    [refused] = decide_node(record, node_command("node-a", nd.UncordonNode()), START)

    assert isinstance(refused.data, nd.NodeCommandRejected)
    assert refused.data.reason.startswith("node node-a is cordoned by its inventory (xxx")
    assert len(refused.data.reason) == REASON_MAX


def test_an_operator_drain_takes_over_an_inventory_cordon_and_outlives_it() -> None:
    record = record_after(
        "node-a",
        nd.ObserveNode(spec=SPEC, cordoned=True, cordon_reason="kubectl cordon"),
        nd.CordonNode(reason="bad DIMM", drain=True),
        nd.ObserveNode(spec=SPEC, cordoned=False),
    )

    assert record.cordon == Cordon("bad DIMM", nd.CordonSource.OPERATOR, drain=True)
    assert record.status is NodeStatus.DRAINING


def test_a_lost_node_keeps_its_operator_cordon_when_it_comes_back() -> None:
    record = record_after(
        "node-a",
        nd.ObserveNode(spec=SPEC),
        nd.CordonNode(reason="bad DIMM"),
        nd.ReportNodeLost(reason="NotReady"),
        nd.ObserveNode(spec=SPEC),
    )

    assert record.cordon == Cordon("bad DIMM", nd.CordonSource.OPERATOR)
    assert record.status is NodeStatus.CORDONED


def test_a_removed_node_that_rejoins_is_ready_and_forgets_its_cordon() -> None:
    record = record_after(
        "node-a",
        nd.ObserveNode(spec=SPEC),
        nd.CordonNode(reason="bad DIMM", drain=True),
        nd.RemoveNode(reason="deleted"),
        nd.ObserveNode(spec=SPEC, reason="back"),
    )

    assert (record.status, record.reason, record.seq) == (NodeStatus.READY, "back", 4)


def test_an_unknown_node_takes_only_an_observation() -> None:
    for data in (
        nd.ReportNodeLost(reason="NotReady"),
        nd.RemoveNode(reason="gone"),
        nd.CordonNode(reason="x"),
        nd.UncordonNode(),
    ):
        with pytest.raises(UnknownNode, match=f"no node node-z for {data.type_name()}"):
            decide_node(None, node_command("node-z", data), START)


# -- evolve ------------------------------------------------------------------------------------


def test_the_first_event_of_a_node_must_be_a_join_numbered_one() -> None:
    with pytest.raises(EvolveError, match="must begin with NodeJoined"):
        evolve_node(None, node_event("node-a", 1, nd.NodeLost(reason="x")))
    with pytest.raises(EvolveError, match="seq 2 does not follow 0"):
        evolve_node(None, node_event("node-a", 2, nd.NodeJoined(spec=SPEC)))


@pytest.mark.parametrize("offset", [0, 2, -1])
def test_an_event_out_of_order_is_refused(offset: int) -> None:
    record = record_after("node-a", nd.ObserveNode(spec=SPEC), nd.CordonNode(reason="x"))

    with pytest.raises(EvolveError, match=f"seq {record.seq + offset} does not follow {record.seq}"):
        evolve_node(record, node_event("node-a", record.seq + offset, nd.NodeUncordoned()))


def test_an_event_of_another_node_is_refused() -> None:
    record = record_after("node-a", nd.ObserveNode(spec=SPEC))

    with pytest.raises(EvolveError):
        evolve_node(record, node_event("node-b", record.seq + 1, nd.NodeLost(reason="NotReady")))


HISTORIES: dict[str, tuple[NodeCommandData, ...]] = {
    "READY": (nd.ObserveNode(spec=SPEC),),
    "CORDONED": (nd.ObserveNode(spec=SPEC), nd.CordonNode(reason="x")),
    "LOST": (nd.ObserveNode(spec=SPEC), nd.ReportNodeLost(reason="NotReady")),
    "REMOVED": (nd.ObserveNode(spec=SPEC), nd.RemoveNode(reason="deleted")),
}
ILLEGAL: list[tuple[str, NodeEventData]] = [
    ("READY", nd.NodeJoined(spec=SPEC)),
    ("CORDONED", nd.NodeJoined(spec=SPEC)),
    ("LOST", nd.NodeResized(spec=SPEC)),
    ("REMOVED", nd.NodeResized(spec=SPEC)),
    ("REMOVED", nd.NodeCordoned(reason="x", source=nd.CordonSource.OPERATOR)),
    ("READY", nd.NodeUncordoned()),
    ("REMOVED", nd.NodeUncordoned()),
    ("LOST", nd.NodeLost(reason="again")),
    ("REMOVED", nd.NodeLost(reason="again")),
    ("REMOVED", nd.NodeRemoved(reason="again")),
]


@pytest.mark.parametrize(
    ("status", "data"), [pytest.param(*case, id=f"{case[1].type_name()}-on-{case[0]}") for case in ILLEGAL]
)
def test_an_event_that_cannot_follow_the_node_is_refused(status: str, data: NodeEventData) -> None:
    record = record_after("node-a", *HISTORIES[status])
    assert record.status == status

    with pytest.raises(EvolveError, match=f"{data.type_name()} cannot follow {record.status}"):
        evolve_node(record, node_event("node-a", record.seq + 1, data))


# -- the wire ----------------------------------------------------------------------------------

any_specs = st.builds(
    nd.NodeSpec,
    gpus=st.integers(0, 1024),
    gpu_type=st.text(min_size=1, max_size=63),
    cpus=st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False),
    memory_mb=st.integers(1, 2**40),
)
texts = st.text(max_size=80)
sources = st.sampled_from(tuple(nd.CordonSource))
EVENT_PAYLOADS: dict[str, st.SearchStrategy[NodeEventData]] = {
    "NodeJoined": st.builds(nd.NodeJoined, spec=any_specs, reason=texts),
    "NodeResized": st.builds(nd.NodeResized, spec=any_specs, reason=texts),
    "NodeCordoned": st.builds(nd.NodeCordoned, reason=texts, source=sources, drain=st.booleans()),
    "NodeUncordoned": st.builds(nd.NodeUncordoned, reason=texts),
    "NodeLost": st.builds(nd.NodeLost, reason=texts),
    "NodeRemoved": st.builds(nd.NodeRemoved, reason=texts),
    "NodeCommandRejected": st.builds(
        nd.NodeCommandRejected, command_id=st.uuids().map(str), command_type=texts, reason=texts
    ),
}
COMMAND_PAYLOADS: dict[str, st.SearchStrategy[NodeCommandData]] = {
    "ObserveNode": st.builds(
        nd.ObserveNode, spec=any_specs, cordoned=st.booleans(), reason=texts, cordon_reason=texts
    ),
    "ReportNodeLost": st.builds(nd.ReportNodeLost, reason=texts),
    "RemoveNode": st.builds(nd.RemoveNode, reason=texts),
    "CordonNode": st.builds(nd.CordonNode, reason=texts, drain=st.booleans()),
    "UncordonNode": st.builds(nd.UncordonNode, reason=texts),
}
wire_names = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,40}[A-Za-z0-9])?", fullmatch=True)
tokens = st.none() | st.integers(0, 2**31)
instants = st.datetimes(timezones=st.just(UTC))
WIRE = settings(max_examples=25, deadline=None)


def test_every_node_payload_type_has_a_wire_example() -> None:
    assert set(EVENT_PAYLOADS) == set(nd.NODE_EVENT_TYPES)
    assert set(COMMAND_PAYLOADS) == set(nd.NODE_COMMAND_TYPES)


@pytest.mark.parametrize("type_name", sorted(EVENT_PAYLOADS))
@WIRE
@given(data=st.data())
def test_a_node_event_round_trips(type_name: str, data: st.DataObject) -> None:
    event = NodeEvent(
        event_id=data.draw(st.uuids()),
        node=data.draw(wire_names),
        seq=data.draw(st.integers(1, 2**40)),
        occurred_at=data.draw(instants),
        causation_id=data.draw(st.none() | st.uuids()),
        correlation_id=data.draw(st.none() | st.uuids()),
        producer=data.draw(st.text(min_size=1, max_size=40)),
        fencing_token=data.draw(tokens),
        data=data.draw(EVENT_PAYLOADS[type_name]),
    )

    assert any_event_from_json(event_to_json(event)) == event
    assert any_event_from_dict(event_to_dict(event)) == event
    assert dict(cloudevent_headers(event, "test"))["ce_subject"] == f"node:{event.node}".encode()


@pytest.mark.parametrize("type_name", sorted(COMMAND_PAYLOADS))
@WIRE
@given(data=st.data())
def test_a_node_command_round_trips(type_name: str, data: st.DataObject) -> None:
    command = NodeCommand(
        command_id=data.draw(st.uuids()),
        node=data.draw(wire_names),
        issued_at=data.draw(instants),
        producer=data.draw(st.text(min_size=1, max_size=40)),
        correlation_id=data.draw(st.none() | st.uuids()),
        fencing_token=data.draw(tokens),
        data=data.draw(COMMAND_PAYLOADS[type_name]),
    )

    decoded = any_command_from_json(command_to_json(command))

    assert decoded == command
    assert decoded.key == f"node:{command.node}"


def _joined_event() -> NodeEvent:
    return node_event("node-a", 1, nd.NodeJoined(spec=SPEC, reason="seen"))


def test_a_node_event_is_not_a_job_event() -> None:
    with pytest.raises(DecodeError, match=r"^NodeJoined is a node event, not a job event$"):
        event_from_json(event_to_json(_joined_event()))


def test_a_node_command_is_not_a_job_command() -> None:
    with pytest.raises(DecodeError, match=r"^CordonNode is a node command, not a job command$"):
        command_from_json(command_to_json(node_command("node-a", nd.CordonNode(reason="x"))))


def test_a_node_command_with_an_invalid_node_name_names_the_field() -> None:
    wire = command_to_json(node_command("node-a", nd.CordonNode(reason="x")))

    with pytest.raises(DecodeError, match=r"^invalid node command envelope: node: String should match"):
        any_command_from_json(wire.replace(b'"node":"node-a"', b'"node":"bad name!"'))


def test_a_node_event_with_an_invalid_node_name_names_the_field() -> None:
    wire = event_to_json(_joined_event())

    with pytest.raises(DecodeError, match=r"^invalid node event envelope: node: String should match"):
        any_event_from_json(wire.replace(b'"node":"node-a"', b'"node":"bad name!"'))
