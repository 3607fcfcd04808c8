"""A workload trace through the scheduler's own planning step, in virtual time.

There is no clock and no sleeping: time jumps from one happening (a job arrives, a job ends, a
preempted job has stopped) to the next, and after each the very :class:`~ffdl.core.scheduling.Planner`
that the scheduler role runs decides, with the reasons and reservations it recorded carried to
the next step as the log carries them for the role. A step whose inputs would be those of the
last step, which decided nothing, is passed over (``_Simulator.plan``): the same decisions, fewer
steps.

The model: a job starts the moment it is allocated and runs for its remaining runtime. A
preempted job keeps its GPUs for ``halt_s`` while it writes its checkpoint and stops, loses no
work (it resumes from that checkpoint), and queues again. A job that can never run (its gang fits
no empty cluster, or it needs more than its tenant may ever hold) is reported, not queued.

**Least attained service** (``SchedulerPolicy.service_queues``; :mod:`ffdl.core.service`). The
simulator keeps each job's service as virtual time goes by, and wakes up when a band changes with
nothing else happening (a running job crossing a threshold, a waiting one aging), as the
scheduler role does from its fold. Each halt costs ``halt_s`` on the victim's GPUs.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from typing import Any

from ffdl.core import service as service_bands
from ffdl.core.allocator import Node, PlacementPolicy
from ffdl.core.cluster import MILLI_GPUS, ClusterRoom, ClusterState, Demand, HeldJob, counted
from ffdl.core.collector import cyclic_gc_paused
from ffdl.core.job import WaitRecord
from ffdl.core.preemption import halts_allowed
from ffdl.core.scheduling import Planner, SchedulerPolicy, WaitingJob, WaitingQueue
from ffdl.core.service import Service

_FINISHED = 0  # ends before halts and arrivals at the same instant, so their GPUs are free for the step
_HALTED = 1
_DEMOTED = 2  # a running job has attained its band's threshold (SchedulerPolicy.service_queues)
_AGED = 3  # a job of a lower band has waited SchedulerPolicy.starve_after_s


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One line of a trace: a gang submitted at ``submit_time`` that runs ``runtime`` seconds once started."""

    job_id: str
    submit_time: float
    tenant: str
    learners: int
    gpus_per_learner: int
    runtime: float
    priority: int = 0
    gpu_type: str | None = None

    @property
    def gpus(self) -> int:
        return self.learners * self.gpus_per_learner


@dataclass(slots=True)
class JobOutcome:
    job: TraceJob
    first_start: float | None = None
    end: float | None = None
    preemptions: int = 0
    never_runs: str = ""  # why it can never run here, if so
    last_wait: WaitRecord | None = None


@dataclass(slots=True)
class SimulationResult:
    outcomes: list[JobOutcome]
    capacity_gpus: int
    busy_gpu_seconds: float = 0.0
    max_gpus_in_use: int = 0
    first_submit: float = 0.0
    last_end: float = 0.0
    preemptions: int = 0
    cycles: int = 0
    #: GPU-seconds preempted jobs held their GPUs without working (writing and restoring checkpoints)
    lost_gpu_seconds: float = 0.0
    #: the time a backlog waited (waiting jobs asked for at least the idle GPUs), and the GPU-seconds
    #: held meanwhile: the utilisation an overloaded cluster keeps while it has work to give out
    backlogged_seconds: float = 0.0
    busy_backlogged_gpu_seconds: float = 0.0
    #: after each moment something happened, the GPUs in use (the utilisation curve)
    usage: list[tuple[float, int]] = field(default_factory=list)
    #: with ``record``: after each moment something happened, the GPUs each tenant held on each node
    samples: list[tuple[float, dict[str, dict[str, int]]]] = field(default_factory=list)

    def account(self, since: float, until: float, in_use: int, waiting_gpus: int) -> None:
        """The time from ``since`` to ``until``, with ``in_use`` GPUs held and ``waiting_gpus`` asked
        for by the jobs waiting: a backlog waits while they ask for at least the idle GPUs."""
        span = until - since
        self.busy_gpu_seconds += in_use * span
        if waiting_gpus and waiting_gpus >= self.capacity_gpus - in_use:
            self.backlogged_seconds += span
            self.busy_backlogged_gpu_seconds += in_use * span


@dataclass(slots=True)
class _Running:
    since: float
    remaining: float
    generation: int
    band: int = 0  # with service bands: the one it holds its GPUs in


