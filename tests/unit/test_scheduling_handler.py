"""The scheduler role on the real embedded log with the real job owner: allocations, preemption
through the owner, recorded wait reasons, and the same decisions from the same log."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ffdl.adapters.bus import open_bus
from ffdl.adapters.inventory import ConfiguredInventory
from ffdl.core import scheduling
from ffdl.core.allocator import Node
from ffdl.core.authorization import ANONYMOUS, SCHEDULER
from ffdl.core.decider import decide
from ffdl.core.invariants import check
from ffdl.core.job import Job, evolve
from ffdl.core.kinds import JOBS
from ffdl.core.nodes import NodeRecord, decide_node, evolve_node
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import AnyEvent, any_command_from_json, any_event_from_json
from ffdl.events.envelope import Command, CommandData, Event, NodeCommand, NodeEvent
from ffdl.events.model import Checkpoint, JobSpec, WaitReason
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.owner import JobOwner
from ffdl.handlers.ports import Bus
from ffdl.handlers.scheduler import Scheduler
from tests.scheduling import honest_principal, owner_and_scheduler
from tests.services import wait_until_async

S = JobState
TENANT = "t"
INVENTORY = ConfiguredInventory([Node("n0", 4)])


@dataclass
class Cluster:
    """A job owner and a scheduler running on one embedded log, and a sender for the test's commands."""

    bus: Bus
    topics: Topics
    owner: JobOwner
    scheduler: Scheduler
    user: CommandSender

    async def send(self, job_id: str, data: CommandData) -> None:
        command = self.user.make(JOBS.address(job_id, TENANT), data)
        await self.user.send(command, principal=honest_principal(command))

    def job(self, job_id: str) -> Job | None:
        return self.owner.book.jobs.get(job_id)

    async def until(self, job_id: str, holds: Callable[[Job], bool], what: str) -> Job:
        await wait_until_async(lambda: (j := self.job(job_id)) is not None and holds(j), 15.0, what=what)
        job = self.job(job_id)
        assert job is not None
        return job

    async def queue(self, job_id: str, gpus: int, priority: int = 0) -> None:
        """Submit the job; the scheduler admits it."""
        await self.send(
            job_id, cmd.SubmitJob(spec=JobSpec(name=job_id, command="train", gpus=gpus, priority=priority))
        )

    async def log(self) -> list[tuple[AnyEvent, str]]:
        events = []
        for partition in sorted(await self.bus.end_offsets(self.topics.events)):
            async for record in self.bus.read(self.topics.events, partition):
                events.append((any_event_from_json(record.value), f"{partition}:{record.offset}"))
        return events


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with owner_and_scheduler(tmp_path, 2, INVENTORY) as running:
        sender = CommandSender(running.bus, running.topics, "test", ANONYMOUS)
        yield Cluster(running.bus, running.topics, running.owner, running.scheduler, sender)


async def test_a_higher_priority_job_preempts_and_the_victim_resumes_from_its_checkpoint(
    cluster: Cluster,
) -> None:
    await cluster.queue("low", gpus=4)
    await cluster.until("low", lambda j: j.state is S.LAUNCHING, "low gets the GPUs and launches")
    await cluster.send("low", cmd.ReportLearnerStarted(rank=0, attempt=1))
    await cluster.send(
        "low", cmd.ReportCheckpoint(checkpoint=Checkpoint(rank=0, attempt=1, step=7, uri="ckpt/7"))
    )
    await cluster.until("low", lambda j: j.state is S.RUNNING and bool(j.checkpoints), "low runs")

    await cluster.queue("high", gpus=4, priority=10)
    halting = await cluster.until("low", lambda j: j.state is S.HALTING, "the scheduler halts low for high")
    assert halting.requeue_on_halt and "preempted by job high" in halting.reason
    high = await cluster.until("high", lambda j: j.waiting is not None, "high records why it waits")
    assert high.waiting is not None and high.waiting.code is WaitReason.PREEMPTION
    assert high.waiting.waiting_for == ("low",)

    await cluster.send("low", cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0))
    await cluster.until("low", lambda j: j.state is S.QUEUED, "low is requeued once halted")
    await cluster.send("low", cmd.ReleaseGpus())
    await cluster.until("high", lambda j: j.state is S.LAUNCHING, "high gets the freed GPUs")
    low = await cluster.until("low", lambda j: j.waiting is not None, "low records why it waits now")
    assert low.waiting is not None and low.waiting.code is WaitReason.CAPACITY

    await cluster.send("high", cmd.CancelJob(reason="done with it"))
    await cluster.send("high", cmd.ReleaseGpus())
    resumed = await cluster.until(
        "low", lambda j: j.state is S.LAUNCHING and j.attempt == 2, "low gets its GPUs back and relaunches"
    )
    assert resumed.resume_from is not None and resumed.resume_from.step == 7

    log = await cluster.log()
    assert check(log) == []
    halts = [
        e
        for e, _ in log
        if isinstance(e, Event) and isinstance(e.data, ev.HaltRequested) and e.job_id == "low"
    ]
    assert len(halts) == 1 and halts[0].fencing_token is not None, "preempted once, with the leader's token"


