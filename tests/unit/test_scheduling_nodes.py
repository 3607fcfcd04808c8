"""The inventory on the log: the scheduler records what its source sees as node events, admits
against the recorded nodes, keeps new gangs off cordoned nodes, moves jobs off drained, lost and
removed ones (halted with a checkpoint, requeued), and a new leader carries on from the log.

A real job owner and scheduler run on one embedded log; the test plays the launcher (learner
reports) and the operator (node commands)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ffdl.adapters.bus import open_bus
from ffdl.core.allocator import Node
from ffdl.core.authorization import ANONYMOUS, SCHEDULER
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS, NODES
from ffdl.core.nodes import InventoryObservation, NodeRecord, NodeStatus
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events import nodes as nd
from ffdl.events.codec import any_command_from_json, any_event_from_json
from ffdl.events.envelope import CommandData, NodeCommandData, NodeEvent
from ffdl.events.model import Checkpoint, ErrorCode, JobSpec
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.owner import JobOwner
from ffdl.handlers.ports import Bus, TopicPartition
from ffdl.handlers.scheduler import Scheduler
from ffdl.handlers.scheduler_state import NODE_CHANGE_RESEND_S
from tests.scheduling import honest_principal, owner_and_scheduler
from tests.services import wait_until_async

S = JobState
TENANT = "t"


@dataclass
class Source:
    """An inventory source the test edits: what it sees now (None: it has not listed yet)."""

    nodes: dict[str, Node] | None = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)

    def observe(self) -> InventoryObservation | None:
        if self.nodes is None:
            return None
        return InventoryObservation(dict(self.nodes), dict(self.lost), "test inventory")


@dataclass
class Cluster:
    bus: Bus
    topics: Topics
    owner: JobOwner
    scheduler: Scheduler
    source: Source
    user: CommandSender
    token: int

    async def send(self, job_id: str, data: CommandData) -> None:
        command = self.user.make(JOBS.address(job_id, TENANT), data)
        await self.user.send(command, principal=honest_principal(command))

    async def operate(self, node: str, data: NodeCommandData) -> None:
        command = self.user.make(NODES.address(node), data)
        await self.user.send(command, principal=honest_principal(command))

    async def tick(self) -> None:
        """What the platform's periodic planning does when no event arrives (a source change)."""
        await self.scheduler.schedule()

    def job(self, job_id: str) -> Job | None:
        return self.owner.book.jobs.get(job_id)

    def node(self, name: str) -> NodeRecord | None:
        return self.owner.book.nodes.get(name)

    async def until(self, job_id: str, holds: Callable[[Job], bool], what: str) -> Job:
        await wait_until_async(lambda: (j := self.job(job_id)) is not None and holds(j), 10.0, what=what)
        job = self.job(job_id)
        assert job is not None
        return job

    async def until_node(self, name: str, holds: Callable[[NodeRecord], bool], what: str) -> NodeRecord:
        async def settled() -> bool:
            await self.tick()
            n = self.node(name)
            if n is None or not holds(n):
                return False
            # The owner's book takes a decision before its append lands: wait until the log has it too.
            return any(e.node == name and e.seq == n.seq for e in await self.node_events())

        deadline = asyncio.get_running_loop().time() + 10.0
        while not await settled():
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting until {what}"
            await asyncio.sleep(0.02)
        node = self.node(name)
        assert node is not None
        return node

    async def submit(self, job_id: str, gpus: int, *, learners: int = 1, gpu_type: str | None = None) -> None:
        spec = JobSpec(name=job_id, command="train", learners=learners, gpus=gpus, gpu_type=gpu_type)
        await self.send(job_id, cmd.SubmitJob(spec=spec))

    async def run(self, job_id: str, attempt: int, step: int) -> Job:
        """Play the launcher: the allocated job's learners start and record a checkpoint."""
        job = await self.until(job_id, lambda j: j.state is S.LAUNCHING, f"{job_id} gets GPUs and launches")
        for rank in range(job.spec.learners):
            await self.send(job_id, cmd.ReportLearnerStarted(rank=rank, attempt=attempt))
            checkpoint = Checkpoint(rank=rank, attempt=attempt, step=step, uri=f"ckpt/{step}")
            await self.send(job_id, cmd.ReportCheckpoint(checkpoint=checkpoint))
        return await self.until(job_id, lambda j: j.state is S.RUNNING, f"{job_id} runs")

    async def halt_done(self, job_id: str, attempt: int) -> None:
        """Play the launcher: the halted learners exit, and the GPUs are released."""
        job = await self.until(job_id, lambda j: j.state is S.HALTING, f"{job_id} is being halted")
        for rank in range(job.spec.learners):
            await self.send(job_id, cmd.ReportLearnerExited(rank=rank, attempt=attempt, exit_code=0))
        await self.until(job_id, lambda j: j.state is S.QUEUED, f"{job_id} is requeued")
        await self.send(job_id, cmd.ReleaseGpus())

    async def scheduler_sent(self, key: str) -> list[str]:
        """The types of the commands the scheduler sent for ``key`` so far (it sends before a
        planning pass returns, so after :meth:`tick` this is everything that pass decided)."""
        sent = []
        for partition in sorted(await self.bus.end_offsets(self.topics.commands)):
            async for record in self.bus.read(self.topics.commands, partition):
                command = any_command_from_json(record.value)
                if command.key == key and command.producer == "scheduler":
                    sent.append(command.type)
        return sent

    async def scheduler_sees(self, what: str, holds: Callable[[Scheduler], bool]) -> None:
        await wait_until_async(lambda: holds(self.scheduler), 10.0, what=f"the scheduler folded {what}")

    async def node_events(self) -> list[NodeEvent]:
        events = []
        for partition in sorted(await self.bus.end_offsets(self.topics.events)):
            async for record in self.bus.read(self.topics.events, partition):
                event = any_event_from_json(record.value)
                if isinstance(event, NodeEvent):
                    events.append(event)
        return events


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    source = Source({"a": Node("a", 4, "A100"), "b": Node("b", 4, "A100")})
    async with owner_and_scheduler(tmp_path, 3, source) as running:
        sender = CommandSender(running.bus, running.topics, "test", ANONYMOUS)
        yield Cluster(
            running.bus, running.topics, running.owner, running.scheduler, source, sender, running.token
        )


