"""Golden logs: recorded histories of jobs and nodes that today's deciders must decide again, event for event.

This is Temporal's replay testing applied to our deciders. A golden log is three files here:

* ``NAME.commands.jsonl``: every command the owner decided, a job's or a node's, in the order it
  decided them, as the commands topic carries it (``command_to_json``) plus whom it was sent for and
  how it was decided: ``principal`` (the record's principal header; logs recorded before principals
  have none), ``decided_at`` (the owner's clock), ``decided_by`` (the owner, the producer of the
  events) and ``leader_token`` (the scheduler leader's fencing token the owner checked the command
  against);
* ``NAME.events.jsonl``: the events the owner appended, jobs' and nodes', as ``ffdl export`` writes them;
* ``NAME.case.json``: what the log shows, the restart policy the owner ran with, and what each job's
  state and (where the log has nodes) each node's state must fold to.

``tests/unit/test_golden_logs.py`` decides every recorded command again on the job or node folded from
the recorded events before it and demands exactly the recorded events, with the re-decider the product
ships (``ffdl verify --redecide``, :mod:`ffdl.tools.redecide`). Once committed, a golden log is a
history an older platform wrote and is never rewritten; a new scenario gets new files::

    .venv/bin/python -m tests.golden.record NAME [NAME ...]   # refuses to overwrite

:data:`SCENARIOS` holds the stories as today's platform tells them. A committed log whose name is not
among them was written by an older platform whose scripts went with it: ``happy_path`` to
``node_drain`` come from the owner that appended ``GpusAllocated`` alone and launched only on the
reactor's ``BeginLaunch``; they replay unchanged, each allocation through the known change of
decision ``launch-in-allocation`` (``ffdl.tools.redecide.DECISION_CHANGES``). The same stories told
by the owner that launches in the allocation's own decision are the ``NAME_direct_launch`` logs. Both
were recorded before principals: their commands name none, the reactor admitted jobs, the scheduler's
commands were checked against no leader and jobs were placed on nodes the log never had, all of which
today's owner refuses; those decisions replay through the known change ``principals``. The stories
told for principals, each command sent for its principal and every node observed before a job is
placed on it, are the ``NAME_principals`` logs, with ``forged_commands_principals``: what a hostile
sender tries. The same stories were told again by two changes made side by side: with version 2
specs (``SubmitJob`` and ``JobSubmitted``: launcher, nproc_per_node, keep_checkpoints and
stop_grace_s), the ``NAME_spec_v2`` logs; and with learners' progress in its second version (bounded
metrics and the reasons of what was dropped, ``LearnerProgressed`` and ``ReportProgress`` v2;
``JobCompleted`` and ``FinishStoring`` v2), the ``NAME_bounded_reports`` logs. Each older log replays
through the upcasters of what it predates. Today's stories, with both, are the
``NAME_specs_and_reports_v2`` logs, but for the two with a tenant's command to an aggregate not its
own (another tenant's job, a node): the owner recorded its refusal there, and today's dead-letters
it (``outsiders-dead-lettered``), so those stories were told anew as ``rejected_commands_outsiders``
and ``forged_commands_outsiders``. Then halts came to say whether a preemption made room for a job
of the halted job's own tenant (``HaltJob`` and ``HaltRequested`` v3): the stories with a halt are
today's as ``NAME_halts_v3``, and the logs before replay through the v3 upcasters.

The :class:`Owner` here is the partition owner without I/O: the owner's gate and the job and node
deciders, their folds and the cluster view, on a virtual clock, the way ``handlers/owner.py`` runs
them on the log (one owner, one order, whatever the aggregate). :class:`JobScript` drives one job
through its life with the commands the platform's roles send (API, reactor, scheduler, monitor),
:class:`NodeScript` one node with the scheduler's inventory observations and operators' cordons; the
replay benchmark uses the job scripts to generate a large realistic log.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import random
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, overload

from ffdl.adapters.bus.partitioning import partition_for
from ffdl.core.aggregate import Aggregates, UnknownAggregate
from ffdl.core.authorization import Principal, decide_as, legacy_principal
from ffdl.core.cluster_view import ClusterView
from ffdl.core.decider import next_attempt
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS, NODES, aggregate_kinds
from ffdl.core.nodes import NodeRecord
from ffdl.core.restart import RestartPolicy
from ffdl.events import job_commands as cmd
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyCommand, AnyEvent
from ffdl.events.envelope import Command, CommandData, Event, NodeCommand, NodeCommandData, NodeEvent
from ffdl.events.model import (
    Checkpoint,
    ErrorCode,
    JobSpec,
    LearnerPlacement,
    LossReason,
    Placement,
    ResultSummary,
    WaitReason,
)
from ffdl.projections.store import LoggedEvent
from ffdl.tools.log_files import encode_line, write_log
from ffdl.tools.redecide import Decided, RecordedCommand, decided_line

GOLDEN_DIR = Path(__file__).resolve().parent
EVENTS_TOPIC = "ffdl.events"
PARTITIONS = 8
OWNER = "owner@ffdl-0"
API = "api@ffdl-0"
REACTOR = "reactor@ffdl-0"
SCHEDULER = "scheduler@ffdl-0"
#: The scheduler replica that takes the lead when ``SCHEDULER`` loses it.
SCHEDULER_STANDBY = "scheduler@ffdl-1"
MONITOR = "monitor@ffdl-0"
#: The operator whose node commands the API sends.
OPERATOR = Principal.admin("ops")
_COMMAND_NAMESPACE = uuid.UUID("0b9e4f52-2f7c-4d8e-a1f6-3c5d7e9a1b24")


class Owner:
    """The owner of jobs and nodes without I/O: decides each command for its principal on the folded
    job or node and the cluster as its events leave it, on a virtual clock.

    ``leader_token`` is the scheduler leader's fencing token as the owner's election sees it; like
    ``handlers/owner.py`` the owner checks every fenced command against it. It keeps every command it
    decided and every event it appended, in order, for a golden log; a long generated log drains both
    as it goes and forgets ended jobs, so it streams in flat memory.
    """

    def __init__(self, name: str, start: datetime, policy: RestartPolicy | None = None) -> None:
        self.name = name
        self.now = start
        self.policy = policy or RestartPolicy()
        self.leader_token: int | None = None
        self.book = Aggregates(aggregate_kinds(self.policy))
        self.jobs: dict[str, Job] = self.book.of(JOBS)
        self.nodes: dict[str, NodeRecord] = self.book.of(NODES)
        self.cluster = ClusterView()
        self.decided: list[RecordedCommand] = []
        self.events: list[AnyEvent] = []
        self._sent = 0

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def command(
        self, job_id: str, tenant: str, data: CommandData, sender: str, token: int | None = None
    ) -> Command:
        self._sent += 1
        return Command(
            command_id=uuid.uuid5(_COMMAND_NAMESPACE, f"{self.name}/{self._sent}"),
            job_id=job_id,
            tenant=tenant,
            issued_at=self.now,
            producer=sender,
            fencing_token=token,
            data=data,
        )

    def node_command(
        self, node: str, data: NodeCommandData, sender: str, token: int | None = None
    ) -> NodeCommand:
        self._sent += 1
        return NodeCommand(
            command_id=uuid.uuid5(_COMMAND_NAMESPACE, f"{self.name}/{self._sent}"),
            node=node,
            issued_at=self.now,
            producer=sender,
            fencing_token=token,
            data=data,
        )

    @overload
    def deliver(self, command: Command, principal: Principal | None = None) -> list[Event]: ...

    @overload
    def deliver(self, command: NodeCommand, principal: Principal | None = None) -> list[NodeEvent]: ...

    def deliver(
        self, command: AnyCommand, principal: Principal | None = None
    ) -> list[Event] | list[NodeEvent]:
        """Decide ``command`` now, sent for ``principal`` (default: the principal the platform's role
        that produced it sends for), and apply its events, as the owner does for each record; one the
        owner dead-letters decides nothing."""
        principal = principal or legacy_principal(command)
        leader = self.leader_token if command.fencing_token is not None else None
        kind = self.book.kinds.of(command)
        state = self.book.of(kind).get(kind.identity(command))
        try:
            events = decide_as(
                kind,
                state,
                command,
                self.now,
                principal=principal,
                producer=OWNER,
                leader_token=leader,
                outside=self.cluster.refusal,
            )
        except UnknownAggregate:
            events = []
        for event in events:
            self.book.fold(event)
            self.cluster.apply(event)
        self.decided.append(
            RecordedCommand(command, decided=Decided(self.now, OWNER, leader), principal=principal)
        )
        self.events.extend(events)
        return events

    def drain(self, job_id: str) -> list[AnyEvent]:
        """The events appended since the last drain; forgets ``job_id`` (ended) and the decided commands."""
        events, self.events = self.events, []
        self.decided.clear()
        self.jobs.pop(job_id, None)
        return events


def _metrics(step: int) -> dict[str, float]:
    return {"loss": round(2.3 / (1 + step / 40), 4), "lr": 0.001}


@dataclass
class JobScript:
    """One job's life as the platform's roles drive it: each method sends what one role would send.

    Every method returns the events the owner decided. Learners take ``step_s`` seconds per step,
    report progress every ``report_every`` steps and checkpoint every ``checkpoint_every`` steps.
    """

    owner: Owner
    job_id: str
    tenant: str
    spec: JobSpec
    nodes: tuple[str, ...] = ("gpu-node-01",)
    gpu_offset: int = 0
    step_s: float = 0.5
    report_every: int = 10
    checkpoint_every: int = 50
    steps_done: int = 0
    pids: int = 4100
    last: list[Event] = field(default_factory=list)

    def send(
        self,
        data: CommandData,
        sender: str,
        token: int | None = None,
        after_s: float = 0.05,
        principal: Principal | None = None,
    ) -> list[Event]:
        command = self.owner.command(self.job_id, self.tenant, data, sender, token)
        self.owner.tick(after_s)
        self.last = self.owner.deliver(command, principal)
        return self.last

    @property
    def job(self) -> Job:
        return self.owner.jobs[self.job_id]

    def placement(self) -> Placement:
        gpus = self.spec.gpus
        return Placement(
            learners=tuple(
                LearnerPlacement(
                    rank=rank,
                    node=self.nodes[rank % len(self.nodes)],
                    gpus=tuple(self.gpu_offset + (rank // len(self.nodes)) * gpus + i for i in range(gpus)),
                    gpu_type="a100",
                )
                for rank in range(self.spec.learners)
            )
        )

    # -- API and admission ----------------------------------------------------------------------

    def submit(self) -> list[Event]:
        return self.send(cmd.SubmitJob(spec=self.spec), API, after_s=0.0)

    def admit(self, *, token: int) -> list[Event]:
        """Admission: the scheduler leader's, fenced with its ``token``."""
        return self.send(cmd.AdmitJob(), SCHEDULER, token)

    def reject(self, reason: str, *, token: int) -> list[Event]:
        return self.send(cmd.RejectJob(code=ErrorCode.UNSCHEDULABLE, reason=reason), SCHEDULER, token)

    def halt(self) -> list[Event]:
        return self.send(cmd.HaltJob(reason="halted through the API"), API, after_s=1.0)

    def resume(self, after_s: float = 30.0) -> list[Event]:
        return self.send(cmd.ResumeJob(), API, after_s=after_s)

    def cancel(self, reason: str = "cancelled through the API") -> list[Event]:
        return self.send(cmd.CancelJob(reason=reason), API, after_s=1.0)

    # -- scheduler --------------------------------------------------------------------------------

    def wait_for(
        self, code: WaitReason, detail: str, *, token: int, waiting_for: tuple[str, ...] = ()
    ) -> list[Event]:
        data = cmd.RecordWaitReason(code=code, detail=detail, waiting_for=waiting_for)
        return self.send(data, SCHEDULER, token)

    def allocate(self, *, token: int, after_s: float = 0.2) -> list[Event]:
        gpus = self.spec.learners * self.spec.gpus
        data = cmd.AllocateGpus(
            placement=self.placement(), reason=f"{gpus} GPU(s) free on {', '.join(self.nodes)}"
        )
        return self.send(data, SCHEDULER, token, after_s=after_s)

    def preempt(self, *, token: int, by: str) -> list[Event]:
        data = cmd.HaltJob(reason=f"preempted for higher-priority job {by}", requeue=True)
        return self.send(data, SCHEDULER, token)

    def evacuate(self, why: str, *, token: int) -> list[Event]:
        """Halt the job to requeue it because of its node (``why``: drained, left the inventory)."""
        data = cmd.HaltJob(reason=f"{why}: halted to resume elsewhere from its checkpoint", requeue=True)
        return self.send(data, SCHEDULER, token)

    # -- reactor ----------------------------------------------------------------------------------

    def relaunch(self, after_s: float) -> list[Event]:
        """The next attempt after a restart's backoff (the owner launches the first one with the GPUs)."""
        attempt = next_attempt(self.job)
        assert attempt is not None, f"no launch is due for {self.job_id} in {self.job.state}"
        return self.send(cmd.BeginLaunch(attempt=attempt), REACTOR, after_s=after_s)

    def release(self) -> list[Event]:
        return self.send(cmd.ReleaseGpus(), REACTOR, after_s=0.5)

    def finish_storing(self) -> list[Event]:
        result = ResultSummary(
            result_dir=f"s3://results/{self.tenant}/{self.job_id}",
            files=3,
            size_bytes=48_213_992,
            metrics=_metrics(self.steps_done),
        )
        return self.send(cmd.FinishStoring(result=result), REACTOR, after_s=2.0)

    # -- monitor (learner agents' heartbeats) -----------------------------------------------------

    def start_learners(self) -> list[Event]:
        events = []
        for rank in range(self.spec.learners):
            self.pids += 1
            host = self.nodes[rank % len(self.nodes)]
            data = cmd.ReportLearnerStarted(rank=rank, attempt=self.job.attempt, pid=self.pids, host=host)
            events += self.send(data, MONITOR, after_s=1.5 if rank == 0 else 0.1)
        return events

    def train(self, steps: int) -> list[Event]:
        """``steps`` more steps on every learner, reporting progress and checkpoints as they go."""
        events = []
        for _ in range(steps // self.report_every):
            self.steps_done += self.report_every
            for rank in range(self.spec.learners):
                data = cmd.ReportProgress(
                    rank=rank,
                    attempt=self.job.attempt,
                    step=self.steps_done,
                    metrics=_metrics(self.steps_done),
                )
                events += self.send(
                    data, MONITOR, after_s=self.step_s * self.report_every if rank == 0 else 0.02
                )
            if self.steps_done % self.checkpoint_every == 0:
                events += self.checkpoint()
        return events

    def checkpoint(self) -> list[Event]:
        uri = f"s3://checkpoints/{self.tenant}/{self.job_id}/step-{self.steps_done:06d}"
        checkpoint = Checkpoint(
            rank=0,
            attempt=self.job.attempt,
            step=self.steps_done,
            uri=uri,
            size_bytes=104_857_600 + self.steps_done,
            checksum="sha256:" + hashlib.sha256(uri.encode()).hexdigest()[:32],
        )
        return self.send(cmd.ReportCheckpoint(checkpoint=checkpoint), MONITOR, after_s=0.3)

    def exit(self, rank: int, code: int, after_s: float = 0.2, attempt: int | None = None) -> list[Event]:
        """Learner ``rank`` of ``attempt`` (default: the current one) exited with ``code``."""
        data = cmd.ReportLearnerExited(rank=rank, attempt=attempt or self.job.attempt, exit_code=code)
        return self.send(data, MONITOR, after_s=after_s)

    def exit_all(self, code: int = 0) -> list[Event]:
        return [event for rank in range(self.spec.learners) for event in self.exit(rank, code)]

    def lose(self, rank: int, reason: LossReason) -> list[Event]:
        data = cmd.ReportLearnerLost(
            rank=rank, attempt=self.job.attempt, reason=reason, detail=f"no heartbeat from learner {rank}"
        )
        return self.send(data, MONITOR, after_s=5.0)

    def resume_from_checkpoint(self) -> None:
        """The learners of a new attempt start from the latest checkpoint's step."""
        checkpoint = self.job.latest_checkpoint
        self.steps_done = checkpoint.step if checkpoint else 0

    # -- whole lives ------------------------------------------------------------------------------

    def queue_and_run(self, *, token: int) -> None:
        self.submit()
        self.admit(token=token)
        self.allocate(token=token)
        self.start_learners()

    def complete(self) -> None:
        self.exit_all(0)
        self.finish_storing()
        self.release()


@dataclass
class NodeScript:
    """One node's life as the platform's roles drive it: each method sends what one role would send.

    The scheduler leader (``by``) sends what its inventory source sees, fenced with its ``token``;
    operators cordon, drain and uncordon through the API, unfenced. Every method returns the events
    the owner decided. The wording is the platform's: :func:`ffdl.core.nodes.inventory_changes` and
    the Kubernetes inventory (``NodeInventory``) for the scheduler's observations.
    """

    owner: Owner
    name: str
    spec: nd.NodeSpec
    source: str = "Kubernetes nodes"

    def send(
        self,
        data: NodeCommandData,
        sender: str,
        token: int | None = None,
        after_s: float = 1.0,
        principal: Principal | None = None,
    ) -> list[NodeEvent]:
        self.owner.tick(after_s)
        return self.owner.deliver(self.owner.node_command(self.name, data, sender, token), principal)

    # -- scheduler (its inventory source) ---------------------------------------------------------

    def observe(
        self, *, token: int, cordoned: bool = False, by: str = SCHEDULER, after_s: float = 1.0
    ) -> list[NodeEvent]:
        """The source sees the node ready with ``spec`` (``cordoned``: marked unschedulable there)."""
        data = nd.ObserveNode(
            spec=self.spec,
            cordoned=cordoned,
            reason=f"seen by the {self.source}",
            cordon_reason=f"unschedulable in the {self.source}" if cordoned else "",
        )
        return self.send(data, by, token, after_s)

    def report_lost(
        self, condition: str, *, token: int, by: str = SCHEDULER, after_s: float = 1.0
    ) -> list[NodeEvent]:
        """The source has the node but it is not ready (``condition``: the reason it gives)."""
        data = nd.ReportNodeLost(reason=f"node {self.name} is NotReady ({condition})")
        return self.send(data, by, token, after_s)

    def remove(self, *, token: int, by: str = SCHEDULER, after_s: float = 1.0) -> list[NodeEvent]:
        """The source no longer has the node."""
        return self.send(nd.RemoveNode(reason=f"no longer in the {self.source}"), by, token, after_s)

    # -- operators --------------------------------------------------------------------------------

    def cordon(self, reason: str, *, drain: bool = False, after_s: float = 1.0) -> list[NodeEvent]:
        data = nd.CordonNode(reason=reason, drain=drain)
        return self.send(data, API, after_s=after_s, principal=OPERATOR)

    def uncordon(self, reason: str, after_s: float = 1.0) -> list[NodeEvent]:
        return self.send(nd.UncordonNode(reason=reason), API, after_s=after_s, principal=OPERATOR)


def spec(name: str, *, learners: int = 2, gpus: int = 1, max_restarts: int = 3, priority: int = 0) -> JobSpec:
    return JobSpec(
        name=name,
        command=f"python train.py --model {name} --epochs 10",
        learners=learners,
        gpus=gpus,
        gpu_type="a100",
        cpus=8.0,
        memory_mb=65_536,
        image="pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        framework="pytorch",
        framework_version="2.3",
        data_dir=f"s3://datasets/{name}",
        result_dir=f"s3://results/{name}",
        labels={"team": "vision"},
        priority=priority,
        max_restarts=max_restarts,
        progress_timeout_s=600.0,
    )


# -- the recorded scenarios ------------------------------------------------------------------------

#: What each node of the scenarios offers.
DGX_NODE = nd.NodeSpec(gpus=4, gpu_type="a100", cpus=64.0, memory_mb=524_288)


def observe(owner: Owner, *names: str, token: int) -> None:
    """The scheduler leader records the nodes its inventory source sees, before anything is placed there."""
    for name in names:
        NodeScript(owner, name, DGX_NODE).observe(token=token, after_s=0.0)


def happy_path(owner: Owner) -> None:
    """Two learners train to the end; one progress report is delivered twice (at-least-once), and the
    ``BeginLaunch`` of a reactor of the older platform (during a rolling upgrade) decides nothing."""
    owner.leader_token = 1
    observe(owner, "gpu-node-01", token=1)
    job = JobScript(owner, "mnist-7f3a", "acme", spec("mnist"), nodes=("gpu-node-01",))
    job.submit()
    job.admit(token=1)
    job.wait_for(WaitReason.CAPACITY, "needs 2 GPU(s); 0 free", token=1)
    job.allocate(token=1, after_s=40.0)
    job.send(cmd.BeginLaunch(attempt=1), REACTOR, after_s=0.1)  # launched already: decides nothing
    job.start_learners()
    job.train(100)
    owner.deliver(owner.decided[-2].command)  # a redelivered report decides nothing
    job.train(50)
    job.complete()


def restart_after_kill(owner: Owner) -> None:
    """Learner 1 is killed (exit -9); the gang restarts from the last checkpoint and completes."""
    owner.leader_token = 3
    observe(owner, "gpu-node-02", token=3)
    job = JobScript(
        owner, "resnet-2c91", "acme", spec("resnet50", learners=2, gpus=2), nodes=("gpu-node-02",)
    )
    job.queue_and_run(token=3)
    job.train(120)
    job.exit(1, -9, after_s=4.0)
    job.exit(0, -15, attempt=1)  # the rest of the old attempt stopping: a stale observation
    job.relaunch(after_s=1.0)
    job.resume_from_checkpoint()
    job.start_learners()
    job.train(80)
    job.complete()


def halt_resume(owner: Owner) -> None:
    """A user halts and later resumes a job, which goes on from its checkpoint."""
    owner.leader_token = 2
    observe(owner, "gpu-node-03", token=2)
    job = JobScript(
        owner, "bert-5d10", "globex", spec("bert-base", learners=1, gpus=4), nodes=("gpu-node-03",)
    )
    job.queue_and_run(token=2)
    job.train(100)
    job.halt()
    job.exit(0, -15, after_s=3.0)
    job.release()
    job.resume(after_s=600.0)
    job.allocate(token=2, after_s=0.5)
    job.resume_from_checkpoint()
    job.start_learners()
    job.train(60)
    job.complete()


def cancel(owner: Owner) -> None:
    """A running job is cancelled; late learner exits and a second cancel decide nothing."""
    owner.leader_token = 1
    observe(owner, "gpu-node-01", token=1)
    job = JobScript(owner, "gpt-small-9e4b", "initech", spec("gpt-small", learners=2, gpus=1))
    job.queue_and_run(token=1)
    job.train(40)
    job.cancel()
    job.exit_all(-15)
    job.release()
    job.cancel("again, to be sure")


def max_restarts_failure(owner: Owner) -> None:
    """A learner crashes on every attempt; after ``max_restarts`` restarts the job fails."""
    owner.leader_token = 4
    observe(owner, "gpu-node-01", token=4)
    job = JobScript(owner, "flaky-0a77", "acme", spec("flaky", learners=2, gpus=1, max_restarts=2))
    job.queue_and_run(token=4)
    job.train(30)
    for attempt in range(3):
        job.exit(0, 1, after_s=2.0)
        if attempt < 2:
            job.relaunch(after_s=2.0**attempt)
            job.resume_from_checkpoint()
            job.start_learners()
            job.train(10)
    job.exit(1, -15)  # a stale exit of the failed attempt
    job.release()


def rejected_commands(owner: Owner) -> None:
    """Admission rejects a bad job; illegal commands and a deposed scheduler become ``CommandRejected``,
    another tenant's cancel a dead letter."""
    owner.leader_token = 5
    observe(owner, "gpu-node-01", token=5)
    bad = JobScript(owner, "oversized-1b2c", "acme", spec("oversized", learners=64, gpus=8))
    bad.submit()
    bad.reject("needs 512 GPUs; the largest node set has 64", token=5)
    bad.resume()
    job = JobScript(owner, "vit-3f5e", "acme", spec("vit", learners=1, gpus=1))
    job.submit()
    job.admit(token=5)
    job.allocate(token=4)  # a deposed leader's offer
    job.allocate(token=5)
    job.resume()  # not HALTED
    job.send(cmd.SubmitJob(spec=job.spec), API)  # the id is taken
    foreign = owner.command(job.job_id, "globex", cmd.CancelJob(reason="not mine"), "api@ffdl-1")
    owner.deliver(foreign)  # another tenant's cancel: a dead letter, nothing in the job's history
    job.start_learners()
    job.train(20)
    job.complete()
    job.halt()  # ended already


def preemption(owner: Owner) -> None:
    """A high-priority job preempts a running one, which halts with its checkpoint and requeues."""
    owner.leader_token = 7
    observe(owner, "gpu-node-04", token=7)
    low = JobScript(
        owner, "sweep-44", "globex", spec("sweep", learners=1, gpus=4, priority=0), nodes=("gpu-node-04",)
    )
    low.queue_and_run(token=7)
    low.train(100)
    high = JobScript(
        owner, "urgent-45", "acme", spec("urgent", learners=1, gpus=4, priority=100), nodes=("gpu-node-04",)
    )
    high.submit()
    high.admit(token=7)
    high.send(
        cmd.RecordWaitReason(
            code=WaitReason.PREEMPTION, detail="halting sweep-44 to make room", waiting_for=("sweep-44",)
        ),
        SCHEDULER,
        7,
    )
    low.preempt(token=7, by="urgent-45")
    low.exit(0, -15, after_s=4.0)
    low.release()
    low.wait_for(WaitReason.PRIORITY, "urgent-45 holds the GPUs", token=7, waiting_for=("urgent-45",))
    high.allocate(token=7)
    high.start_learners()
    high.train(50)
    high.complete()
    low.allocate(token=7)
    low.resume_from_checkpoint()
    low.start_learners()
    low.train(50)
    low.complete()


def node_drain(owner: Owner) -> None:
    """An operator drains a node: its job halts with its checkpoint, resumes on the other node and
    completes; the drained node is uncordoned. After a scheduler failover the other node is lost (the
    deposed leader's observation of it is rejected), comes back cordoned in Kubernetes (an operator's
    uncordon is rejected: the inventory lifts its own cordon) and the drained node is retired."""
    owner.leader_token = 8
    node_a = NodeScript(owner, "gpu-node-11", DGX_NODE)
    node_b = NodeScript(owner, "gpu-node-12", DGX_NODE)
    node_a.observe(token=8, after_s=0.0)
    node_b.observe(token=8, after_s=0.0)
    job = JobScript(owner, "llama-ft-8c1d", "acme", spec("llama-ft"), nodes=(node_a.name,))
    job.submit()
    job.admit(token=8)
    job.allocate(token=8)
    job.start_learners()
    job.train(100)
    node_a.cordon("GPU 3 reports uncorrectable ECC errors", drain=True, after_s=30.0)
    job.evacuate(f"node {node_a.name} is being drained", token=8)
    job.exit_all(-15)
    job.release()
    job.nodes = (node_b.name,)
    job.allocate(token=8)
    job.resume_from_checkpoint()
    job.start_learners()
    job.train(50)
    job.complete()
    node_a.uncordon("ECC errors cleared by a GPU reset", after_s=600.0)
    owner.leader_token = 9  # SCHEDULER lost its lease: SCHEDULER_STANDBY leads with token 9
    node_b.report_lost(
        "NodeStatusUnknown: Kubelet stopped posting node status.",
        token=9,
        by=SCHEDULER_STANDBY,
        after_s=120.0,
    )
    node_b.observe(token=8)  # the deposed leader still sees it ready: rejected
    node_b.observe(token=9, cordoned=True, by=SCHEDULER_STANDBY, after_s=300.0)  # back, kubectl-cordoned
    node_b.uncordon("maintenance is over")  # rejected: the inventory's cordon is lifted at the source
    node_b.observe(token=9, by=SCHEDULER_STANDBY, after_s=60.0)  # kubectl uncordon
    node_a.remove(token=9, by=SCHEDULER_STANDBY, after_s=3600.0)  # retired: deleted from the cluster


def _placed(node: str, *gpus: int) -> cmd.AllocateGpus:
    """An allocation of a one-learner job to ``gpus`` of ``node``."""
    learner = LearnerPlacement(rank=0, node=node, gpus=gpus, gpu_type="a100")
    return cmd.AllocateGpus(placement=Placement(learners=(learner,)), reason="forged")


def forged_commands(owner: Owner) -> None:
    """Hostile senders try what is not theirs, and the owner refuses each (a refusal of what would
    create a job, or of a tenant's command to another's job or to a node, is a dead letter, so it
    records nothing): a tenant's allocation, the scheduler's
    without its token, an admin's and a platform role's with the leader's token, placements on a GPU
    another job holds, on a node the inventory does not have, on a GPU the node lacks and on a
    cordoned node, another tenant's cancel naming the job's tenant, a tenant's preempting halt and
    learner report, a tenant's drain, a removal by an unknown producer and a submission in another
    tenant's name. The jobs get their GPUs from the scheduler; no GPU is held twice."""
    owner.leader_token = 6
    observe(owner, "gpu-node-21", "gpu-node-22", token=6)
    NodeScript(owner, "gpu-node-22", DGX_NODE).cordon("kept for maintenance")
    one_learner = {"learners": 1, "gpus": 2}
    mine = JobScript(owner, "train-a1", "acme", spec("train-a", **one_learner), nodes=("gpu-node-21",))
    theirs = JobScript(
        owner, "train-b2", "globex", spec("train-b", **one_learner), nodes=("gpu-node-21",), gpu_offset=2
    )
    for job in (mine, theirs):
        job.submit()
        job.admit(token=6)
    allocation = cmd.AllocateGpus(placement=mine.placement(), reason="forged")
    mine.send(allocation, API, principal=Principal.tenant("acme"))
    mine.send(allocation, SCHEDULER)  # no fencing token
    mine.send(allocation, API, 6, principal=OPERATOR)
    mine.send(allocation, REACTOR, 6)
    mine.allocate(token=6)
    for forged in (
        _placed("gpu-node-21", 1, 2),  # GPU 1 is mine's
        _placed("gpu-node-99", 0, 1),  # no such node
        _placed("gpu-node-21", 4, 5),  # it has 4 GPUs
        _placed("gpu-node-22", 0, 1),  # cordoned
    ):
        theirs.send(forged, SCHEDULER, 6)
    foreign = owner.command(mine.job_id, "acme", cmd.CancelJob(reason="not mine"), "api@ffdl-1")
    owner.deliver(
        foreign, Principal.tenant("globex")
    )  # the body names the job's tenant; the sender is not it
    mine.send(cmd.HaltJob(reason="make room", requeue=True), API, principal=Principal.tenant("acme"))
    exited = cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0)
    mine.send(exited, API, principal=Principal.tenant("acme"))
    drain = nd.CordonNode(reason="mine now", drain=True)
    NodeScript(owner, "gpu-node-21", DGX_NODE).send(drain, API, principal=Principal.tenant("acme"))
    NodeScript(owner, "gpu-node-21", DGX_NODE).send(nd.RemoveNode(reason="gone"), "intruder")
    stolen = owner.command("stolen-c3", "globex", cmd.SubmitJob(spec=spec("stolen")), API)
    owner.deliver(stolen, Principal.tenant("acme"))  # creates nothing: a dead letter
    theirs.allocate(token=6)
    for job in (mine, theirs):
        job.start_learners()
        job.cancel()
        job.exit_all(-15)
        job.release()


