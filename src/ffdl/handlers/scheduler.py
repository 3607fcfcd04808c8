"""The scheduler role: the one process that sees the whole cluster, admits, hands out GPUs, preempts.

It runs under leader election and folds every partition of the events topic (its consumer group
has one active member): the jobs, and the nodes of the inventory. After each batch it sends, all
with its fencing token (the owners refuse a token that is no longer the leader's):

* node observations (``ObserveNode``, ``ReportNodeLost``, ``RemoveNode``) wherever its inventory
  source (the configuration, the Kubernetes nodes) disagrees with the nodes on the log, so every
  join, cordon, loss and removal is an event; operators' cordons and drains arrive as events too;
* ``AdmitJob`` or ``RejectJob`` for each submitted job, once the log agrees with the source: a job
  that could never fit the inventory (empty, every cordon lifted) is rejected with the reason;
* from one planning step of :mod:`ffdl.core.scheduling` over the present nodes and the folded
  jobs: ``AllocateGpus`` for each gang that fits; ``HaltJob(requeue=True)`` for each job
  preempted, or on a node that left the inventory or is being drained; ``RecordWaitReason`` for
  each waiting job whose reason changed since the one on the log.

Everything it sent counts as done until the owner's answer is on the log (an event whose
``causation_id`` is the command's id) or the job's state makes it moot: an allocation it sent is
held, a preempted job is stopping, a reason is recorded. Waiting for the answer itself, not just
for the job's next event, matters: a job's next event may answer an earlier command (a reason
sent a cycle before), and forgetting the allocation then would let its GPUs be promised twice.
So one GPU is never promised twice, no job is preempted twice, and an unchanged reason is never
sent again. A new
leader starts from the log alone: reservations and preemption claims live in the jobs' recorded
reasons, so it carries on where the old one stopped.

Folding and planning are apart: :meth:`process` only folds a batch and marks a plan due, and
:meth:`plan_forever` plans once for everything folded since its last pass (a fetch brings batches
of several partitions: one plan, not one per batch), and at least every ``SCHEDULE_TICK_S`` even
when nothing arrives, since time alone changes some decisions (minimum runtimes, backoffs, what
the inventory source sees). One lock serialises a planning step with the folding of new records.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from ffdl.core.aggregate import Aggregates, Applied
from ffdl.core.cluster import Admission, ClusterState, Demand, Gang, HeldJob
from ffdl.core.job import Job, WaitRecord
from ffdl.core.kinds import JOBS, NODES
from ffdl.core.nodes import InventoryObservation, inventory_changes, schedulable_inventory
from ffdl.core.scheduling import Plan, SchedulerPolicy, WaitingJob, plan
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events.codec import AnyCommand, AnyEvent
from ffdl.events.envelope import Command, CommandData, Event, NodeCommandData
from ffdl.events.model import ErrorCode, Placement
from ffdl.handlers.messaging import CommandSender, utcnow
from ffdl.handlers.ports import Bus, InventorySource, Record
from ffdl.handlers.runtime import EventFollower

log = structlog.get_logger(__name__)

S = JobState
#: How often the scheduler plans when no event arrives.
SCHEDULE_TICK_S = 1.0
#: The least time between two plans: under a flood of events a pass covers more of them (a pass
#: costs about the same for one event as for a hundred), for at most this much added latency.
MIN_PLAN_INTERVAL_S = 0.02
#: How long a node observation may go unanswered before it is sent again. An observation of a node
#: the log has never had is dropped without an answer when the owner cannot confirm the sender's
#: token (the node has no history to record a refusal in); observations are idempotent, so a
#: repeat costs nothing.
NODE_CHANGE_RESEND_S = 5.0
#: States in which a job holding GPUs may be preempted; in any other it is already on its way out.


@dataclass(frozen=True, slots=True)
class _Sent:
    """A command sent for a job whose owner's answer is not on the log yet."""

    command_id: uuid.UUID
    placement: Placement | None = None
    wait: WaitRecord | None = None
    node_change: NodeCommandData | None = None
    sent_at: float = 0.0


