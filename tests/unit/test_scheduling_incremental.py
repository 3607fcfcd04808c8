"""The scheduler's kept cluster state and queue decide exactly what ones rebuilt from its fold decide.

The scheduler brings its cluster state and waiting queue up to date between planning steps instead
of rebuilding them from every job it knows (:mod:`ffdl.handlers.scheduler_state`). Here it runs
against the real deciders of the owner and the nodes, over random sequences of submissions,
deliveries of its commands (in any order, some late), learners ending, GPUs released, cancels,
cordons and the clock moving; before every step its plan must equal, placements, preemptions and
every reason, the plan over a cluster state and queue built afresh from the same fold.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import event as note
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.aggregate import Address, Aggregates, Applied
from ffdl.core.allocator import Node
from ffdl.core.cluster import ClusterState
from ffdl.core.decider import decide
from ffdl.core.job import Job, evolve
from ffdl.core.kinds import KINDS
from ffdl.core.nodes import InventoryObservation, NodeRecord, decide_node, evolve_node
from ffdl.core.scheduling import SchedulerPolicy, plan
from ffdl.core.tenancy import TenancyPolicy, TenantQuota
from ffdl.events import job_commands as cmd
from ffdl.events.codec import AnyCommand
from ffdl.events.envelope import Command, CommandData, NodeCommand
from ffdl.events.model import JobSpec
from ffdl.handlers.scheduler_state import SchedulerState

START = datetime(2026, 1, 1, tzinfo=UTC)
TENANTS = ("a", "b", "c")
POLICY = SchedulerPolicy(
    tenancy=TenancyPolicy(
        {"a": TenantQuota(4, None), "b": TenantQuota(2, 6, weight=2.0), "c": TenantQuota(0, 4)}
    ),
    min_runtime_s=10.0,
)


class Maker:
    """Makes the scheduler's commands as a sender would, without sending them."""

    def make(self, to: Address[Any, Any], data: Any, *, fencing_token: int | None = None) -> Any:
        head = {"command_id": uuid.uuid4(), "issued_at": START, "producer": "scheduler"}
        return to.command({**head, "fencing_token": fencing_token}, data)  # type: ignore[typeddict-item]


class World:
    """The owner's and the nodes' deciders applying commands, the scheduler folding what they decide."""

    def __init__(self, nodes: int) -> None:
        self.clock = START
        self.book = Aggregates(KINDS)
        self.state = SchedulerState(self.book, Maker(), 1, policy=POLICY, clock=self.now)
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
        tenant = self.jobs[job_id].tenant if job_id in self.jobs else TENANTS[0]
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

    def submit(self, tenant: str, learners: int, gpus: int, priority: int) -> None:
        self.submitted += 1
        job_id = f"job-{self.submitted}"
        spec = JobSpec(name=job_id, command="train", learners=learners, gpus=gpus, priority=priority)
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
        expected = plan(fresh_state, fresh_queue, now, POLICY)
        kept, decided = self.state.next_plan(now)
        assert decided == expected
        for state in (kept, fresh_state):
            assert held_on_nodes(state) == {
                priority: on_nodes for priority, on_nodes in state.gpus_on_nodes.items() if on_nodes
            }, "per class and node, what its running jobs hold"

        assert self.state.next_plan(now)[1] == expected, "a plan not sent leaves no trace"
        note(f"allocations {min(len(expected.allocations), 2)}")
        note(f"evictions {min(len(expected.evictions), 1)}")
        for wait in expected.waits.values():
            note(f"reason {wait.code}")
        self.pending.extend(self.state.decide(InventoryObservation(dict(self.seen))))

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


actions = st.lists(
    st.one_of(
        *[
            st.tuples(
                st.just("submit"),
                st.sampled_from(TENANTS),
                st.integers(1, 3),
                st.sampled_from([0, 1, 2, 4]),
                st.sampled_from([-5, 0, 5]),
            )
        ]
        * 3,
        st.tuples(st.just("schedule")),
        st.tuples(st.just("settle")),
        st.tuples(st.just("settle")),
        st.tuples(st.just("deliver"), st.integers(0, 1000)),
        st.tuples(st.just("deliver all")),
        st.tuples(st.sampled_from(["start", "exit", "fail", "release", "cancel"]), st.integers(0, 1000)),
        st.tuples(st.just("cordon"), st.integers(0, 10)),
        st.tuples(st.just("tick"), st.sampled_from([1, 20, 45])),
    ),
    min_size=10,
    max_size=80,
)


@settings(max_examples=80, deadline=None)
@given(nodes=st.integers(1, 4), steps=actions)
def test_the_kept_state_plans_exactly_as_one_rebuilt_from_the_fold(nodes: int, steps: list[Any]) -> None:
    world = World(nodes)
    world.schedule()
    for step in steps:
        kind = step[0]
        if kind == "submit":
            world.submit(*step[1:])
        elif kind == "schedule":
            world.schedule()
        elif kind == "deliver" and world.pending:
            world.apply(world.pending.pop(step[1] % len(world.pending)))
        elif kind == "settle":
            world.settle()
        elif kind == "deliver all":
            while world.pending:
                world.apply(world.pending.pop(0))
        elif kind == "cordon":
            name = f"n{step[1] % nodes}"
            node = world.seen[name]
            world.seen[name] = replace(node, schedulable=not node.schedulable)
        elif kind == "tick":
            world.clock += timedelta(seconds=step[1])
        elif (job_id := world.job(step[1])) is not None:
            job = world.jobs[job_id]
            if kind == "cancel":
                world.user(job_id, cmd.CancelJob(reason="enough"))
            elif kind == "release":
                world.user(job_id, cmd.ReleaseGpus())
            else:
                for rank in range(job.spec.learners):
                    attempt = max(job.attempt, 1)
                    if kind == "start":
                        world.user(job_id, cmd.ReportLearnerStarted(rank=rank, attempt=attempt))
                    else:
                        code = 0 if kind == "exit" else 1
                        world.user(
                            job_id, cmd.ReportLearnerExited(rank=rank, attempt=attempt, exit_code=code)
                        )
    world.schedule()