@dataclass(slots=True)
class _Simulator:
    nodes: Sequence[Node]
    policy: SchedulerPolicy
    placement: PlacementPolicy | None
    halt_s: float
    weigh_all: bool = False
    state: ClusterState = field(init=False)
    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    waiting: WaitingQueue = field(default_factory=WaitingQueue)
    running: dict[str, _Running] = field(default_factory=dict)
    remaining: dict[str, float] = field(default_factory=dict)
    timeline: list[tuple[float, int, str, int]] = field(default_factory=list)
    generation: int = 0
    lost_gpu_seconds: float = 0.0
    #: with service bands: what each job has been served (:mod:`ffdl.core.service`)
    services: dict[str, Service] = field(default_factory=dict)
    aging: dict[str, int] = field(default_factory=dict)  # waiting job of a lower band -> its wake-up
    #: after a step that decided nothing, and while nothing came, went or moved since: which running
    #: jobs might be halted then (:func:`~ffdl.core.preemption.halts_allowed`); else None
    quiet: tuple[tuple[int, int], ...] | None = None
    quiet_at: float = 0.0  # when the step that decided nothing was (while ``quiet`` is not None)
    #: demand -> whether it fits the cluster when empty (a trace asks the same few demands again and again)
    fits_empty: dict[Demand, bool] = field(default_factory=dict)
    #: demand -> the one object of it that every job asking for it shares: the planner's memos are
    #: keyed by demands, and a dict matches an identical key without comparing it field by field
    demands: dict[Demand, Demand] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = ClusterState(self.nodes)

    def queue(self, job: TraceJob, now: float) -> None:
        """Queue ``job`` (again) in its band; one of a lower band wakes up to age."""
        priority = job.priority
        if self.policy.service_queues:
            service = self.services[job.job_id] = service_bands.queued(self.services[job.job_id], now)
            priority = self.band_class(job, service, now)
            wake = service_bands.next_change(self.policy, service, now)
            if wake is not None:
                self.generation += 1
                self.aging[job.job_id] = self.generation
                heappush(self.timeline, (wake, _AGED, job.job_id, self.generation))
        self.waiting.put(WaitingJob(job.job_id, job.tenant, self.demand(job), priority, (now, job.job_id)))

    def band_class(self, job: TraceJob, service: Service, now: float) -> int:
        """The class the planner sees: the job's priority, split into bands, the least served highest."""
        band = service_bands.band(self.policy, service, now)
        return self.policy.band_class(job.priority, band)

    def demand(self, job: TraceJob) -> Demand:
        """The job's demand, the very object every job of an equal one gets (``demands``)."""
        demand = Demand(job.learners, job.gpus_per_learner, job.gpu_type, policy=self.placement or "pack")
        return self.demands.setdefault(demand, demand)

    def arrive(self, job: TraceJob, now: float, empty: ClusterRoom) -> None:
        outcome = self.outcomes[job.job_id] = JobOutcome(job)
        demand = self.demand(job)
        limit = self.policy.tenancy.quota(job.tenant).limit
        fits = self.fits_empty.get(demand)
        if fits is None:
            fits = self.fits_empty[demand] = empty.find(demand) is not None
        if not fits:
            outcome.never_runs = f"{demand.describe()} fits no node set of this cluster, even empty"
        elif limit is not None and (charge := self.state.charge(demand)) > limit * MILLI_GPUS:
            need = counted(charge, demand.total_gpus)
            outcome.never_runs = f"needs {need}; tenant {job.tenant} may hold at most {limit} GPUs"
        else:
            self.remaining[job.job_id] = job.runtime
            self.services[job.job_id] = Service(self.state.charge(demand) / MILLI_GPUS)
            self.queue(job, now)
            self.quiet = None

    def happen(self, kind: int, job_id: str, generation: int, now: float) -> None:
        """What the timeline says happens now; an entry a later change made stale changes nothing
        (a preempted job's first end, the band change of a job that has stopped or started)."""
        running = self.running.get(job_id)
        if kind == _AGED:
            waiting = self.waiting.get(job_id)
            if waiting is not None and self.aging.get(job_id) == generation:
                del self.aging[job_id]
                job = self.outcomes[job_id].job
                self.waiting.put(waiting._replace(priority=self.band_class(job, self.services[job_id], now)))
                self.quiet = None
            return
        if kind == _DEMOTED:
            if running is not None and running.generation == generation:
                self.demote(job_id, running, now)
            return
        if kind == _FINISHED:
            if running is not None and running.generation == generation:
                self.quiet = None
                del self.running[job_id]
                self.state.release(job_id)
                self.outcomes[job_id].end = now
            return
        self.quiet = None
        self.state.release(job_id)
        self.queue(self.outcomes[job_id].job, now)

    def demote(self, job_id: str, running: _Running, now: float) -> None:
        """A running job has crossed a service threshold: it holds its GPUs in the lower band's class."""
        held = self.state.held[job_id]
        if held.stopping:
            return
        job = self.outcomes[job_id].job
        service = self.services[job_id]
        running.band = service_bands.band(self.policy, service, now)
        lower = self.policy.band_class(job.priority, running.band)
        self.state.release(job_id)
        self.state.hold(replace(held, priority=lower))
        self.next_threshold(job_id, running, now)
        if self.quiet is not None and not any(lower < p <= held.priority for p in self.waiting.priorities()):
            # No waiting job is of a class that outranks the job now and did not before: every
            # waiting job may halt it exactly as before, or not, so a step then would have decided
            # nothing too; what it may halt moves on with the time from there as before.
            self.quiet = halts_allowed(self.state, self.quiet_at, self.policy.min_runtime_s)
        else:
            self.quiet = None

    def next_threshold(self, job_id: str, running: _Running, now: float) -> None:
        """Wake up when the running job crosses its band's next threshold, if before it ends."""
        crossing = service_bands.next_change(self.policy, self.services[job_id], now)
        if crossing is not None and crossing < running.since + running.remaining:
            heappush(self.timeline, (crossing, _DEMOTED, job_id, running.generation))

    def plan(self, now: float) -> bool:
        """Plan a step now unless its inputs are those of the last step, which decided nothing: the
        same jobs held, waiting (with the same reasons) and allowed to be halted. The planner reads
        the time only through which jobs may be halted (and, draining by preemption, how long
        each has run), so such a step would decide nothing again: one an entry of the timeline
        made stale wakes up for, say. Whether it planned."""
        quiet = self.quiet is not None and not self.policy.preempt_drains
        if quiet and self.quiet == halts_allowed(self.state, now, self.policy.min_runtime_s):
            return False
        self.step(now)
        return True

    def step(self, now: float) -> None:
        decided = Planner(self.state, self.waiting, now, self.policy, weigh_all=self.weigh_all).run()
        changed = bool(decided.evictions or decided.allocations)
        for eviction in decided.evictions:
            running = self.running.pop(eviction.job_id)
            self.remaining[eviction.job_id] = max(0.0, running.remaining - (now - running.since))
            outcome = self.outcomes[eviction.job_id]
            outcome.preemptions += 1
            if self.policy.service_queues:
                service = self.services[eviction.job_id]
                preemptor = self.outcomes[eviction.preempted_by] if eviction.preempted_by else None
                own = preemptor is not None and preemptor.job.tenant == outcome.job.tenant
                stopped = service_bands.stopped(self.policy, service, now)
                self.services[eviction.job_id] = replace(stopped, preemptions=service.preemptions + (not own))
            self.lost_gpu_seconds += self.halt_s * outcome.job.gpus
            heappush(self.timeline, (now + self.halt_s, _HALTED, eviction.job_id, running.generation))
        for allocation in decided.allocations:
            job_id = allocation.job_id
            self.waiting.remove(job_id)
            self.generation += 1
            remaining = self.remaining[job_id]
            running = self.running[job_id] = _Running(now, remaining, self.generation)
            outcome = self.outcomes[job_id]
            if outcome.first_start is None:
                outcome.first_start = now
            if self.policy.service_queues:
                self.aging.pop(job_id, None)
                service = self.services[job_id] = service_bands.started(
                    self.policy, self.services[job_id], now
                )
                running.band = service_bands.band(self.policy, service, now)
                self.next_threshold(job_id, running, now)
            heappush(self.timeline, (now + remaining, _FINISHED, job_id, self.generation))
        for job_id, wait in decided.waits.items():  # a job not named keeps its reason
            waiting = self.waiting.get(job_id)
            assert waiting is not None
            if wait is not waiting.wait and not wait.same_as(waiting.wait):
                self.waiting.record(job_id, wait)
                changed = True
            self.outcomes[job_id].last_wait = wait
        self.quiet = None if changed else halts_allowed(self.state, now, self.policy.min_runtime_s)
        self.quiet_at = now