#: Each scenario as today's platform tells it, with its owner's restart policy.
SCENARIOS: dict[str, tuple[Callable[[Owner], None], RestartPolicy]] = {
    "happy_path_specs_and_reports_v2": (happy_path, RestartPolicy()),
    "restart_after_kill_specs_and_reports_v2": (
        restart_after_kill,
        RestartPolicy(base_s=1.0, factor=2.0, max_backoff_s=60.0),
    ),
    "halt_resume_halts_v3": (halt_resume, RestartPolicy()),
    "cancel_specs_and_reports_v2": (cancel, RestartPolicy()),
    "max_restarts_failure_specs_and_reports_v2": (
        max_restarts_failure,
        RestartPolicy(base_s=0.5, factor=3.0, max_backoff_s=30.0),
    ),
    "rejected_commands_halts_v3": (rejected_commands, RestartPolicy()),
    "preemption_halts_v3": (preemption, RestartPolicy()),
    "node_drain_halts_v3": (node_drain, RestartPolicy()),
    "forged_commands_halts_v3": (forged_commands, RestartPolicy()),
}
#: The instant every golden log starts at.
START = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)


def positioned(events: Iterable[AnyEvent], partitions: int = PARTITIONS) -> Iterator[LoggedEvent]:
    """``events`` in append order, each at the offset its key's partition would give it."""
    next_offset: dict[int, int] = {}
    for event in events:
        partition = partition_for(event.key, partitions)
        offset = next_offset.get(partition, 0)
        next_offset[partition] = offset + 1
        yield LoggedEvent(event, partition, offset)


