"""The scheduling policies users know, run over the same simulated cluster as ffdl's planner.

``ffdl simulate --compare`` runs a trace through each of these beside :func:`ffdl.core.simulation.simulate`,
on the same nodes with the same gang placement (:class:`~ffdl.core.cluster.ClusterRoom`), so the
figures differ by the decisions alone. They are small policies, not copies of the planner: no
tenants' quotas, no reasons, no reservations.

* ``fifo``: first come, first served without backfill (YARN's capacity scheduler): the oldest
  waiting job that does not fit blocks every job behind it.
* ``backfill``: greedy first fit in arrival order, without reservations: any job that fits runs,
  so a big job may wait while small ones keep passing it.
* ``las``: Tiresias' discretised two-dimensional least-attained-service (Gu et al., NSDI 2019):
  jobs in queues by the GPU-seconds they have had (thresholds :data:`LAS_THRESHOLDS`), FIFO
  within a queue, and a waiting job preempts running jobs of a lower queue, never of its own. A
  job that does not fit, even by preempting, holds up none behind it that fits: the GPUs are
  filled down the order, as Tiresias fills them.
* ``oracle``: shortest remaining time first, knowing every runtime: a waiting job preempts running
  jobs with more time left. It is a bound on what a scheduler that cannot see the future may
  reach, not a rival.

A preemption costs what it costs ffdl's jobs: the job holds its GPUs ``halt_s`` longer doing no
work (it writes its checkpoint, then restores it), counted in ``lost_gpu_seconds``. Here the
GPUs are given back at once and the halt is added to the job's remaining work, which costs the
cluster the same GPU-time without a stopping state.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import count

from ffdl.core.allocator import Node, PlacementPolicy
from ffdl.core.cluster import ClusterRoom, Demand, Gang
from ffdl.core.simulation import JobOutcome, SimulationResult, TraceJob

BASELINES = ("fifo", "backfill", "las", "oracle")
#: Tiresias' queue thresholds in GPU-seconds attained (two queues, as its evaluation and the
#: Pollux artifact run it): a job moves to the lower queue after 16 GPU-hours.
LAS_THRESHOLDS: tuple[float, ...] = (16 * 3600.0,)

_ARRIVE, _END, _CROSS = 1, 0, 2  # ends first at the same instant, so their GPUs are free


Key = tuple[float, int]


@dataclass(slots=True)
class _Job:
    trace: TraceJob
    demand: Demand
    order: int  # arrival order: the tie-breaker everywhere
    outcome: JobOutcome
    remaining: float
    attained: float = 0.0  # GPU-seconds run before the current run
    level: int = 0  # las: the queue, by attained service
    since: float = 0.0  # when the current run began
    gang: Gang | None = None
    generation: int = 0
    rank: Key = (0.0, 0)  # while running: its place among the running jobs (see _Baseline.ranked)


@dataclass(slots=True)
class _Baseline:
    name: str
    room: ClusterRoom
    halt_s: float
    result: SimulationResult
    waiting: dict[Demand, list[tuple[Key, _Job]]] = field(default_factory=dict)
    running: dict[int, _Job] = field(default_factory=dict)
    #: las, oracle: the running jobs in order of service, as (rank, job order); a waiting job may
    #: preempt those ranked after it. A rank changes only at events (las: a job changes queue;
    #: oracle: it is its end time, and every remaining time shrinks alike)
    ranked: list[Key] = field(default_factory=list)
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    jobs: list[_Job] = field(default_factory=list)
    in_use: int = 0
    waiting_gpus: int = 0  # asked for by the waiting jobs
    #: demand -> the best key that found no room even by preempting, while nothing started or stopped
    hopeless: dict[Demand, Key] = field(default_factory=dict)

    @property
    def preemptive(self) -> bool:
        return self.name in ("las", "oracle")

    def key(self, job: _Job) -> Key:
        """A waiting job's order of service, lower first: arrival (fifo, backfill), the queue by
        attained service then arrival (las), or the remaining time (oracle)."""
        if self.name == "las":
            return (float(job.level), job.order)
        if self.name == "oracle":
            return (job.remaining, job.order)
        return (0.0, job.order)

    def threshold(self, key: Key, now: float) -> Key:
        """The bound past which running jobs are victims of a waiting job of ``key`` (those ranked
        after it): oracle, those that would end after it; las, those of a lower queue only (from
        the next queue's first rank on), as Tiresias preempts: a running job of the waiting job's
        own queue is no victim, however much later it arrived."""
        if self.name == "oracle":
            return (key[0] + now, key[1])
        return (key[0] + 1, -1)

    def queue(self, job: _Job) -> None:
        demand = job.demand if self.name != "fifo" else _ONE_QUEUE
        heappush(self.waiting.setdefault(demand, []), (self.key(job), job))
        self.waiting_gpus += job.demand.total_gpus

    def changed(self) -> None:
        self.hopeless.clear()

    def start(self, job: _Job, gang: Gang, now: float) -> None:
        self.room.take(job.demand, gang)
        self.changed()
        job.gang = gang
        job.since = now
        job.generation += 1
        self.running[job.order] = job
        self.in_use += gang.gpus
        if job.outcome.first_start is None:
            job.outcome.first_start = now
        heappush(self.timeline, (now + job.remaining, _END, job.order, job.generation))
        if self.name == "oracle":
            self.rank(job, (now + job.remaining, job.order))
        elif self.name == "las":
            self.rank(job, (float(job.level), job.order))
            if job.level < len(LAS_THRESHOLDS):
                crossing = now + (LAS_THRESHOLDS[job.level] - job.attained) / max(job.demand.total_gpus, 1)
                heappush(self.timeline, (crossing, _CROSS, job.order, job.generation))

    def rank(self, job: _Job, rank: Key) -> None:
        job.rank = rank
        insort(self.ranked, rank)

    def unrank(self, job: _Job) -> None:
        if self.preemptive:
            del self.ranked[bisect_left(self.ranked, job.rank)]

    def cross(self, job: _Job, now: float) -> None:
        """las: a running job has attained its queue's threshold: it moves down one queue."""
        self.unrank(job)
        job.level += 1
        self.rank(job, (float(job.level), job.order))
        self.changed()
        if job.level < len(LAS_THRESHOLDS):
            attained = job.attained + (now - job.since) * job.demand.total_gpus
            crossing = now + (LAS_THRESHOLDS[job.level] - attained) / max(job.demand.total_gpus, 1)
            heappush(self.timeline, (crossing, _CROSS, job.order, job.generation))

    def stop(self, job: _Job, now: float) -> None:
        assert job.gang is not None
        self.room.release(job.demand, job.gang)
        self.changed()
        self.unrank(job)
        self.in_use -= job.gang.gpus
        ran = now - job.since
        job.attained += ran * job.demand.total_gpus
        job.remaining -= ran
        job.gang = None
        del self.running[job.order]

    def preempt(self, job: _Job, now: float) -> None:
        self.stop(job, now)
        job.remaining += self.halt_s
        job.outcome.preemptions += 1
        self.result.lost_gpu_seconds += self.halt_s * job.demand.total_gpus
        self.queue(job)

    def decide(self, now: float) -> None:
        """Each demand's best waiting job in order of service: it starts if it fits (or, for a
        preemptive policy, if preempting jobs served after it makes it fit); a demand that does
        not fit is passed over for the rest of the step (the room only shrinks), and fifo stops
        at the first job that does not fit."""
        heads = [(queue[0][0], demand) for demand, queue in self.waiting.items() if queue]
        heads.sort()
        while heads:
            _, demand = heads.pop(0)
            queue = self.waiting[demand]
            key, job = queue[0]
            gang = self.room.find(job.demand)
            if gang is None and self.preemptive:
                gang = self.make_room(job, key, now)
            if gang is None:
                continue
            heappop(queue)
            self.waiting_gpus -= job.demand.total_gpus
            self.start(job, gang, now)
            if queue:
                insort(heads, (queue[0][0], demand))

    def make_room(self, job: _Job, key: Key, now: float) -> Gang | None:
        """Preempt running jobs served after ``job`` (worst first) until its gang fits; only those
        on the nodes it gets are halted. None, with nothing changed, if it cannot fit so (kept
        until a job starts or stops: a worse key of the same demand cannot fit either)."""
        demand = job.demand
        best_hopeless = self.hopeless.get(demand)
        if best_hopeless is not None and key >= best_hopeless:
            return None
        need = demand.total_gpus
        free = self.room.free_for(demand)
        later = self.ranked[bisect_right(self.ranked, self.threshold(key, now)) :]
        freed: list[_Job] = []
        freed_on: dict[str, int] = {}
        per = demand.gpus
        slots = self.room.slots_with(demand, freed_on, frozenset())  # by GPUs: an upper bound
        gang = None
        for _, order in reversed(later):  # worst served first
            victim = self.running[order]
            assert victim.gang is not None
            freed.append(victim)
            free += victim.gang.gpus
            for node, gpus in victim.gang.learners:
                before = freed_on.get(node, 0)
                freed_on[node] = before + len(gpus)
                room = self.room.room(node)
                if room is not None and per:
                    slots += (len(room.free) + before + len(gpus)) // per - (len(room.free) + before) // per
            if free < need or slots < demand.learners:
                continue  # not even by GPU count: no need to try the placement
            for chosen in freed:
                assert chosen.gang is not None
                self.room.release(chosen.demand, chosen.gang)
            gang = self.room.find(demand)
            for chosen in freed:
                assert chosen.gang is not None
                self.room.take(chosen.demand, chosen.gang)
            if gang is not None:
                break
        if gang is None:
            self.hopeless[demand] = key
            return None
        used = set(gang.nodes)
        for victim in freed:
            assert victim.gang is not None
            if used.intersection(victim.gang.nodes):
                self.preempt(victim, now)
        return self.room.find(demand)


_ONE_QUEUE = Demand(0, 0)  # fifo: every job in one queue, so the first that does not fit blocks the rest


def simulate_baseline(
    name: str,
    trace: Sequence[TraceJob],
    nodes: Sequence[Node],
    *,
    placement: PlacementPolicy | None = None,
    halt_s: float = 30.0,
) -> SimulationResult:
    """Run ``trace`` on ``nodes`` under the baseline ``name`` (:data:`BASELINES`), as
    :func:`~ffdl.core.simulation.simulate` runs it under ffdl's planner; the result reads the same.
    """
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}: one of {', '.join(BASELINES)}")
    room = ClusterRoom(nodes)
    empty = ClusterRoom(nodes)
    capacity = sum(node.gpus for node in nodes if node.schedulable)
    result = SimulationResult([], capacity_gpus=capacity)
    sim = _Baseline(name, room, halt_s, result)
    arrivals = sorted(trace, key=lambda job: (job.submit_time, job.job_id))
    result.first_submit = arrivals[0].submit_time if arrivals else 0.0
    for order, trace_job in enumerate(arrivals):
        outcome = JobOutcome(trace_job)
        demand = Demand(
            trace_job.learners, trace_job.gpus_per_learner, trace_job.gpu_type, policy=placement or "pack"
        )
        job = _Job(trace_job, demand, order, outcome, trace_job.runtime)
        sim.jobs.append(job)
        result.outcomes.append(outcome)
        if empty.find(demand) is None:
            outcome.never_runs = f"{demand.describe()} fits no node set of this cluster, even empty"
        else:
            heappush(sim.timeline, (trace_job.submit_time, _ARRIVE, order, 0))
    now = result.first_submit
    steps = count()
    while sim.timeline:
        at = sim.timeline[0][0]
        result.account(now, at, sim.in_use, sim.waiting_gpus)
        now = at
        while sim.timeline and sim.timeline[0][0] == now:
            _, kind, order, generation = heappop(sim.timeline)
            job = sim.jobs[order]
            if kind == _ARRIVE:
                sim.queue(job)
            elif job.gang is None or job.generation != generation:
                continue  # an end or a crossing of a run that was preempted since
            elif kind == _END:
                sim.stop(job, now)
                job.outcome.end = now
            else:
                sim.cross(job, now)
        sim.decide(now)
        next(steps)
        result.max_gpus_in_use = max(result.max_gpus_in_use, sim.in_use)
        result.usage.append((now, sim.in_use))
    result.cycles = next(steps)
    result.preemptions = sum(outcome.preemptions for outcome in result.outcomes)
    result.last_end = max((o.end for o in result.outcomes if o.end is not None), default=result.first_submit)
    if any(o.end is None and not o.never_runs for o in result.outcomes):
        raise AssertionError(f"baseline {name} left jobs unfinished")  # a bug, never a workload
    return result