async def test_a_job_without_gpus_holding_a_nodes_cpus_is_preempted_for_a_higher_priority_gang(
    cluster: Cluster,
) -> None:
    """A `gpus: 0` job of the lowest class that takes 60 of the node's 64 CPUs once kept every gang
    off the node whatever its class: a victim was looked for among jobs holding GPUs only."""
    spec = JobSpec(name="cpu-hog", command="train", gpus=0, cpus=60)
    await cluster.send("cpu-hog", cmd.SubmitJob(spec=spec))
    await cluster.until("cpu-hog", lambda j: j.state is S.LAUNCHING, "the CPU-only job gets its CPUs")
    await cluster.send(
        "urgent", cmd.SubmitJob(spec=JobSpec(name="urgent", command="t", gpus=4, cpus=8, priority=10))
    )
    halting = await cluster.until("cpu-hog", lambda j: j.state is S.HALTING, "it is halted for the gang")
    assert halting.requeue_on_halt and "preempted by job urgent" in halting.reason
    urgent = await cluster.until("urgent", lambda j: j.waiting is not None, "urgent records why it waits")
    assert urgent.waiting is not None and urgent.waiting.waiting_for == ("cpu-hog",)


async def test_the_same_log_in_another_order_yields_the_same_decisions(cluster: Cluster) -> None:
    for index, gpus in enumerate([2, 3, 1, 4, 2, 1]):
        await cluster.queue(f"job-{index}", gpus=gpus, priority=index % 3)
    await wait_until_async(
        lambda: sum(1 for j in cluster.owner.book.jobs.values() if j.state is not S.SUBMITTED) == 6,
        15.0,
        what="every job is queued or scheduled",
    )

    async def on_the_log() -> bool:  # the owner's book is ahead of its appends
        last: dict[str, int] = {}
        for event, _ in await cluster.log():
            if isinstance(event, Event):
                last[event.job_id] = max(last.get(event.job_id, 0), event.seq)
        return all(last.get(job_id) == job.seq for job_id, job in cluster.owner.book.jobs.items())

    await wait_until_async(on_the_log, 15.0, what="every decision on the log")
    log = [event for event, _ in await cluster.log()]
    by_job: dict[str, list[Event]] = {}
    for event in log:
        if isinstance(event, Event):
            by_job.setdefault(event.job_id, []).append(event)
    node_events = [event for event in log if isinstance(event, NodeEvent)]
    assert [(e.node, e.type) for e in node_events] == [("n0", "NodeJoined")]

    def replayed(seed: int) -> Scheduler:
        """A fresh scheduler folding the log with the jobs' events interleaved in another order."""
        fresh = Scheduler(cluster.bus, cluster.topics.events, cluster.user, INVENTORY, 1)
        for event in node_events:
            fresh.fold(event, 0)
        pending = {job_id: list(events) for job_id, events in by_job.items()}
        rng = random.Random(seed)
        while pending:
            job_id = rng.choice(sorted(pending))
            event = pending[job_id].pop(0)
            fresh.fold(event, 0)
            if not pending[job_id]:
                del pending[job_id]
        return fresh

    now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    plans = [replayed(seed).next_plan(now)[1] for seed in range(3)]
    assert plans[0] == plans[1] == plans[2]