def job_summary(job: Job) -> dict[str, Any]:
    """What a golden log's case file pins of each job's folded state."""
    latest = job.latest_checkpoint
    return {
        "state": str(job.state),
        "seq": job.seq,
        "attempt": job.attempt,
        "restarts": job.restarts,
        "states": [str(entry.state) for entry in job.history],
        "holds_gpus": job.placement is not None,
        "latest_checkpoint_step": latest.step if latest else None,
        "failure_code": str(job.failure_code) if job.failure_code else None,
    }


def node_summary(node: NodeRecord) -> dict[str, Any]:
    """What a golden log's case file pins of each node's folded state."""
    cordon = node.cordon
    return {
        "status": str(node.status),
        "seq": node.seq,
        "spec": node.spec.model_dump(mode="json"),
        "cordon": None
        if cordon is None
        else {"reason": cordon.reason, "source": str(cordon.source), "drain": cordon.drain},
    }


# -- generated logs: many jobs through realistic lives, for the replay benchmark and the bus tests ----

#: Lanes of two GPUs each that run jobs back to back, interleaved in time.
LANES = 64
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")
#: Bumped whenever the generated log changes, so a cached file of an older shape is not reused.
GENERATED_LOG_VERSION = 3
#: What each lane's node offers: its two GPUs.
LANE_NODE = nd.NodeSpec(gpus=2, gpu_type="a100", cpus=16.0, memory_mb=131_072)


