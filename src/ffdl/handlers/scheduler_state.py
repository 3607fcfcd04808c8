"""What the scheduler knows and what it decides from it, apart from fetching and sending.

:class:`SchedulerState` reads the jobs and nodes the scheduler folded (the role's aggregate book),
is told each event folded into them, and keeps what a planning step needs beyond them: the queued
jobs in order, the jobs holding GPUs, the cluster state and the waiting queue a step plans over
(kept between steps and refreshed for the jobs changed since, not rebuilt per step), each job's
demand and gang (a spec never changes, a placement rarely: both are costly to rebuild fifty times
a second), the admission check of the present
inventory, the last diff of the inventory source against the folded nodes, and a ledger
(:class:`~ffdl.handlers.outstanding.Outstanding`) per kind of command sent and not answered yet.
:meth:`SchedulerState.decide` is one planning step: the commands to send now.

It has no asyncio, no clock of its own (one is injected) and sends nothing: the async shell
(:mod:`ffdl.handlers.scheduler`) folds, asks the inventory source, plans and sends; a test or a
replay can drive this alone.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any, Protocol, TypeVar

import structlog
from pydantic import ValidationError

from ffdl.core.aggregate import Address, Aggregates, Applied, CommandEnvelope
from ffdl.core.cluster import MILLI_GPUS, Admission, Charges, ClusterState, Demand, Gang, HeldJob
from ffdl.core.job import Job, WaitRecord
from ffdl.core.kinds import JOBS, NODES
from ffdl.core.nodes import InventoryObservation, inventory_changes, schedulable_inventory
from ffdl.core.scheduling import Plan, SchedulerPolicy, WaitingJob, WaitingQueue, plan
from ffdl.core.service import Service, band, band_changes, service_of
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events.codec import AnyCommand
from ffdl.events.envelope import Command, CommandData, Event, NodeCommandData
from ffdl.events.model import ErrorCode, Placement
from ffdl.handlers.outstanding import Outstanding

log = structlog.get_logger(__name__)

S = JobState
C = TypeVar("C", bound=CommandEnvelope)
P = TypeVar("P")
#: How long a node observation may go unanswered before it is sent again. An observation of a node
#: the log has never had is dropped without an answer when the owner cannot confirm the sender's
#: token (the node has no history to record a refusal in); observations are idempotent, so a
#: repeat costs nothing.
NODE_CHANGE_RESEND_S = 5.0


class CommandMaker(Protocol):
    """What makes the scheduler's commands (a :class:`~ffdl.handlers.messaging.CommandSender`):
    their ids and envelopes, not their sending."""

    def make(self, to: Address[C, P], data: P, *, fencing_token: int | None = None) -> C: ...


class SchedulerState:
    """The scheduler's planning state over the aggregates it folds; see the module's docstring.

    ``clock`` is the wall clock in seconds, as the jobs' events are dated: it is the ``now`` a
    planning step decides at (minimum runtimes, backoffs) and the time the resend rule counts from.
    Commands carry ``fencing_token``, the scheduler's term.
    """

    def __init__(
        self,
        aggregates: Aggregates,
        maker: CommandMaker,
        fencing_token: int,
        *,
        policy: SchedulerPolicy,
        clock: Callable[[], float],
    ) -> None:
        self._jobs = aggregates.of(JOBS)
        self._nodes = aggregates.of(NODES)
        self._maker = maker
        self._token = fencing_token
        self._policy = policy
        self._clock = clock
        self._allocations: Outstanding[Placement] = Outstanding()
        self._halts: Outstanding[None] = Outstanding()
        self._reasons: Outstanding[WaitRecord] = Outstanding()
        self._admissions: Outstanding[None] = Outstanding()
        self._node_changes: Outstanding[NodeCommandData] = Outstanding(
            resend_after_s=NODE_CHANGE_RESEND_S, clock=clock
        )
        self._queued_order: dict[str, tuple[float, str]] = {}
        self._submitted: set[str] = set()
        self._holding: set[str] = set()  # jobs whose folded state holds GPUs
        self._demands: dict[str, Demand] = {}  # job -> its gang's demand (a spec never changes)
        self._gangs: dict[str, tuple[Placement, Gang]] = {}  # job -> its placement, as a gang
        # With service bands (policy.service_queues): job -> ((its history's length, its preemptions,
        # what it counts as), the service they add up to), and when a band changes with no event
        # (a run crossing a threshold, a wait aging): (time, job) to bring up to date at the first
        # step from then.
        self._services: dict[str, tuple[tuple[int, int, int], Service]] = {}
        self._counted: tuple[int, Charges] | None = None  # (nodes folded, what jobs count as then)
        self._band_changes: list[tuple[float, str]] = []
        self._admission: Admission | None = None
        # What a planning step plans over, kept up to date between steps rather than rebuilt for
        # each (None: to rebuild, after a (re)load, a revocation or an inventory change): the jobs
        # whose holding or waiting may have changed since are brought up to date at the next step.
        self._cluster: ClusterState | None = None
        self._queue = WaitingQueue()
        self._changed: set[str] = set()
        self._dated_now: set[str] = set()  # jobs held as of the step's time: refreshed every step
        self._nodes_folded = 0  # node events folded so far: a version of the folded inventory
        self._inventory_diff: tuple[InventoryObservation, int, dict[str, NodeCommandData]] | None = None

    # -- what the shell tells it -----------------------------------------------------------------

    def loaded(self) -> None:
        """The aggregates were (re)loaded from the log: track every job, trust no earlier observation."""
        for job in self._jobs.values():
            self._track(job, None)
        self._forget_inventory()
        self._cluster = None

    def revoked(self) -> None:
        """Some aggregates were forgotten: forget what was kept about them."""
        jobs = self._jobs.keys()
        for ledger in (self._allocations, self._halts, self._reasons, self._admissions):
            ledger.keep_only(jobs)
        for kept in (self._queued_order, self._demands, self._gangs, self._services):
            for job_id in kept.keys() - jobs:
                del kept[job_id]
        self._submitted &= jobs
        self._holding &= jobs
        self._forget_inventory()
        self._cluster = None

    def folded(self, applied: Applied[Any, Any]) -> None:
        """An event was folded into one of the aggregates."""
        node = applied.of(NODES)
        if node is not None:
            self._admission = self._cluster = None  # the inventory changed
            self._nodes_folded += 1
            self._node_changes.answered(node.event.node, node.event.causation_id)
        job = applied.of(JOBS)
        if job is not None:
            self._track(job.after, job.event)

    def _forget_inventory(self) -> None:
        self._node_changes.clear()
        self._admission = self._inventory_diff = None

    def _track(self, job: Job, event: Event | None) -> None:
        """Forget what the owner has answered (``event`` caused by it) or what the job's state settles."""
        self._changed.add(job.job_id)
        if event is not None:
            for ledger in (self._allocations, self._halts, self._reasons, self._admissions):
                ledger.answered(job.job_id, event.causation_id)
        if job.placement is not None:
            self._holding.add(job.job_id)
        else:
            self._holding.discard(job.job_id)
            self._gangs.pop(job.job_id, None)
        if job.state.terminal:
            self._demands.pop(job.job_id, None)
            self._services.pop(job.job_id, None)
        elif self._policy.service_queues:
            self._track_service(job)
        if job.state is S.SUBMITTED:
            self._submitted.add(job.job_id)
        else:
            self._submitted.discard(job.job_id)
            self._admissions.forget(job.job_id)
        if job.state is not S.QUEUED or job.placement is not None:
            self._allocations.forget(job.job_id)
        if not job.state.preemptible:
            self._halts.forget(job.job_id)
        if job.state is S.QUEUED:
            entered = job.history[-1]
            self._queued_order.setdefault(job.job_id, (entered.at.timestamp(), job.job_id))
        else:
            self._queued_order.pop(job.job_id, None)
            self._reasons.forget(job.job_id)

    def _track_service(self, job: Job) -> Service:
        """Bring the job's service up to date with its history (only when that grew: progress
        events leave it as it is) and with what it counts as (which the inventory's totals
        decide: a cordon or a node's status leaves it as it is), and note when its band changes
        next with no event."""
        counts = self._charges().charge(self._demand(job))
        stamp = (len(job.history), job.preemptions, counts)
        kept = self._services.get(job.job_id)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        service = service_of(job, self._policy, counts / MILLI_GPUS)
        self._services[job.job_id] = (stamp, service)
        for at in band_changes(self._policy, service):
            heappush(self._band_changes, (at, job.job_id))
        return service

    def _charges(self) -> Charges:
        """What jobs count as on the folded inventory (as the cluster state the planner gets)."""
        if self._counted is None or self._counted[0] != self._nodes_folded:
            self._counted = (self._nodes_folded, Charges(schedulable_inventory(self._nodes.values())))
        return self._counted[1]

    def _class(self, job: Job, now: float) -> int:
        """The class the planner sees for the job at ``now``: its priority, or with service bands
        its priority split by the band its attained service puts it in."""
        if not self._policy.service_queues or job.job_id not in self._services:
            return job.spec.priority
        return self._policy.band_class(job.spec.priority, band(self._policy, self._track_service(job), now))

    # -- what a planning step sees ---------------------------------------------------------------

    def rebuilt(self, now: float) -> tuple[ClusterState, WaitingQueue]:
        """The cluster state and the waiting queue built afresh from the folded jobs and the commands
        sent but unanswered: the inventory with every GPU held (by the folded jobs and by
        allocations on their way), and the queued jobs that hold no GPUs and have none on the way,
        with their latest reason. Only those jobs are visited, not every job ever folded."""
        self._dated_now.clear()
        state = ClusterState(schedulable_inventory(self._nodes.values()))
        for job_id in sorted(self._holding | self._allocations.keys()):
            held = self._held(job_id, now)
            if held is not None:
                state.hold(held)
        queue = WaitingQueue()
        for job_id in self._queued_order:
            waiting = self._waiting(job_id, now)
            if waiting is not None:
                queue.put(waiting)
        return state, queue

    def _held(self, job_id: str, now: float) -> HeldJob | None:
        """What the job holds, as the planner sees it: its GPUs (folded, or allocated and on their
        way: those date from ``now``) and whether it is being stopped; None if it holds none."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        placement = job.placement or self._allocations.promised(job_id)
        if placement is None:
            return None
        allocated_at = job.allocated_at if job.placement is not None else None
        if allocated_at is None:
            self._dated_now.add(job_id)
        stopping = job.releasing or job_id in self._halts
        return HeldJob(
            job_id=job_id,
            tenant=job.tenant,
            demand=self._demand(job),
            priority=self._class(job, now),
            gang=self._gang(job_id, placement),
            started_at=allocated_at.timestamp() if allocated_at else now,
            stopping=stopping,
        )

    def _waiting(self, job_id: str, now: float) -> WaitingJob | None:
        """The job as the queue holds it, if it waits: queued, with no GPUs and none on the way."""
        order = self._queued_order.get(job_id)
        job = self._jobs.get(job_id)
        if order is None or job is None or job.placement is not None or job_id in self._allocations:
            return None
        return WaitingJob(
            job_id, job.tenant, self._demand(job), self._class(job, now), order, self._current_reason(job)
        )

    def _brought_up_to_date(self, now: float) -> tuple[ClusterState, WaitingQueue]:
        """The kept cluster state and queue with every job changed since the last step (and every
        holding dated from the step's time, and every job whose band changed by then) made as a
        rebuild would make them."""
        while self._band_changes and self._band_changes[0][0] <= now:
            self._changed.add(heappop(self._band_changes)[1])
        if self._cluster is None:
            self._changed.clear()
            self._cluster, self._queue = self.rebuilt(now)
            return self._cluster, self._queue
        state, queue = self._cluster, self._queue
        changed, self._changed = self._changed | self._dated_now, set()
        self._dated_now = set()
        for job_id in sorted(changed):
            held = self._held(job_id, now)
            if state.held.get(job_id) != held:
                state.release(job_id)
                if held is not None:
                    state.hold(held)
            waiting = self._waiting(job_id, now)
            if waiting is None:
                queue.remove(job_id)
            elif queue.get(job_id) != waiting:
                queue.put(waiting)
        return state, queue

    def next_plan(self, now: float) -> tuple[ClusterState, Plan]:
        """What the scheduler would decide at ``now`` from what it has folded (and sent) so far.
        The plan applies its decisions to the kept cluster state; the jobs it decided for are
        brought back in line with what was folded and sent at the next step."""
        state, queue = self._brought_up_to_date(now)
        decided = plan(state, queue, now, self._policy)
        self._changed.update(allocation.job_id for allocation in decided.allocations)
        self._changed.update(eviction.job_id for eviction in decided.evictions)
        return state, decided

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
        sent = self._reasons.promised(job.job_id)
        return sent if sent is not None else job.waiting

    # -- one planning step -----------------------------------------------------------------------

    def decide(self, seen: InventoryObservation | None) -> list[AnyCommand]:
        """One planning step, given what the inventory source sees now (None: it has not listed yet):
        node observations, admissions, then the plan's preemptions, allocations and wait reasons.
        Each command is recorded as outstanding: the caller must send them all."""
        commands, settled = self._inventory_commands(seen)
        commands.extend(self._admission_commands(settled))
        state, decided = self.next_plan(self._clock())
        for eviction in decided.evictions:
            job = self._jobs[eviction.job_id]
            preemptor = self._jobs.get(eviction.preempted_by) if eviction.preempted_by else None
            own = preemptor is not None and preemptor.tenant == job.tenant
            halt = cmd.HaltJob(reason=eviction.reason, requeue=True, for_own_tenant=own)
            commands.append(self._command(job, halt))
            self._halts.sent(job.job_id, commands[-1].command_id, None)
            log.info(
                "job preempted",
                job_id=job.job_id,
                preempted_by=eviction.preempted_by,
                reason=eviction.reason,
                command_id=str(commands[-1].command_id),
            )
        for allocation in decided.allocations:
            job = self._jobs[allocation.job_id]
            placement = allocation.gang.placement(state.room)
            commands.append(
                self._command(job, cmd.AllocateGpus(placement=placement, reason=allocation.reason))
            )
            self._allocations.sent(job.job_id, commands[-1].command_id, placement)
            log.info(
                "gpus offered",
                job_id=job.job_id,
                reason=allocation.reason,
                command_id=str(commands[-1].command_id),
            )
        for job_id, wait in decided.waits.items():
            job = self._jobs[job_id]
            if wait.same_as(self._current_reason(job)):
                continue
            try:
                data = cmd.RecordWaitReason(
                    code=wait.code,
                    detail=wait.detail,
                    waiting_for=wait.waiting_for,
                    reserved_nodes=wait.reserved_nodes,
                )
            except ValidationError as error:
                # A reason the command cannot carry goes unrecorded; raising here ended the step, and
                # the same step again after every restart: nothing was placed for anyone.
                log.error("wait reason not recordable", job_id=job_id, code=str(wait.code), error=str(error))
                continue
            commands.append(self._command(job, data))
            self._reasons.sent(job_id, commands[-1].command_id, wait)
            self._changed.add(job_id)
            log.debug("job waits", job_id=job_id, code=str(wait.code), detail=wait.detail)
        return commands

    def _inventory_commands(self, seen: InventoryObservation | None) -> tuple[list[AnyCommand], bool]:
        """The node observations to send for what the source sees, and whether the log agrees with
        the source (no observation missing or on its way): only then may admission reject a job."""
        if seen is None:
            return [], False
        changes = self._changes(seen)
        self._node_changes.expire()
        for name, change in self._node_changes.items():
            if changes.get(name) != change:
                self._node_changes.forget(name)  # settled some other way, or changed at the source
        commands: list[AnyCommand] = []
        for name, change in changes.items():
            if name in self._node_changes:
                continue
            command = self._maker.make(NODES.address(name), change, fencing_token=self._token)
            self._node_changes.sent(name, command.command_id, change)
            commands.append(command)
            log.info(
                "inventory change", node=name, change=change.type_name(), command_id=str(command.command_id)
            )
        return commands, not changes

    def _changes(self, seen: InventoryObservation) -> dict[str, NodeCommandData]:
        """:func:`inventory_changes`, asked again only when the source or the folded nodes changed
        (it builds a spec per node, and a busy scheduler plans fifty times a second)."""
        if self._inventory_diff is None or self._inventory_diff[:2] != (seen, self._nodes_folded):
            self._inventory_diff = (seen, self._nodes_folded, inventory_changes(self._nodes, seen))
        return self._inventory_diff[2]

    def _admission_commands(self, settled: bool) -> list[AnyCommand]:
        """Admit or reject each submitted job not yet answered; rejecting waits for a settled inventory."""
        if self._admission is None:
            self._admission = Admission(schedulable_inventory(self._nodes.values()))
        commands: list[AnyCommand] = []
        for job_id in sorted(self._submitted - self._admissions.keys()):
            job = self._jobs[job_id]
            why = self._admission.why_never_fits(job.spec)
            if why is not None and not settled:
                continue
            data: CommandData = (
                cmd.AdmitJob() if why is None else cmd.RejectJob(code=ErrorCode.UNSCHEDULABLE, reason=why)
            )
            commands.append(self._command(job, data))
            self._admissions.sent(job_id, commands[-1].command_id, None)
            log.info(
                "job admitted" if why is None else "job rejected",
                job_id=job_id,
                reason=why,
                command_id=str(commands[-1].command_id),
            )
        return commands

    def _command(self, job: Job, data: CommandData) -> Command:
        return self._maker.make(JOBS.address(job.job_id, job.tenant), data, fencing_token=self._token)