class Scheduler(EventFollower):
    def __init__(
        self,
        bus: Bus,
        events_topic: str,
        sender: CommandSender,
        inventory: InventorySource,
        fencing_token: int,
        *,
        policy: SchedulerPolicy | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        super().__init__(bus, events_topic)
        self._sender = sender
        self._inventory = inventory
        self._token = fencing_token
        self._policy = policy or SchedulerPolicy()
        self._clock = clock
        self._allocations: dict[str, _Sent] = {}
        self._halts: dict[str, _Sent] = {}
        self._reasons: dict[str, _Sent] = {}
        self._admissions: dict[str, _Sent] = {}
        self._node_changes: dict[str, _Sent] = {}
        self._queued_order: dict[str, tuple[float, str]] = {}
        self._submitted: set[str] = set()
        self._holding: set[str] = set()  # jobs whose folded state holds GPUs
        self._admission: Admission | None = None
        self._nodes_folded = 0  # node events folded so far: a version of the folded inventory
        self._inventory_diff: tuple[InventoryObservation, int, dict[str, NodeCommandData]] | None = None
        self._lock = asyncio.Lock()
        self._due = asyncio.Event()  # something was folded since the last plan
        self._demands: dict[str, Demand] = {}  # job -> its gang's demand (a spec never changes)
        self._gangs: dict[str, tuple[Placement, Gang]] = {}  # job -> its placement, as a gang
        self.ready = False  # its partitions are folded: it may plan

    async def loaded(self, partitions: list[int]) -> None:
        for job in self.book.jobs.values():
            self._track(job, None)
        self._node_changes.clear()
        self._admission = self._inventory_diff = None
        self.ready = True
        self._due.set()

    def revoked(self, dropped: Aggregates) -> None:
        for sent in (self._allocations, self._halts, self._reasons, self._admissions, self._queued_order):
            for job_id in [j for j in sent if j not in self.book.jobs]:
                del sent[job_id]
        self._submitted &= self.book.jobs.keys()
        self._holding &= self.book.jobs.keys()
        for cache in (self._demands, self._gangs):
            for job_id in cache.keys() - self.book.jobs.keys():
                del cache[job_id]
        self._node_changes.clear()
        self._admission = self._inventory_diff = None
        self.ready = False

    async def process(self, records: Sequence[Record]) -> None:
        async with self._lock:
            await super().process(records)
        self._due.set()

    async def policy(self, applied: Applied[Any, Any]) -> None:
        self._folded(applied)

    async def plan_forever(self, stop: asyncio.Event, tick_s: float = SCHEDULE_TICK_S) -> None:
        """Plan whenever something was folded, and every ``tick_s`` anyway, until ``stop``."""
        while not stop.is_set():
            due = asyncio.ensure_future(self._due.wait())
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({due, stopping}, timeout=tick_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                due.cancel()
                stopping.cancel()
            self._due.clear()
            if self.ready and not stop.is_set():
                await self.schedule()
                await asyncio.sleep(MIN_PLAN_INTERVAL_S)

    def fold(self, event: AnyEvent, partition: int) -> None:
        """Apply one event of ``partition`` to the jobs and nodes the scheduler knows (duplicates are
        ignored), as :meth:`process` does for a record."""
        applied = self.book.apply(event, partition)
        if applied is not None:
            self._folded(applied)

    def _folded(self, applied: Applied[Any, Any]) -> None:
        node = applied.of(NODES)
        if node is not None:
            self._admission = None  # the inventory changed
            self._nodes_folded += 1
            entry = self._node_changes.get(node.event.node)
            if entry is not None and node.event.causation_id == entry.command_id:
                del self._node_changes[node.event.node]
        job = applied.of(JOBS)
        if job is not None:
            self._track(job.after, job.event)

    def _track(self, job: Job, event: Event | None) -> None:
        """Forget what the owner has answered (``event`` caused by it) or what the job's state settles."""
        for sent in (self._allocations, self._halts, self._reasons, self._admissions):
            entry = sent.get(job.job_id)
            if entry is not None and event is not None and event.causation_id == entry.command_id:
                del sent[job.job_id]
        if job.placement is not None:
            self._holding.add(job.job_id)
        else:
            self._holding.discard(job.job_id)
            self._gangs.pop(job.job_id, None)
        if job.state.terminal:
            self._demands.pop(job.job_id, None)
        if job.state is S.SUBMITTED:
            self._submitted.add(job.job_id)
        else:
            self._submitted.discard(job.job_id)
            self._admissions.pop(job.job_id, None)
        if job.state is not S.QUEUED or job.placement is not None:
            self._allocations.pop(job.job_id, None)
        if not job.state.preemptible:
            self._halts.pop(job.job_id, None)
        if job.state is S.QUEUED:
            entered = job.history[-1]
            self._queued_order.setdefault(job.job_id, (entered.at.timestamp(), job.job_id))
        else:
            self._queued_order.pop(job.job_id, None)
            self._reasons.pop(job.job_id, None)

    def cluster_state(self, now: float) -> ClusterState:
        """The inventory with every GPU held: by the folded jobs and by allocations sent but unanswered.
        Only those jobs are visited, not every job ever folded, so a cycle's cost does not grow with
        the log's history."""
        state = ClusterState(schedulable_inventory(self.book.nodes.values()))
        for job_id in sorted(self._holding | self._allocations.keys()):
            job = self.book.jobs[job_id]
            sent = self._allocations.get(job_id)
            placement = job.placement or (sent.placement if sent else None)
            if placement is None:
                continue
            allocated_at = job.allocated_at if job.placement is not None else None
            stopping = (job.placement is not None and not job.state.preemptible) or job_id in self._halts
            state.hold(
                HeldJob(
                    job_id=job_id,
                    tenant=job.tenant,
                    demand=self._demand(job),
                    priority=job.spec.priority,
                    gang=self._gang(job_id, placement),
                    started_at=allocated_at.timestamp() if allocated_at else now,
                    stopping=stopping,
                )
            )
        return state

    def waiting(self) -> list[WaitingJob]:
        """Queued jobs that hold no GPUs and have no allocation on the way, with their latest reason."""
        waiting = []
        for job_id, order in self._queued_order.items():
            job = self.book.jobs[job_id]
            if job.placement is not None or job_id in self._allocations:
                continue
            waiting.append(
                WaitingJob(
                    job_id,
                    job.tenant,
                    self._demand(job),
                    job.spec.priority,
                    order,
                    self._current_reason(job),
                )
            )
        return waiting

    def _demand(self, job: Job) -> Demand:
        demand = self._demands.get(job.job_id)
        if demand is None:
            demand = self._demands[job.job_id] = Demand.of(job.spec)
        return demand

    def _gang(self, job_id: str, placement: Placement) -> Gang:
        cached = self._gangs.get(job_id)
        if cached is None or cached[0] is not placement:
            cached = self._gangs[job_id] = (placement, Gang.of(placement))
        return cached[1]

    def _current_reason(self, job: Job) -> WaitRecord | None:
        sent = self._reasons.get(job.job_id)
        return sent.wait if sent is not None else job.waiting

    def next_plan(self, now: float) -> tuple[ClusterState, Plan]:
        """What the scheduler would decide at ``now`` from what it has folded (and sent) so far."""
        state = self.cluster_state(now)
        return state, plan(state, self.waiting(), now, self._policy)

    def _inventory_commands(self) -> tuple[list[AnyCommand], bool]:
        """The node observations to send for what the source sees, and whether the log agrees with
        the source (no observation missing or on its way): only then may admission reject a job."""
        seen = self._inventory.observe()
        if seen is None:
            return [], False
        changes = self._changes(seen)
        now = self._clock().timestamp()
        commands: list[AnyCommand] = []
        for name, sent in list(self._node_changes.items()):
            if changes.get(name) != sent.node_change or now - sent.sent_at >= NODE_CHANGE_RESEND_S:
                del self._node_changes[name]  # settled some other way, changed at the source, or unanswered
        for name, change in changes.items():
            if name in self._node_changes:
                continue
            command = self._sender.make(NODES.address(name), change, fencing_token=self._token)
            self._node_changes[name] = _Sent(command.command_id, node_change=change, sent_at=now)
            commands.append(command)
            log.info(
                "inventory change", node=name, change=change.type_name(), command_id=str(command.command_id)
            )
        return commands, not changes

    def _changes(self, seen: InventoryObservation) -> dict[str, NodeCommandData]:
        """:func:`inventory_changes`, asked again only when the source or the folded nodes changed
        (it builds a spec per node, and a busy scheduler plans fifty times a second)."""
        if self._inventory_diff is None or self._inventory_diff[:2] != (seen, self._nodes_folded):
            self._inventory_diff = (seen, self._nodes_folded, inventory_changes(self.book.nodes, seen))
        return self._inventory_diff[2]

    def _admission_commands(self, settled: bool) -> list[AnyCommand]:
        """Admit or reject each submitted job not yet answered; rejecting waits for a settled inventory."""
        if self._admission is None:
            self._admission = Admission(schedulable_inventory(self.book.nodes.values()))
        commands: list[AnyCommand] = []
        for job_id in sorted(self._submitted - self._admissions.keys()):
            job = self.book.jobs[job_id]
            why = self._admission.why_never_fits(job.spec)
            if why is not None and not settled:
                continue
            data: CommandData = (
                cmd.AdmitJob() if why is None else cmd.RejectJob(code=ErrorCode.UNSCHEDULABLE, reason=why)
            )
            commands.append(self._command(job, data))
            self._admissions[job_id] = _Sent(commands[-1].command_id)
            log.info(
                "job admitted" if why is None else "job rejected",
                job_id=job_id,
                reason=why,
                command_id=str(commands[-1].command_id),
            )
        return commands

    async def schedule(self) -> None:
        async with self._lock:
            commands, settled = self._inventory_commands()
            commands.extend(self._admission_commands(settled))
            state, decided = self.next_plan(self._clock().timestamp())
            for eviction in decided.evictions:
                job = self.book.jobs[eviction.job_id]
                commands.append(self._command(job, cmd.HaltJob(reason=eviction.reason, requeue=True)))
                self._halts[job.job_id] = _Sent(commands[-1].command_id)
                log.info(
                    "job preempted",
                    job_id=job.job_id,
                    preempted_by=eviction.preempted_by,
                    reason=eviction.reason,
                    command_id=str(commands[-1].command_id),
                )
            for allocation in decided.allocations:
                job = self.book.jobs[allocation.job_id]
                placement = allocation.gang.placement(state.room)
                commands.append(
                    self._command(job, cmd.AllocateGpus(placement=placement, reason=allocation.reason))
                )
                self._allocations[job.job_id] = _Sent(commands[-1].command_id, placement=placement)
                log.info(
                    "gpus offered",
                    job_id=job.job_id,
                    reason=allocation.reason,
                    command_id=str(commands[-1].command_id),
                )
            for job_id, wait in decided.waits.items():
                job = self.book.jobs[job_id]
                if wait.same_as(self._current_reason(job)):
                    continue
                data = cmd.RecordWaitReason(
                    code=wait.code,
                    detail=wait.detail,
                    waiting_for=wait.waiting_for,
                    reserved_nodes=wait.reserved_nodes,
                )
                commands.append(self._command(job, data))
                self._reasons[job_id] = _Sent(commands[-1].command_id, wait=wait)
                log.debug("job waits", job_id=job_id, code=str(wait.code), detail=wait.detail)
            if commands:
                await self._sender.send(*commands)

    def _command(self, job: Job, data: CommandData) -> Command:
        return self._sender.make(JOBS.address(job.job_id, job.tenant), data, fencing_token=self._token)
