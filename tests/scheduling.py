"""For the scheduler role's tests: a job owner and a leading scheduler running on one embedded log,
and a world of the real deciders around a scheduler's planning state, in virtual time."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import currently_in_test_context
from hypothesis import event as note

from ffdl.adapters.bus import open_bus
from ffdl.adapters.election import FileElection
from ffdl.core.aggregate import Address, Aggregates, Applied
from ffdl.core.allocator import Node
from ffdl.core.authorization import SCHEDULER, Principal, PrincipalKind
from ffdl.core.cluster import ClusterState
from ffdl.core.decider import decide
from ffdl.core.job import Job, evolve
from ffdl.core.kinds import KINDS
from ffdl.core.nodes import InventoryObservation, NodeRecord, decide_node, evolve_node
from ffdl.core.scheduling import Plan, SchedulerPolicy, plan
from ffdl.events import job_commands as cmd
from ffdl.events.codec import AnyCommand
from ffdl.events.envelope import Command, CommandData, NodeCommand
from ffdl.events.model import JobSpec
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.owner import SCHEDULER_ROLE, JobOwner
from ffdl.handlers.ports import Bus, InventorySource
from ffdl.handlers.runtime import consume
from ffdl.handlers.scheduler import Scheduler
from ffdl.handlers.scheduler_state import SchedulerState

START = datetime(2026, 1, 1, tzinfo=UTC)


def honest_principal(command: AnyCommand) -> Principal:
    """Whom an honest sender sends ``command`` for: the job's tenant for what a user asks, an operator
    for a node command, else one of the platform's roles (for what they observe)."""
    senders = KINDS.of(command).senders(command)
    if isinstance(command, Command) and PrincipalKind.TENANT in senders:
        return Principal.tenant(command.tenant)
    if PrincipalKind.ADMIN in senders:
        return Principal.admin("ops")
    return Principal.platform("test")


@dataclass(frozen=True, slots=True)
class Running:
    bus: Bus
    topics: Topics
    owner: JobOwner
    scheduler: Scheduler
    token: int


@asynccontextmanager
async def owner_and_scheduler(
    tmp_path: Path, partitions: int, inventory: InventorySource
) -> AsyncIterator[Running]:
    """The owner consuming commands, the elected scheduler folding events and planning, until exit.
    Preemption has no minimum runtime, so tests need not wait for one."""
    bus = open_bus(f"embedded://{tmp_path / 'log'}", partitions)
    await bus.start()
    topics = Topics()
    election = FileElection(tmp_path / "election")
    token = await election.campaign(SCHEDULER_ROLE)
    owner = JobOwner(bus, topics, election)
    sender = CommandSender(bus, topics, "scheduler", SCHEDULER)
    policy = SchedulerPolicy(min_runtime_s=0.0)
    scheduler = Scheduler(bus, topics.events, sender, inventory, token, policy=policy)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(consume(bus, "owners", [topics.commands], owner, stop)),
        asyncio.create_task(consume(bus, "scheduler", [topics.events], scheduler, stop)),
        asyncio.create_task(scheduler.plan_forever(stop)),
    ]
    try:
        yield Running(bus, topics, owner, scheduler, token)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await bus.close()
        await election.close()


class Maker:
    """Makes the scheduler's commands as a sender would, without sending them."""

    def make(self, to: Address[Any, Any], data: Any, *, fencing_token: int | None = None) -> Any:
        head = {"command_id": uuid.uuid4(), "issued_at": START, "producer": "scheduler"}
        return to.command({**head, "fencing_token": fencing_token}, data)  # type: ignore[typeddict-item]