@dataclass
class Budget:
    """How many events the writer has taken so far; lanes start no new job once it reaches ``target``."""

    target: int
    taken: int = 0

    @property
    def spent(self) -> bool:
        return self.taken >= self.target


def _completes(job: JobScript, rng: random.Random) -> None:
    job.train(rng.randrange(100, 400, 10))
    job.complete()


def _restarts_after_kill(job: JobScript, rng: random.Random) -> None:
    job.train(rng.randrange(60, 200, 10))
    job.exit(1, -9, after_s=3.0)
    job.relaunch(after_s=2.0)
    job.resume_from_checkpoint()
    job.start_learners()
    _completes(job, rng)


def _restarts_after_hang(job: JobScript, rng: random.Random) -> None:
    job.train(rng.randrange(60, 200, 10))
    job.lose(0, LossReason.HUNG)
    job.relaunch(after_s=2.0)
    job.resume_from_checkpoint()
    job.start_learners()
    _completes(job, rng)


def _halted_and_resumed(job: JobScript, rng: random.Random) -> None:
    job.train(rng.randrange(50, 200, 10))
    job.halt()
    job.exit_all(-15)
    job.release()
    job.resume(after_s=rng.uniform(60, 600))
    job.allocate(token=1)
    job.resume_from_checkpoint()
    job.start_learners()
    _completes(job, rng)