def simulate(
    trace: Sequence[TraceJob],
    nodes: Sequence[Node],
    policy: SchedulerPolicy | None = None,
    *,
    placement: PlacementPolicy | None = None,
    halt_s: float = 30.0,
    record: bool = False,
    weigh_all: bool = False,
) -> SimulationResult:
    """Run ``trace`` on ``nodes`` until every job that can run has ended; see the module docstring.
    With ``record`` the result keeps who held which node's GPUs over time (for a report's GPU map);
    with ``weigh_all`` each step weighs every waiting job on its own (the same decisions, slower:
    a baseline for the benchmark)."""
    twice = [job_id for job_id, count in Counter(job.job_id for job in trace).items() if count > 1]
    if twice:  # two of one id became one job, and the other's outcome was lost without a word
        raise ValueError(
            f"job id {twice[0]!r} is in the trace more than once: each job needs an id of its own"
        )
    # a run makes millions of short-lived records and no reference cycle (a test holds that): the
    # collector's passes found nothing and cost 2% of Philly's replay
    with cyclic_gc_paused():
        return _replay(trace, nodes, policy or SchedulerPolicy(), placement, halt_s, record, weigh_all)


def _replay(
    trace: Sequence[TraceJob],
    nodes: Sequence[Node],
    policy: SchedulerPolicy,
    placement: PlacementPolicy | None,
    halt_s: float,
    record: bool,
    weigh_all: bool,
) -> SimulationResult:
    """:func:`simulate`'s run itself, once its trace is found sound."""
    sim = _Simulator(nodes, policy, placement, halt_s, weigh_all)
    empty = ClusterRoom(nodes)
    arrivals = sorted(trace, key=lambda job: (job.submit_time, job.job_id))
    result = SimulationResult([], capacity_gpus=sum(n.gpus for n in nodes if n.schedulable))
    result.first_submit = arrivals[0].submit_time if arrivals else 0.0
    now = result.first_submit
    next_arrival = 0
    in_use = 0
    while next_arrival < len(arrivals) or sim.timeline:
        arrival_at = arrivals[next_arrival].submit_time if next_arrival < len(arrivals) else math.inf
        at = min(arrival_at, sim.timeline[0][0] if sim.timeline else math.inf)
        result.account(now, at, in_use, sim.waiting.gpus)
        now = at
        while sim.timeline and sim.timeline[0][0] == now:
            _, kind, job_id, generation = heappop(sim.timeline)
            sim.happen(kind, job_id, generation, now)
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit_time == now:
            sim.arrive(arrivals[next_arrival], now, empty)
            next_arrival += 1
        if sim.waiting and sim.plan(now):
            result.cycles += 1
        in_use = sum(sim.state.gpus_held.values())
        result.usage.append((now, in_use))
        if record:
            result.samples.append((now, _holdings(sim.state.held.values())))
        result.max_gpus_in_use = max(result.max_gpus_in_use, in_use)
    result.outcomes = [sim.outcomes[job.job_id] for job in arrivals]
    result.preemptions = sum(outcome.preemptions for outcome in result.outcomes)
    result.lost_gpu_seconds = sim.lost_gpu_seconds
    result.last_end = max((o.end for o in result.outcomes if o.end is not None), default=result.first_submit)
    return result