class World:
    """The owner's and the nodes' deciders applying commands, the scheduler folding what they decide,
    in virtual time (``clock``); nodes of 4 GPUs. Each planning step is checked against the plan over
    a cluster state and queue the scheduler builds afresh from the same fold."""

    def __init__(self, nodes: int, policy: SchedulerPolicy) -> None:
        self.clock = START
        self.book = Aggregates(KINDS)
        self.policy = policy
        self.state = SchedulerState(self.book, Maker(), 1, policy=policy, clock=self.now)
        self.jobs: dict[str, Job] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.seen = {f"n{index}": Node(f"n{index}", 4) for index in range(nodes)}
        self.pending: list[AnyCommand] = []
        self.submitted = 0

    def now(self) -> float:
        return self.clock.timestamp()

    def apply(self, command: AnyCommand) -> None:
        if isinstance(command, NodeCommand):
            for node_event in decide_node(self.nodes.get(command.node), command, self.clock):
                self.nodes[command.node] = evolve_node(self.nodes.get(command.node), node_event)
                self.fold(node_event)
            return
        for event in decide(self.jobs.get(command.job_id), command, self.clock):
            self.jobs[command.job_id] = evolve(self.jobs.get(command.job_id), event)
            self.fold(event)

    def fold(self, event: Any) -> None:
        applied = self.book.fold(event)
        if isinstance(applied, Applied):
            self.state.folded(applied)

    def user(self, job_id: str, data: CommandData) -> None:
        tenant = self.jobs[job_id].tenant if job_id in self.jobs else "a"
        self.apply(
            Command(
                command_id=uuid.uuid4(),
                job_id=job_id,
                tenant=tenant,
                issued_at=self.clock,
                producer="test",
                data=data,
            )
        )

    def submit(self, tenant: str, learners: int, gpus: int, priority: int, cpus: float = 1.0) -> None:
        self.submitted += 1
        job_id = f"job-{self.submitted}"
        spec = JobSpec(
            name=job_id, command="train", learners=learners, gpus=gpus, priority=priority, cpus=cpus
        )
        self.apply(
            Command(
                command_id=uuid.uuid4(),
                job_id=job_id,
                tenant=tenant,
                issued_at=self.clock,
                producer="test",
                data=cmd.SubmitJob(spec=spec),
            )
        )

    def schedule(self) -> None:
        """One planning step, checked against the plan over a state and queue built afresh."""
        now = self.clock.timestamp()
        fresh_state, fresh_queue = self.state.rebuilt(now)
        expected = plan(fresh_state, fresh_queue, now, self.policy)
        kept, decided = self.state.next_plan(now)
        assert decided == expected
        for counts in ("usage", "releasing", "gpus_held"):  # what each tenant holds, counted alike
            kept_counts, fresh_counts = getattr(kept, counts), getattr(fresh_state, counts)
            assert {t: n for t, n in kept_counts.items() if n} == {t: n for t, n in fresh_counts.items() if n}
        for state in (kept, fresh_state):
            assert held_on_nodes(state) == {
                priority: on_nodes for priority, on_nodes in state.gpus_on_nodes.items() if on_nodes
            }, "per class and node, what its running jobs hold"

        assert self.state.next_plan(now)[1] == expected, "a plan not sent leaves no trace"
        if currently_in_test_context():  # a property test's statistics
            self.note(expected)
        self.pending.extend(self.state.decide(InventoryObservation(dict(self.seen))))

    @staticmethod
    def note(expected: Plan) -> None:
        note(f"allocations {min(len(expected.allocations), 2)}")
        note(f"evictions {min(len(expected.evictions), 1)}")
        for wait in expected.waits.values():
            note(f"reason {wait.code}")

    def settle(self) -> None:
        """Deliver and schedule until the scheduler has nothing more to say."""
        for _ in range(10):
            self.schedule()
            if not self.pending:
                return
            while self.pending:
                self.apply(self.pending.pop(0))

    def job(self, pick: int) -> str | None:
        names = sorted(self.jobs)
        return names[pick % len(names)] if names else None


def held_on_nodes(state: ClusterState) -> dict[int, dict[str, int]]:
    """Per class, the GPUs its running jobs hold on each node, counted afresh."""
    counted: dict[int, dict[str, int]] = {}
    for priority, jobs in state.running.items():
        for job in jobs.values():
            for node, gpus in job.gang.learners:
                if gpus:
                    on_nodes = counted.setdefault(priority, {})
                    on_nodes[node] = on_nodes.get(node, 0) + len(gpus)
    return counted