def _cancelled(job: JobScript, rng: random.Random) -> None:
    job.train(rng.randrange(20, 200, 10))
    job.cancel()
    job.exit_all(-15)
    job.release()


def _fails(job: JobScript, rng: random.Random) -> None:
    for _ in range(job.spec.max_restarts):
        job.train(rng.randrange(10, 60, 10))
        job.exit(0, 1, after_s=2.0)
        job.relaunch(after_s=2.0)
        job.resume_from_checkpoint()
        job.start_learners()
    job.train(10)
    job.exit(0, 1)
    job.release()


def _meets_a_rejection(job: JobScript, rng: random.Random) -> None:
    job.resume(after_s=5.0)  # not HALTED: rejected
    _completes(job, rng)


#: (weight, life after the job runs) of the generated jobs.
LIVES: tuple[tuple[int, Callable[[JobScript, random.Random], None]], ...] = (
    (60, _completes),
    (10, _restarts_after_kill),
    (5, _restarts_after_hang),
    (10, _halted_and_resumed),
    (5, _cancelled),
    (5, _fails),
    (5, _meets_a_rejection),
)


def lane(index: int, budget: Budget) -> Iterator[AnyEvent]:
    """One lane's jobs back to back on its own node of two GPUs, each a life drawn from :data:`LIVES`."""
    rng = random.Random(index)
    owner = Owner(f"replay-bench-{index}", START + timedelta(seconds=index * 7.3))
    owner.leader_token = 1
    node = f"gpu-node-{index:03d}"
    NodeScript(owner, node, LANE_NODE).observe(token=1, after_s=0.0)
    weights, lives = zip(*LIVES, strict=True)
    number = 0
    while not budget.spent:
        number += 1
        job_id = f"job-{index:03d}-{number:05d}"
        job = JobScript(
            owner,
            job_id,
            rng.choice(TENANTS),
            spec(f"model-{number % 17}", max_restarts=2),
            nodes=(node,),
        )
        job.submit()
        job.admit(token=1)
        if rng.random() < 0.3:
            job.wait_for(WaitReason.CAPACITY, "needs 2 GPU(s); 0 free on its lane", token=1)
        job.allocate(token=1, after_s=rng.uniform(0.1, 30.0))
        job.start_learners()
        rng.choices(lives, weights)[0](job, rng)
        yield from owner.drain(job_id)
        owner.tick(rng.uniform(1.0, 20.0))