async def test_an_allocation_stays_held_until_the_owner_answers_it_not_just_until_the_next_event(
    tmp_path: Path,
) -> None:
    """A reason sent a cycle before the allocation is answered first; the allocation must still count."""
    bus = open_bus(f"embedded://{tmp_path}", 1)
    await bus.start()
    topics = Topics()
    scheduler = Scheduler(
        bus, topics.events, CommandSender(bus, topics, "scheduler", SCHEDULER), INVENTORY, 1
    )
    jobs: dict[str, Job] = {}
    nodes: dict[str, NodeRecord] = {}
    delivered = 0

    def apply(command: Command | NodeCommand) -> None:
        if isinstance(command, NodeCommand):
            for node_event in decide_node(nodes.get(command.node), command, datetime.now(UTC)):
                nodes[command.node] = evolve_node(nodes.get(command.node), node_event)
                scheduler.fold(node_event, 0)
            return
        for event in decide(jobs.get(command.job_id), command, datetime.now(UTC)):
            jobs[command.job_id] = evolve(jobs.get(command.job_id), event)
            scheduler.fold(event, 0)

    def user(job_id: str, data: CommandData) -> None:
        apply(
            Command(
                command_id=uuid.uuid4(),
                job_id=job_id,
                tenant=TENANT,
                issued_at=datetime.now(UTC),
                producer="test",
                data=data,
            )
        )

    async def from_scheduler() -> list[Command | NodeCommand]:
        """The commands the scheduler sent since the last call, not yet delivered to the owner."""
        nonlocal delivered
        records = [record async for record in bus.read(topics.commands, 0)][delivered:]
        delivered += len(records)
        return [any_command_from_json(record.value) for record in records]

    async def settle() -> None:
        """Schedule and deliver until the scheduler has nothing more to say."""
        while True:
            await scheduler.schedule()
            sent = await from_scheduler()
            if not sent:
                return
            for command in sent:
                apply(command)

    try:
        await scheduler.on_assigned(frozenset())
        user("y", cmd.SubmitJob(spec=JobSpec(name="y", command="train", gpus=4)))
        await settle()
        assert nodes["n0"].spec.gpus == 4 and jobs["y"].state is S.LAUNCHING
        user("x", cmd.SubmitJob(spec=JobSpec(name="x", command="train", gpus=4)))
        await scheduler.schedule()
        for admission in await from_scheduler():
            apply(admission)
        await scheduler.schedule()
        reason = await from_scheduler()
        assert [c.type for c in reason] == ["RecordWaitReason"]
        user("y", cmd.CancelJob())
        user("y", cmd.ReleaseGpus())
        await scheduler.schedule()
        allocation = await from_scheduler()
        assert [(c.type, c.key) for c in allocation] == [("AllocateGpus", "x")]
        apply(reason[0])  # the owner answers the older command first: x's next event is JobWaiting
        assert jobs["x"].state is S.QUEUED and jobs["x"].waiting is not None
        user("z", cmd.SubmitJob(spec=JobSpec(name="z", command="train", gpus=4)))
        await scheduler.schedule()
        for admission in await from_scheduler():
            assert admission.type == "AdmitJob"
            apply(admission)
        await scheduler.schedule()
        assert all(c.type != "AllocateGpus" for c in await from_scheduler()), "x's GPUs were promised again"
        apply(allocation[0])
        assert jobs["x"].placement is not None
    finally:
        await bus.close()


async def test_a_wait_reason_the_command_cannot_carry_is_left_unrecorded_and_the_step_goes_on(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Such a reason once raised in the middle of the step, which the scheduler then planned again
    after each restart: nothing was placed or preempted for any tenant."""
    monkeypatch.setitem(scheduling._DETAILS, WaitReason.CAPACITY, "needs {need}" + "!" * 3000)
    monkeypatch.setattr(scheduling, "_blocked_record", scheduling._blocked_record.__wrapped__)  # no memo
    await cluster.queue("holder", gpus=4)
    await cluster.until("holder", lambda job: job.placement is not None, "the node's GPUs held")
    await cluster.queue("waiter", gpus=2)  # waits for capacity, with a reason too long to record
    await cluster.queue("cpus-only", gpus=0)

    await cluster.until("cpus-only", lambda job: job.placement is not None, "the job that fits placed")
    assert (waiter := cluster.job("waiter")) is not None
    assert waiter.state is S.QUEUED and waiter.waiting is None