async def test_the_source_nodes_are_recorded_once_with_the_leaders_token(cluster: Cluster) -> None:
    for name in ("a", "b"):
        await cluster.until_node(name, lambda n: n.status is NodeStatus.READY, f"{name} joined")
    for _ in range(3):
        await cluster.tick()
    events = await cluster.node_events()
    assert sorted((e.node, e.type, e.seq) for e in events) == [("a", "NodeJoined", 1), ("b", "NodeJoined", 1)]
    assert {e.fencing_token for e in events} == {cluster.token}
    joined = next(e for e in events if e.node == "a")
    assert joined.data == nd.NodeJoined(
        spec=nd.NodeSpec(gpus=4, gpu_type="A100", cpus=64.0, memory_mb=262_144),
        reason="seen by the test inventory",
    )


async def test_a_new_leader_folding_the_log_records_nothing_again(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.until_node("b", lambda n: n.status is NodeStatus.READY, "b joined")
    successor = Scheduler(
        cluster.bus,
        cluster.topics.events,
        CommandSender(cluster.bus, cluster.topics, "next", SCHEDULER),
        cluster.source,
        1,
    )
    await successor.on_assigned(frozenset(TopicPartition(cluster.topics.events, p) for p in range(3)))
    await successor.schedule()
    sent = [record for p in range(3) async for record in cluster.bus.read(cluster.topics.commands, p)]
    assert not [r for r in sent if b'"producer":"next"' in r.value], "the log already agrees with the source"


async def test_changes_at_the_source_become_node_events(cluster: Cluster) -> None:
    await cluster.until_node("b", lambda n: n.status is NodeStatus.READY, "b joined")
    cluster.source.nodes = {
        "a": Node("a", 3, "A100"),  # a GPU failed
        "b": Node("b", 4, "A100", schedulable=False),  # cordoned at the source
        "c": Node("c", 8, "H100"),  # joined
    }
    await cluster.until_node("a", lambda n: n.spec.gpus == 3, "a resized")
    b = await cluster.until_node("b", lambda n: n.status is NodeStatus.CORDONED, "b cordoned by its source")
    assert b.cordon is not None and b.cordon.source is nd.CordonSource.INVENTORY
    await cluster.until_node("c", lambda n: n.status is NodeStatus.READY, "c joined")

    await cluster.operate("b", nd.UncordonNode(reason="let me"))
    events = await cluster.node_events()
    await cluster.until_node("b", lambda n: n.seq == 3, "the operator's uncordon decided")
    rejected = [e for e in await cluster.node_events() if e.node == "b" and e.type == "NodeCommandRejected"]
    assert len(rejected) == 1 and "cordoned by its inventory" in rejected[0].data.reason  # type: ignore[attr-defined]

    cluster.source.nodes = {"b": Node("b", 4, "A100")}
    cluster.source.lost = {"c": "NotReady: kubelet stopped posting status"}
    await cluster.until_node("a", lambda n: n.status is NodeStatus.REMOVED, "a removed")
    await cluster.until_node("b", lambda n: n.status is NodeStatus.READY, "b uncordoned at its source")
    c = await cluster.until_node("c", lambda n: n.status is NodeStatus.LOST, "c lost")
    assert c.reason == "NotReady: kubelet stopped posting status"
    types = [(e.node, e.type) for e in await cluster.node_events() if e not in events]
    assert ("a", "NodeRemoved") in types and ("b", "NodeUncordoned") in types and ("c", "NodeLost") in types


async def test_admission_waits_for_the_source_and_rejects_only_what_can_never_fit(cluster: Cluster) -> None:
    cluster.source.nodes = None  # not listed yet: nothing is known to be too big
    await cluster.submit("huge", gpus=8)
    await cluster.scheduler_sees("huge", lambda s: "huge" in s.book.jobs)
    await cluster.tick()
    assert await cluster.scheduler_sent("huge") == [], (
        "neither admitted nor rejected before the source listed"
    )

    cluster.source.nodes = {"a": Node("a", 4, "A100"), "b": Node("b", 4, "A100", schedulable=False)}
    await cluster.tick()
    huge = await cluster.until("huge", lambda j: j.state is S.FAILED, "huge is rejected")
    assert huge.failure_code is ErrorCode.UNSCHEDULABLE and "can never fit" in huge.reason

    await cluster.submit("wrong-type", gpus=1, gpu_type="H100")
    await cluster.until("wrong-type", lambda j: j.state is S.FAILED, "no H100 anywhere")
    await cluster.submit("big", gpus=4, learners=2)  # fits only with the cordoned node: it waits
    big = await cluster.until("big", lambda j: j.state is S.QUEUED and j.waiting is not None, "big waits")
    assert big.placement is None
    await cluster.operate("b", nd.CordonNode(reason="maintenance"))  # the operator's cordon too
    cluster.source.nodes = {"a": Node("a", 4, "A100"), "b": Node("b", 4, "A100")}
    await cluster.until_node(
        "b", lambda n: n.cordon is not None and n.cordon.source is nd.CordonSource.OPERATOR, "operator cordon"
    )
    await cluster.scheduler_sees(
        "the operator's cordon",
        lambda s: (
            (b := s.book.nodes.get("b")) is not None
            and b.cordon is not None
            and b.cordon.source is nd.CordonSource.OPERATOR
        ),
    )
    await cluster.tick()
    assert "AllocateGpus" not in await cluster.scheduler_sent("big"), (
        "an operator's cordon outlives the source's"
    )
    await cluster.operate("b", nd.UncordonNode(reason="maintenance done"))
    big = await cluster.until("big", lambda j: j.state is S.LAUNCHING, "big runs once b is open")
    assert big.placement is not None and {p.node for p in big.placement.learners} == {"a", "b"}


async def test_a_drained_node_is_emptied_and_its_jobs_resume_elsewhere_from_their_checkpoint(
    cluster: Cluster,
) -> None:
    await cluster.until_node("b", lambda n: n.status is NodeStatus.READY, "b joined")
    await cluster.submit("job", gpus=4)
    running = await cluster.run("job", attempt=1, step=42)
    assert running.placement is not None
    (node,) = {p.node for p in running.placement.learners}
    other = "b" if node == "a" else "a"

    await cluster.operate(node, nd.CordonNode(reason="replace a fan"))
    await cluster.until_node(node, lambda n: n.status is NodeStatus.CORDONED, "cordoned")
    await cluster.scheduler_sees(
        "the cordon", lambda s: (n := s.book.nodes.get(node)) is not None and n.status is NodeStatus.CORDONED
    )
    await cluster.tick()
    assert "HaltJob" not in await cluster.scheduler_sent("job"), "a cordon alone leaves running jobs alone"

    await cluster.operate(node, nd.CordonNode(reason="replace a fan", drain=True))
    halting = await cluster.until("job", lambda j: j.state is S.HALTING, "the drain halts the job")
    assert halting.requeue_on_halt and f"node {node} is being drained" in halting.reason
    await cluster.halt_done("job", attempt=1)
    resumed = await cluster.until(
        "job", lambda j: j.state is S.LAUNCHING and j.attempt == 2, "the job gets GPUs again and relaunches"
    )
    assert resumed.placement is not None and {p.node for p in resumed.placement.learners} == {other}
    assert resumed.resume_from is not None and resumed.resume_from.step == 42


async def test_a_lost_node_requeues_its_jobs(cluster: Cluster) -> None:
    await cluster.until_node("b", lambda n: n.status is NodeStatus.READY, "b joined")
    await cluster.submit("job", gpus=2, learners=2)
    running = await cluster.run("job", attempt=1, step=5)
    assert running.placement is not None
    (node,) = {p.node for p in running.placement.learners}
    cluster.source.nodes = {
        n: v for n, v in {"a": Node("a", 4, "A100"), "b": Node("b", 4, "A100")}.items() if n != node
    }
    cluster.source.lost = {node: "NotReady"}
    await cluster.until_node(node, lambda n: n.status is NodeStatus.LOST, "the node is lost")
    halting = await cluster.until("job", lambda j: j.state is S.HALTING, "its job is halted to requeue")
    assert f"node {node} left the inventory" in halting.reason
    events = [e for e in await cluster.node_events() if e.node == node]
    assert [e.type for e in events] == ["NodeJoined", "NodeLost"]


async def test_an_unanswered_observation_is_sent_again(tmp_path: Path) -> None:
    """An observation of a new node that its owner drops (it could not confirm the sender's token,
    and a node with no history has nowhere to record a refusal) is sent again, not waited for."""
    bus = open_bus(f"embedded://{tmp_path}", 1)
    await bus.start()
    topics = Topics()
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    source = Source({"a": Node("a", 4, "A100")})
    scheduler = Scheduler(
        bus,
        topics.events,
        CommandSender(bus, topics, "scheduler", SCHEDULER),
        source,
        1,
        clock=lambda: now[0],
    )

    async def observations() -> list[str]:
        records = [record async for record in bus.read(topics.commands, 0)]
        return [any_command_from_json(record.value).type for record in records]

    try:
        await scheduler.on_assigned(frozenset())
        await scheduler.schedule()
        await scheduler.schedule()
        assert await observations() == ["ObserveNode"], "sent once while it may still be answered"
        now[0] += timedelta(seconds=NODE_CHANGE_RESEND_S)
        await scheduler.schedule()
        assert await observations() == ["ObserveNode", "ObserveNode"]
    finally:
        await bus.close()