def generated_events(target: int, lanes: int = LANES) -> Iterator[AnyEvent]:
    """A log of ``lanes`` lanes merged by time: at least ``target`` events, every job ended."""
    budget = Budget(target)
    for event in heapq.merge(*(lane(i, budget) for i in range(lanes)), key=lambda e: e.occurred_at):
        budget.taken += 1
        yield event


def write_generated_log(path: Path, target: int, lanes: int = LANES) -> int:
    """Write :func:`generated_events` to ``path`` as an exported log; returns how many events it holds."""
    with path.open("w", encoding="utf-8") as out:
        return write_log(positioned(generated_events(target, lanes)), out, EVENTS_TOPIC)


def record(name: str, directory: Path = GOLDEN_DIR) -> list[Path]:
    """Run scenario ``name`` and write its three files; refuses to overwrite a recorded log."""
    script, policy = SCENARIOS[name]
    paths = [directory / f"{name}.{suffix}" for suffix in ("commands.jsonl", "events.jsonl", "case.json")]
    existing = [str(path) for path in paths if path.exists()]
    if existing:
        raise FileExistsError(f"golden logs are never rewritten: {', '.join(existing)}")
    owner = Owner(name, START, policy)
    script(owner)
    commands = [decided_line(item) for item in owner.decided]
    events = [encode_line(logged, EVENTS_TOPIC) for logged in positioned(owner.events)]
    case: dict[str, Any] = {
        "description": " ".join((script.__doc__ or "").split()),
        "restart_policy": asdict(policy),
        "jobs": {job_id: job_summary(job) for job_id, job in sorted(owner.jobs.items())},
    }
    if owner.nodes:  # a log of jobs alone has no nodes to pin, as before the inventory was on the log
        case["nodes"] = {name: node_summary(node) for name, node in sorted(owner.nodes.items())}
    paths[0].write_text("".join(f"{line}\n" for line in commands))
    paths[1].write_text("".join(f"{line}\n" for line in events))
    paths[2].write_text(json.dumps(case, indent=2, sort_keys=True) + "\n")
    return paths


if __name__ == "__main__":
    for scenario in sys.argv[1:] or sorted(SCENARIOS):
        for written in record(scenario):
            print(written)