def _holdings(held: Iterable[HeldJob]) -> dict[str, dict[str, int]]:
    """GPUs held per node, per tenant."""
    by_node: dict[str, dict[str, int]] = {}
    for job in held:
        for node, gpus in job.gang.learners:
            tenants = by_node.setdefault(node, {})
            tenants[job.tenant] = tenants.get(job.tenant, 0) + len(gpus)
    return by_node


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (0.0 when there are none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when all values are equal, 1/n when one value has everything."""
    if not values or not any(values):
        return 1.0
    return sum(values, 0.0) ** 2 / (len(values) * sum((v * v for v in values), 0.0))


def _slowdown(outcome: JobOutcome) -> float:
    """Bounded slowdown: time in the system over runtime, runtimes under 10 s counted as 10 s."""
    assert outcome.end is not None
    return (outcome.end - outcome.job.submit_time) / max(outcome.job.runtime, 10.0)


def offered_load(trace: Sequence[TraceJob], capacity_gpus: int) -> float | None:
    """The GPU-time the trace asks for over what the cluster has between its first and last
    submission: 1.0 keeps every GPU busy if the work could be spread evenly. None where every job
    arrives at one instant: all the work at once over no span is no load that can be given as a
    number (0.0 would say the cluster was asked for nothing)."""
    if not trace or capacity_gpus <= 0:
        return 0.0
    span = max(job.submit_time for job in trace) - min(job.submit_time for job in trace)
    if span <= 0:
        return None
    work = sum((job.gpus * job.runtime for job in trace if job.gpus <= capacity_gpus), 0.0)
    return work / (capacity_gpus * span)


def utilization_while_arriving(result: SimulationResult) -> float | None:
    """The GPU-time held between the first and the last submission over the capacity then: the span
    the offered load is measured over, so the two compare (the whole run's utilisation also counts
    the drain-out after the last arrival, when there may be nothing left to run). None where every
    job arrives at one instant, as the offered load: there is no such span."""
    last_submit = max((o.job.submit_time for o in result.outcomes), default=result.first_submit)
    span = last_submit - result.first_submit
    if span <= 0:
        return None
    if result.capacity_gpus <= 0:
        return 0.0
    busy = 0.0
    for (at, in_use), (until, _) in itertools.pairwise([*result.usage, (last_submit, 0)]):
        if at >= last_submit:
            break
        busy += in_use * (min(until, last_submit) - at)
    return busy / (result.capacity_gpus * span)


def _times(outcomes: Sequence[JobOutcome]) -> dict[str, float]:
    delays = [o.first_start - o.job.submit_time for o in outcomes if o.first_start is not None]
    completions = [o.end - o.job.submit_time for o in outcomes if o.end is not None]
    return {
        "jct_mean_s": sum(completions, 0.0) / len(completions) if completions else 0.0,
        "jct_p50_s": percentile(completions, 0.5),
        "jct_p99_s": percentile(completions, 0.99),
        "queue_delay_p50_s": percentile(delays, 0.5),
        "queue_delay_p99_s": percentile(delays, 0.99),
    }


def summarize(result: SimulationResult, load: float | None = None) -> dict[str, Any]:
    """One policy's figures (docs/scheduling.md, "Comparing policies"): job completion time (JCT)
    and queueing delay, utilisation against the offered load (``load``; else measured from the
    result's jobs), makespan, preemptions (the most any one job suffered shows a loop), the
    GPU-hours they lost, fairness (Jain's index over tenants' mean slowdown), each tenant's
    figures with its median slowdown, and the jobs that can never run."""
    outcomes = result.outcomes
    completed = [o for o in outcomes if o.end is not None]
    makespan = result.last_end - result.first_submit
    capacity = result.capacity_gpus * makespan
    by_tenant: dict[str, list[JobOutcome]] = {}
    for outcome in outcomes:
        by_tenant.setdefault(outcome.job.tenant, []).append(outcome)
    tenants = {}
    means = []
    medians = []
    for tenant in sorted(by_tenant):
        mine = by_tenant[tenant]
        slowdowns = [_slowdown(o) for o in mine if o.end is not None]
        mean_slowdown = sum(slowdowns, 0.0) / len(slowdowns) if slowdowns else 0.0
        if slowdowns:
            means.append(mean_slowdown)
            medians.append(percentile(slowdowns, 0.5))
        tenants[tenant] = {
            "jobs": len(mine),
            "completed": len(slowdowns),
            "gpu_hours": sum((o.job.gpus * o.job.runtime for o in mine if o.end is not None), 0.0) / 3600,
            "slowdown_mean": mean_slowdown,
            "slowdown_p50": percentile(slowdowns, 0.5),
            **_times(mine),
        }
    middle = percentile(medians, 0.5)
    return {
        "jobs": len(outcomes),
        "completed": len(completed),
        "never_run": [{"job_id": o.job.job_id, "reason": o.never_runs} for o in outcomes if o.never_runs],
        **_times(outcomes),
        "utilization": result.busy_gpu_seconds / capacity if capacity > 0 else 0.0,
        "utilization_while_arriving": utilization_while_arriving(result),
        "utilization_backlogged": result.busy_backlogged_gpu_seconds
        / (result.capacity_gpus * result.backlogged_seconds)
        if result.backlogged_seconds > 0
        else None,
        "backlogged_s": result.backlogged_seconds,
        "offered_load": offered_load([o.job for o in outcomes], result.capacity_gpus)
        if load is None
        else load,
        "makespan_s": makespan,
        "preemptions": result.preemptions,
        "max_preemptions_per_job": max((o.preemptions for o in outcomes), default=0),
        "lost_gpu_hours": result.lost_gpu_seconds / 3600,
        "fairness": jain_index(means),
        # the worst tenant's median slowdown over the median tenant's (the target: at most 3)
        "tenant_slowdown_spread": max(medians) / middle if middle > 0 else 1.0,
        "max_gpus_in_use": result.max_gpus_in_use,
        "capacity_gpus": result.capacity_gpus,
        "scheduling_cycles": result.cycles,
        "tenants": tenants,
    }
