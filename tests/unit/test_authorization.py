"""Principals: who may send what, decided by the owner with the principal and never with what a command
says of itself, and placements checked against the cluster before they become events.

The policy is pinned as a table (every command type against every kind of principal); the gate is
tried with the lies a hostile sender tells (another tenant's name in the body, a scheduler's command
without the leader's token, a placement on busy, missing or cordoned GPUs); and a property: whatever
honest and forged commands reach the owner, in whatever order, no GPU is ever held by two jobs and
only the leading scheduler's allocations become events.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ffdl.core.aggregate import UnknownAggregate
from ffdl.core.authorization import (
    ANONYMOUS,
    SCHEDULER,
    Principal,
    PrincipalKind,
    Unauthorized,
    decide_as,
    legacy_principal,
)
from ffdl.core.cluster_view import ClusterView
from ffdl.core.invariants import ViolationKind, check
from ffdl.core.kinds import JOBS, KINDS, NODES
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyCommand, AnyEvent
from ffdl.events.envelope import Command, CommandData, Event, NodeCommand, NodeCommandData, NodeEvent
from ffdl.events.ids import reaction_command_id
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.handlers.deadletters import reason_class
from ffdl.handlers.ingress import INGRESS_HEADER, relayed
from ffdl.handlers.messaging import PRINCIPAL_HEADER, principal_of
from ffdl.handlers.ports import Record
from tests.golden.record import Owner, observe, positioned

NOW = datetime(2026, 1, 1, tzinfo=UTC)
T, A, S, P, N = (
    PrincipalKind.TENANT,
    PrincipalKind.ADMIN,
    PrincipalKind.SCHEDULER,
    PrincipalKind.PLATFORM,
    PrincipalKind.ANONYMOUS,
)
ACME, GLOBEX, OPS = Principal.tenant("acme"), Principal.tenant("globex"), Principal.admin("ops")
REACTOR = Principal.platform("reactor")


def job_command(
    data: CommandData, *, tenant: str = "acme", token: int | None = None, producer: str = "x"
) -> Command:
    return Command(
        command_id=uuid.uuid4(),
        job_id="job-1",
        tenant=tenant,
        issued_at=NOW,
        producer=producer,
        fencing_token=token,
        data=data,
    )


def node_command(data: NodeCommandData, *, token: int | None = None, producer: str = "x") -> NodeCommand:
    return NodeCommand(
        command_id=uuid.uuid4(),
        node="node-a",
        issued_at=NOW,
        producer=producer,
        fencing_token=token,
        data=data,
    )


# -- principals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["tenant:acme", "admin:ops", "admin", "platform:reactor", "platform", "scheduler", "anonymous"]
)
def test_a_principal_reads_back_as_written(text: str) -> None:
    assert str(Principal.parse(text)) == text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("root", "names no kind of principal"),
        ("tenant", "needs the tenant's name"),
        ("tenant:", "needs the tenant's name"),
        ("scheduler:me", "has no name"),
        ("tenant:acme:admin", "is not a tenant's or a role's name"),
        ("tenant:acme\n", "is not a tenant's or a role's name"),
    ],
)
def test_a_principal_that_is_not_one_is_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Principal.parse(text)


# -- who may send what ----------------------------------------------------------------------------------

SPEC = JobSpec(name="train", command="python train.py", gpus=1)
PLACEMENT = Placement(learners=(LearnerPlacement(rank=0, node="node-a", gpus=(0,), gpu_type="a100"),))
NODE_SPEC = nd.NodeSpec(gpus=4, gpu_type="a100", cpus=8.0, memory_mb=1024)

#: Every command, and the kinds of principal that may send it: the policy, as a table.
POLICY: list[tuple[CommandData | NodeCommandData, set[PrincipalKind]]] = [
    (cmd.SubmitJob(spec=SPEC), {T, A}),
    (cmd.HaltJob(), {T, A}),
    (cmd.ResumeJob(), {T, A}),
    (cmd.CancelJob(), {T, A}),
    (cmd.DeleteJob(), {T, A}),
    (cmd.ReportProgress(rank=0, attempt=1, step=3), {T, P}),
    (cmd.HaltJob(requeue=True), {S}),
    (cmd.AdmitJob(), {S}),
    (cmd.RejectJob(code="C101", reason="never fits"), {S}),
    (cmd.AllocateGpus(placement=PLACEMENT), {S}),
    (cmd.RecordWaitReason(code="capacity"), {S}),
    (cmd.BeginLaunch(attempt=1), {P}),
    (cmd.ReportLearnerStarted(rank=0, attempt=1), {P}),
    (cmd.ReportCheckpoint(checkpoint={"rank": 0, "attempt": 1, "step": 1, "uri": "s3://c"}), {P}),
    (cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0), {P}),
    (cmd.ReportLearnerLost(rank=0, attempt=1, reason="expired"), {P}),
    (cmd.FinishStoring(result={"result_dir": "s3://r"}), {P}),
    (cmd.ReleaseGpus(), {P}),
    (nd.CordonNode(reason="maintenance", drain=True), {A}),
    (nd.UncordonNode(), {A}),
    (nd.ObserveNode(spec=NODE_SPEC), {S, A}),
    (nd.ReportNodeLost(reason="NotReady"), {S, A}),
    (nd.RemoveNode(reason="deleted"), {S, A}),
]


def test_the_policy_names_every_command() -> None:
    named = {type(data).__name__ for data, _ in POLICY}
    assert named == set(cmd.COMMAND_TYPES) | set(nd.NODE_COMMAND_TYPES)


@pytest.mark.parametrize(
    ("data", "allowed"), POLICY, ids=lambda value: getattr(value, "type_name", lambda: "")()
)
def test_who_may_send_each_command(data: CommandData | NodeCommandData, allowed: set[PrincipalKind]) -> None:
    command: AnyCommand = node_command(data) if isinstance(data, NodeCommandData) else job_command(data)
    assert KINDS.of(command).senders(command) == allowed


def decide(command: AnyCommand, principal: Principal, state: Any = None, leader: int | None = 7) -> list[Any]:
    kind = KINDS.of(command)
    return decide_as(kind, state, command, NOW, principal=principal, producer="owner", leader_token=leader)


def submitted(tenant: str = "acme") -> Any:
    [event] = decide(job_command(cmd.SubmitJob(spec=SPEC), tenant=tenant), Principal.tenant(tenant))
    return JOBS.evolve(None, event)


def reason(events: list[Any]) -> str:
    [event] = events
    assert isinstance(event.data, ev.CommandRejected | nd.NodeCommandRejected)
    return str(event.data.reason)


def test_a_tenant_acts_on_its_own_jobs_only_whatever_the_command_says() -> None:
    job = submitted("acme")
    lying = job_command(cmd.CancelJob(), tenant="acme")  # names the job's tenant, sent by another

    with pytest.raises(Unauthorized, match="job belongs to another tenant than 'globex'"):
        decide(lying, GLOBEX, job)  # a dead letter: nothing in acme's job's history
    assert [e.type for e in decide(lying, ACME, job)] == ["CancelRequested", "JobCancelled"]
    assert [e.type for e in decide(lying, OPS, job)] == ["CancelRequested", "JobCancelled"]  # an admin's


def test_a_submission_in_another_tenants_name_creates_nothing() -> None:
    with pytest.raises(Unauthorized, match="job belongs to another tenant than 'acme'"):
        decide(job_command(cmd.SubmitJob(spec=SPEC), tenant="globex"), ACME)
    assert issubclass(Unauthorized, UnknownAggregate)  # the owner dead-letters it


@given(priority=st.integers(-1000, 1000), ceiling=st.integers(-1000, 1000))
def test_a_tenants_submission_above_its_ceiling_creates_nothing_an_admins_is_never_held(
    priority: int, ceiling: int
) -> None:
    submission = job_command(cmd.SubmitJob(spec=SPEC.model_copy(update={"priority": priority})))
    ceilings = {"acme": ceiling, "ops": None}.get

    def as_(principal: Principal) -> list[Any]:
        kind = KINDS.of(submission)
        return decide_as(
            kind, None, submission, NOW, principal=principal, producer="o", leader_token=7, ceilings=ceilings
        )

    if priority > ceiling:
        with pytest.raises(Unauthorized, match=f"priority {priority} is above the ceiling of tenant 'acme'"):
            as_(ACME)
    else:
        assert [e.type for e in as_(ACME)] == ["JobSubmitted"]
    assert [e.type for e in as_(OPS)] == ["JobSubmitted"]  # an admin's submission, any priority


@pytest.mark.parametrize(
    ("token", "leader", "why"),
    [
        (None, 7, "the scheduler's commands count only with its fencing token: this one has none"),
        (7, None, "fencing token 7 cannot be the leader's: no scheduler leads"),
        (6, 7, "fencing token 6 is not the leader's: sender was deposed"),
    ],
)
def test_the_scheduler_counts_only_with_the_leaders_token(
    token: int | None, leader: int | None, why: str
) -> None:
    job = submitted()
    admit = job_command(cmd.AdmitJob(), token=token)

    assert reason(decide(admit, SCHEDULER, job, leader)) == why
    assert [e.type for e in decide(job_command(cmd.AdmitJob(), token=7), SCHEDULER, job, 7)] == [
        "JobAccepted",
        "JobQueued",
    ]


def test_the_leaders_token_makes_no_one_else_the_scheduler() -> None:
    job = submitted()
    admit = job_command(cmd.AdmitJob(), token=7)

    assert reason(decide(admit, OPS, job)) == "admin:ops may not send AdmitJob: only the scheduler may"
    assert (
        reason(decide(admit, REACTOR, job))
        == "platform:reactor may not send AdmitJob: only the scheduler may"
    )


@pytest.mark.parametrize("leader", [7, None], ids=["a leader", "no leader"])
def test_only_the_scheduler_s_commands_carry_a_fencing_token(leader: int | None) -> None:
    """A tenant's token once became its job's while no scheduler led: with 2**62, every later
    leader's halt, allocation and drain of the job was refused as a deposed sender's. On a
    submission it was never checked, and `ffdl verify` then reported every scheduler event of the
    partition as a fencing breach."""
    job = submitted("acme")
    running = job_command(cmd.ReportProgress(rank=0, attempt=1, step=1), token=2**62)
    why = "tenant:acme may not send a fencing token: only the scheduler's commands carry one"
    assert reason(decide(running, ACME, job, leader)) == why
    assert reason(decide(job_command(cmd.HaltJob(), token=2**62), OPS, job, leader)) == (
        "admin:ops may not send a fencing token: only the scheduler's commands carry one"
    )
    with pytest.raises(Unauthorized, match=why):  # it would create the job: a dead letter
        decide(job_command(cmd.SubmitJob(spec=SPEC), token=2**62), ACME, None, leader)


def test_a_tenant_s_node_command_is_a_dead_letter_and_writes_nothing_in_the_node_s_history() -> None:
    joined = NODES.evolve(None, decide(node_command(nd.ObserveNode(spec=NODE_SPEC), token=7), SCHEDULER)[0])
    drain = node_command(nd.CordonNode(reason="mine", drain=True))

    with pytest.raises(Unauthorized, match="tenant:acme may not send CordonNode: only admins may"):
        decide(drain, ACME, joined)  # every tenant reads the node's history
    assert [e.type for e in decide(drain, OPS, joined)] == ["NodeCordoned"]
    with pytest.raises(Unauthorized, match="tenant:acme may not send ObserveNode"):
        decide(node_command(nd.ObserveNode(spec=NODE_SPEC)), ACME)


def test_a_tenant_s_refused_command_to_its_own_job_is_recorded_there() -> None:
    job = submitted("acme")

    assert (
        reason(decide(job_command(cmd.AdmitJob()), ACME, job))
        == "tenant:acme may not send AdmitJob: only the scheduler may"
    )


def test_a_redelivered_command_decides_nothing_even_once_refused() -> None:
    job = submitted()
    forged = job_command(cmd.AdmitJob())
    [refusal] = decide(forged, ACME, job)

    assert decide(forged, ACME, JOBS.evolve(job, refusal)) == []


@pytest.mark.parametrize(
    ("producer", "command", "principal"),
    [
        ("scheduler@ffdl-0", job_command(cmd.AdmitJob()), SCHEDULER),
        ("reactor@ffdl-0", job_command(cmd.ReleaseGpus()), Principal.platform("reactor")),
        (
            "monitor@ffdl-0",
            job_command(cmd.ReportProgress(rank=0, attempt=1, step=1)),
            Principal.platform("monitor"),
        ),
        ("pods@ffdl-0", job_command(cmd.ReleaseGpus()), Principal.platform("pods")),
        ("api@ffdl-0", job_command(cmd.CancelJob(), tenant="globex"), GLOBEX),
        ("mqtt@ffdl-0", job_command(cmd.ReportProgress(rank=0, attempt=1, step=1)), ACME),
        ("api@ffdl-0", node_command(nd.CordonNode(reason="r")), Principal.admin()),
        ("intruder", job_command(cmd.CancelJob()), ANONYMOUS),
        ("intruder", node_command(nd.CordonNode(reason="r")), ANONYMOUS),
        ("mqtt@ffdl-0", node_command(nd.CordonNode(reason="r")), ANONYMOUS),
    ],
)
def test_a_command_without_a_principal_is_its_producers_role_never_more(
    producer: str, command: AnyCommand, principal: Principal
) -> None:
    assert legacy_principal(command.model_copy(update={"producer": producer})) == principal


# -- where the principal comes from ---------------------------------------------------------------------


def record(*headers: tuple[str, bytes], topic: str = "ffdl.commands") -> Record:
    return Record(topic, 0, 5, "job-1", b"{}", headers)


def test_the_owner_reads_the_principal_header_and_derives_one_only_without_it() -> None:
    command = job_command(cmd.CancelJob(), producer="api@ffdl-0")

    assert principal_of(record((PRINCIPAL_HEADER, b"admin:ops")), command) == OPS
    assert principal_of(record(("ce_type", b"x")), command) == ACME
    for bad, why in [
        ((PRINCIPAL_HEADER, b"root"), "names no kind of principal"),
        ((PRINCIPAL_HEADER, b"\xff"), "not UTF-8"),
    ]:
        with pytest.raises(ValueError, match=why):
            principal_of(record(bad), command)
    with pytest.raises(ValueError, match="bad ffdl_principal header: 2 of them"):
        principal_of(record((PRINCIPAL_HEADER, b"tenant:acme"), (PRINCIPAL_HEADER, b"admin:ops")), command)


def test_only_the_platform_s_roles_send_name_based_command_ids() -> None:
    """The platform's reactions have name-based ids a tenant can work out (job, attempt, seq); the
    owner takes an id seen before for a redelivery, so a tenant's command with the id of its job's
    coming release would have made the release decide nothing, and the GPUs stay held."""
    release = reaction_command_id("job-1", "release", 1, 7)
    forged = job_command(cmd.CancelJob()).model_copy(update={"command_id": release})
    for sender in (b"tenant:acme", b"admin:ops"):
        with pytest.raises(ValueError, match=r"name-based .* send a random one") as refused:
            principal_of(record((PRINCIPAL_HEADER, sender)), forged)
        assert reason_class(str(refused.value)) == "refused"
    reactor = Principal.platform("reactor")
    assert principal_of(record((PRINCIPAL_HEADER, b"platform:reactor")), forged) == reactor
    assert principal_of(record((PRINCIPAL_HEADER, b"tenant:acme")), job_command(cmd.CancelJob())) == ACME
    legacy = forged.model_copy(update={"producer": "reactor@ffdl-0"})  # a record older than principals
    assert principal_of(record(), legacy) == reactor


def test_a_record_on_a_tenants_ingress_topic_is_that_tenants_whatever_it_says() -> None:
    """The ACL design, as the platform applies it: the topic a record was written to, not its headers."""
    lying = record(
        ("ce_type", b"io.ffdl.command.AllocateGpus.v1"),
        (PRINCIPAL_HEADER, b"scheduler"),
        (INGRESS_HEADER, b"forged"),
        topic="ffdl.tenant.acme.commands",
    )

    copy = relayed(lying, ACME)

    assert (copy.key, copy.value) == (lying.key, lying.value)
    assert copy.headers == (
        ("ce_type", b"io.ffdl.command.AllocateGpus.v1"),
        (PRINCIPAL_HEADER, b"tenant:acme"),
        (INGRESS_HEADER, b"ffdl.tenant.acme.commands:0:5"),
    )


# -- the cluster view -----------------------------------------------------------------------------------


def node_events(name: str, *data: nd.NodeEventData) -> list[NodeEvent]:
    return [
        NodeEvent(event_id=uuid.uuid4(), seq=seq, occurred_at=NOW, producer="owner", node=name, data=payload)
        for seq, payload in enumerate(data, 1)
    ]


def gpu_event(job_id: str, seq: int, data: ev.GpusAllocated | ev.GpusReleased) -> Event:
    return Event(
        event_id=uuid.uuid4(),
        seq=seq,
        occurred_at=NOW,
        producer="owner",
        job_id=job_id,
        tenant="t",
        data=data,
    )


def on(node: str, *gpus: int, rank: int = 0, gpu_type: str | None = "a100") -> LearnerPlacement:
    return LearnerPlacement(rank=rank, node=node, gpus=gpus, gpu_type=gpu_type)


@pytest.fixture
def view() -> ClusterView:
    view = ClusterView()
    joined = nd.NodeJoined(spec=NODE_SPEC)
    for event in [
        *node_events("a", joined),
        *node_events("cordoned", joined, nd.NodeCordoned(reason="r", source=nd.CordonSource.OPERATOR)),
        *node_events("draining", joined, nd.NodeCordoned(reason="r", source="operator", drain=True)),
        *node_events("lost", joined, nd.NodeLost(reason="NotReady")),
        *node_events("inventory-cordoned", joined, nd.NodeCordoned(reason="r", source="inventory")),
        gpu_event("other", 4, ev.GpusAllocated(placement=Placement(learners=(on("a", 0, 1),)))),
    ]:
        view.apply(event)
    return view


@pytest.mark.parametrize(
    ("learners", "why"),
    [
        ((on("a", 2, 3),), ""),
        ((on("a", 1, 2),), "GPU 1 of node a is held by another job"),
        ((on("ghost", 0),), "node ghost is not in the inventory"),
        ((on("a", 4),), "node a has no GPU 4 (it has 4)"),
        ((on("a", 2), on("a", 2, rank=1)), "GPU 2 of node a is placed twice"),
        ((on("a", 2, gpu_type="h100"),), "node a offers a100 GPUs, not h100"),
        ((on("cordoned", 0),), "node cordoned is CORDONED: nothing new is placed on it"),
        ((on("draining", 0),), "node draining is DRAINING: nothing new is placed on it"),
        ((on("inventory-cordoned", 0),), "node inventory-cordoned is CORDONED: nothing new is placed on it"),
        ((on("lost", 0),), "node lost is LOST: nothing new is placed on it"),
    ],
)
def test_a_placement_must_fit_the_nodes_and_the_free_gpus(
    view: ClusterView, learners: tuple[LearnerPlacement, ...], why: str
) -> None:
    assert view.placement_problem("mine", Placement(learners=learners)) == why


def test_released_gpus_are_free_again_and_each_gpu_event_counts_once(view: ClusterView) -> None:
    """The owner applies what it decides ahead of the log and reads it back later: the allocation read
    back after its own release does not take the GPUs again; once the log shows the release, the
    job is forgotten."""
    held = Placement(learners=(on("a", 0, 1),))
    allocated, released = (
        gpu_event("mine", 2, ev.GpusAllocated(placement=held)),
        gpu_event("mine", 9, ev.GpusReleased(placement=held)),
    )
    view.apply(gpu_event("other", 5, ev.GpusReleased(placement=held)))
    free = view.placement_problem("mine", held)
    view.apply(allocated, ahead=True)
    view.apply(released, ahead=True)

    view.apply(allocated)  # read back from the log: older than what the view has of the job
    still_free = view.placement_problem("someone", held)
    view.apply(released)

    assert free == still_free == "" and view.holders == {}
    assert view == ClusterView(view.nodes)  # neither job is remembered: each released on the log


def test_the_view_checks_only_an_allocation_the_job_would_take_now(view: ClusterView) -> None:
    job = queued = submitted()
    busy = job_command(cmd.AllocateGpus(placement=Placement(learners=(on("a", 0),))), token=7)
    for event in decide(job_command(cmd.AdmitJob(), token=7), SCHEDULER, job):
        queued = JOBS.evolve(queued, event)

    assert view.refusal(job, busy) == ""  # SUBMITTED: the decider refuses it for the job's state
    assert view.refusal(queued, busy) == "GPU 0 of node a is held by another job"
    assert view.refusal(queued, job_command(cmd.CancelJob())) == ""


# -- the property ---------------------------------------------------------------------------------------

NODE_NAMES = ("gpu-node-01", "gpu-node-02")
JOB_SPECS = {
    "a-1": ("acme", JobSpec(name="a", command="train", learners=2, gpus=1, gpu_type="a100")),
    "a-2": ("acme", JobSpec(name="b", command="train", learners=1, gpus=2, gpu_type="a100")),
    "g-1": ("globex", JobSpec(name="c", command="train", learners=1, gpus=3, gpu_type="a100")),
    "g-2": ("globex", JobSpec(name="d", command="train", learners=2, gpus=2, gpu_type="a100")),
}
PRINCIPALS = (ACME, GLOBEX, OPS, SCHEDULER, REACTOR, ANONYMOUS)


@dataclass
class Cluster:
    """One owner of every job and node (a golden log's), an honest scheduler and hostile senders."""

    owner: Owner = field(default_factory=lambda: Owner("property", NOW))
    #: the command id of each allocation the owner turned into GpusAllocated, with who sent it and how
    allocated: dict[uuid.UUID, tuple[Principal, int | None, int | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.owner.leader_token = 1
        observe(self.owner, *NODE_NAMES, token=1)
        for job_id, (tenant, spec) in JOB_SPECS.items():
            self.send(job_id, cmd.SubmitJob(spec=spec), Principal.tenant(tenant))
            self.send(job_id, cmd.AdmitJob(), SCHEDULER, self.owner.leader_token)

    def send(
        self, job_id: str, data: CommandData, principal: Principal, token: int | None = None
    ) -> list[Event]:
        tenant = JOB_SPECS[job_id][0]
        command = self.owner.command(job_id, tenant, data, "sender", token)
        events = self.owner.deliver(command, principal)
        if any(isinstance(event.data, ev.GpusAllocated) for event in events):
            self.allocated[command.command_id] = (principal, token, self.owner.leader_token)
        return events

    def honest_placement(self, job_id: str) -> Placement | None:
        """Where the scheduler would place the job: the lowest free GPUs of open nodes, as the log shows."""
        seen = ClusterView()
        for event in self.owner.events:
            seen.apply(event)
        spec = JOB_SPECS[job_id][1]
        learners = []
        taken = set(seen.holders)
        for rank in range(spec.learners):
            for name in NODE_NAMES:
                node = seen.nodes[name]
                free = [gpu for gpu in range(node.spec.gpus) if (name, gpu) not in taken]
                if node.cordon is None and len(free) >= spec.gpus:
                    gpus = tuple(free[: spec.gpus])
                    taken |= {(name, gpu) for gpu in gpus}
                    learners.append(on(name, *gpus, rank=rank))
                    break
            else:
                return None
        return Placement(learners=tuple(learners))


job_ids = st.sampled_from(sorted(JOB_SPECS))
#: Where a forged placement puts a learner: a node (one the inventory lacks too) and its first GPU.
forged_learner = st.tuples(st.sampled_from((*NODE_NAMES, "gpu-node-99")), st.integers(0, 4))
actions = st.one_of(
    st.tuples(st.just("allocate"), job_ids),
    st.tuples(
        st.just("forge"),
        job_ids,
        st.sampled_from(PRINCIPALS),
        st.sampled_from(("none", "current", "stale")),
        st.lists(forged_learner, min_size=2, max_size=2),
    ),
    st.tuples(st.just("release"), job_ids),
    st.tuples(st.just("forged release"), job_ids, st.sampled_from(PRINCIPALS)),
    st.tuples(st.just("cordon"), st.sampled_from(NODE_NAMES), st.sampled_from(PRINCIPALS)),
    st.tuples(st.just("new leader")),
)


def act(cluster: Cluster, action: tuple[Any, ...]) -> None:
    owner = cluster.owner
    match action:
        case ("allocate", job_id):
            placement = cluster.honest_placement(job_id)
            if placement is not None:
                cluster.send(job_id, cmd.AllocateGpus(placement=placement), SCHEDULER, owner.leader_token)
        case ("forge", job_id, principal, token_kind, learners):
            leader = owner.leader_token or 1
            token = {"none": None, "current": leader, "stale": leader - 1}[token_kind]
            spec = JOB_SPECS[job_id][1]
            placement = Placement(
                learners=tuple(
                    on(node, *range(first, first + spec.gpus), rank=rank)
                    for rank, (node, first) in zip(range(spec.learners), learners, strict=False)
                )
            )
            cluster.send(job_id, cmd.AllocateGpus(placement=placement, reason="forged"), principal, token)
        case ("release", job_id):
            cluster.send(job_id, cmd.CancelJob(), Principal.tenant(JOB_SPECS[job_id][0]))
            cluster.send(job_id, cmd.ReleaseGpus(), REACTOR)
        case ("forged release", job_id, principal):
            cluster.send(job_id, cmd.ReleaseGpus(), principal)
        case ("cordon", name, principal):
            owner.deliver(owner.node_command(name, nd.CordonNode(reason="forged?"), "sender"), principal)
        case ("new leader",):
            owner.leader_token = (owner.leader_token or 0) + 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(actions, max_size=40))
def test_no_gpu_is_ever_held_by_two_jobs_whoever_sends_what(script: list[tuple[Any, ...]]) -> None:
    cluster = Cluster()
    for action in script:
        act(cluster, action)

    events: list[AnyEvent] = cluster.owner.events
    violations = check((logged.event, f"{logged.partition}:{logged.offset}") for logged in positioned(events))
    assert [
        v for v in violations if v.kind in (ViolationKind.GPU_DOUBLE_HELD, ViolationKind.GPU_NOT_OFFERED)
    ] == []
    for principal, token, leader in cluster.allocated.values():
        assert (principal, token) == (SCHEDULER, leader), "only the leading scheduler's allocations count"
