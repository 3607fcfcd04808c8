"""Which waiting gangs get GPUs now, which jobs are preempted for them, and why each other one waits.

One planning step, pure and deterministic: the inputs are the cluster state (nodes, jobs holding
GPUs), the waiting jobs with the reason last recorded for each, the time, and the policy; the
output is a :class:`Plan`. The scheduler role runs it after every batch of events and turns the
plan into commands; the simulator runs the very same step in virtual time.

**Order.** Priority classes from high to low. Within a class: first the jobs whose preemptions
are under way, then the *heads* (below), then the others interleaved by weighted fair share: the
next job comes from the tenant with the fewest GPUs per unit of weight, tenants inside their
guarantee first (:mod:`ffdl.core.tenancy`); within a tenant, first queued first.

**Each job**, in that order:

1. *quota*: it waits if its tenant would exceed guaranteed + borrowing limit;
2. *placement*: the whole gang or nothing (:mod:`ffdl.core.cluster`), never on nodes reserved for
   a job considered before it. Each placement is taken from the room before the next job is
   weighed, so one plan never promises a GPU twice;
3. *preemption*: if halting lower-priority jobs (or, to reclaim its guarantee, borrowers' jobs)
   makes it fit, they are halted and requeued (:mod:`ffdl.core.preemption`) and the nodes it will
   use are reserved for it until they are free; while its victims stop it preempts nobody else;
4. otherwise it waits, with the reason: capacity, fragmentation, GPU type, priority (a
   higher-priority job waits ahead for the same GPUs) or reservation (it would fit, but only on
   nodes kept for a job ahead of it). A recorded priority wait is kept while the job it names
   still waits ahead (:meth:`Planner._still_said`), so it is not renamed whenever the walk meets
   another blocked job of that class first, nor swapped with a reservation and back as jobs end.

**Backfill without starvation** (EASY backfill, without runtimes). In each class, the oldest
waiting jobs that do not fit now (queue order, up to ``max_reservations`` in all) are *heads*: each
gets the fewest nodes that could hold it once empty, those with the most free GPUs first, kept
for it. Every other job of that class or below runs anywhere else (backfill) but never on a head's
nodes, so those nodes only drain, and the head starts at the latest when the jobs already on them
end. A head is never displaced by a younger job: its position in the queue only improves, the
walk that picks heads stops at the first job older heads keep from a reservation, and a head
whose nodes have drained (it fits now) is placed where that walk meets it, before the younger
jobs. The reserved nodes are recorded with the head's reason and kept from cycle to cycle while
they stay valid, so draining is never wasted. Only a higher priority class can overtake a head.

**What a step touches.** The waiting jobs come in a :class:`WaitingQueue` the caller keeps up to
date, not sorted afresh. A job that neither heads nor claims is decided by its class and demand,
where its tenant stands (over its quota, reclaiming its guarantee, or neither) and what the step
has done so far; so until the step does something more (places, preempts, reserves), the next
such jobs, of any tenant that stands alike, get the verdict the last one got, and a tenant's run
of them is passed over at once, yielding only the jobs whose recorded reason says something else.
Where no tenant stands apart (no guarantees, no limits) and verdicts settle every demand of a
class, the tenants left in it are passed over together, so a step over many tenants does not weigh
a job of each; a demand that fits nowhere and could preempt no one gets its verdict without a job
of it weighed, so a class whose jobs all wait (the lowest band, mostly) is passed over whole.
``weigh_all`` weighs every job on its own instead: the same decisions, the baseline.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Collection, Generator, Iterable, Iterator, Set
from dataclasses import dataclass, field
from functools import lru_cache
from heapq import heappop, heappush
from typing import Final, NamedTuple

from ffdl.core.cluster import MILLI_GPUS, ClusterState, Demand, Gang, HeldJob, counted
from ffdl.core.job import WaitRecord
from ffdl.core.preemption import Preemptor, VictimPool, may_halt
from ffdl.core.tenancy import TenancyPolicy, TenantLedger
from ffdl.events.job_events import NAMES_MAX
from ffdl.events.model import WaitReason

# WaitReason's members as constants: compiled, ``WaitReason.X`` is a lookup on the enum class at
# every use, through Python 3.11's ``EnumType.__getattr__`` hook (3.7% of a planning step's time)
_QUOTA: Final = WaitReason.QUOTA
_CAPACITY: Final = WaitReason.CAPACITY
_FRAGMENTATION: Final = WaitReason.FRAGMENTATION
_GPU_TYPE: Final = WaitReason.GPU_TYPE
_PRIORITY: Final = WaitReason.PRIORITY
_RESERVATION: Final = WaitReason.RESERVATION
_PREEMPTION: Final = WaitReason.PREEMPTION
_COMPETING: Final = frozenset({_CAPACITY, _FRAGMENTATION, _GPU_TYPE, _PRIORITY})
#: from how many distinct demands of a tenant a pass over its settled jobs reads them one by one
#: before it looks the end of the run up by demand (Planner._settled_run)
SHORT_RUN = 16


class WaitingJob(NamedTuple):
    """A queued job that holds no GPUs, with the wait reason last recorded for it. (A named tuple:
    a simulation makes one for each of about a million reasons it records, and tuples are made
    fastest.)"""

    job_id: str
    tenant: str
    demand: Demand
    priority: int
    queued_order: tuple[float, str]  # (when it was queued, a tie-breaker): first queued, first served
    wait: WaitRecord | None = None

    def with_wait(self, wait: WaitRecord | None) -> WaitingJob:
        """The job with ``wait`` recorded (what ``_replace`` does, at a fraction of its cost)."""
        return WaitingJob(self.job_id, self.tenant, self.demand, self.priority, self.queued_order, wait)


class WaitingQueue:
    """The waiting jobs as the planner walks them, kept up to date as jobs come and go.

    Per priority class, each tenant's jobs first queued first (by ``queued_order``, then id), and
    the class's *claimants* (jobs whose recorded reason is their own preemption under way) apart:
    a planning step reads the classes and queues as they are instead of sorting every waiting job
    again, and a job whose reason changes moves only if it becomes or stops being a claimant."""

    def __init__(self, jobs: Iterable[WaitingJob] = ()) -> None:
        self._jobs: dict[str, WaitingJob] = {}
        self.gpus = 0  # the GPUs the waiting jobs ask for
        # priority -> tenant -> (queued order, job id) of its waiting jobs, sorted
        self._fifos: dict[int, dict[str, list[QueueKey]]] = {}
        # priority -> (queued order, job id) of every waiting job of the class, sorted: the heads'
        # walk reads it as it is (merging every tenant's queue cost a heap of them per class per step)
        self._orders: dict[int, list[QueueKey]] = {}
        self._claimants: dict[int, set[str]] = {}
        # priority -> the class's jobs whose recorded reason keeps nodes for them: its heads at the
        # last step (:meth:`Planner._heads` places one that fits now before any younger job)
        self._headed: dict[int, set[str]] = {}
        self._demands: dict[int, Counter[Demand]] = {}  # priority -> demand -> how many wait
        # priority -> tenant -> demand -> what its recorded reason says -> (order, job id), sorted:
        # where a planning step finds the jobs whose reason is not the one their kind gets now
        self._by_reason: dict[int, dict[str, dict[Demand, dict[Said, list[QueueKey]]]]] = {}
        for job in jobs:
            self.put(job)

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, job_id: str) -> WaitingJob | None:
        return self._jobs.get(job_id)

    def put(self, job: WaitingJob) -> None:
        """Queue ``job``, or replace the job of that id (its reason changed, say)."""
        old = self._jobs.get(job.job_id)
        if old is not None and (
            old.priority != job.priority
            or old.tenant != job.tenant
            or old.queued_order != job.queued_order
            or old.demand != job.demand
        ):
            self.remove(job.job_id)
            old = None
        self._jobs[job.job_id] = job
        if old is None:
            self.gpus += job.demand.total_gpus
            insort(self._fifos.setdefault(job.priority, {}).setdefault(job.tenant, []), _key(job))
            insort(self._orders.setdefault(job.priority, []), _key(job))
            self._demands.setdefault(job.priority, Counter())[job.demand] += 1
            insort(self._reasons_of(job).setdefault(said(job.wait), []), _key(job))
        elif (was := said(old.wait)) != (now := said(job.wait)):
            reasons = self._reasons_of(job)
            _discard(reasons, was, _key(job))
            insort(reasons.setdefault(now, []), _key(job))
        self._mark(job)

    def record(self, job_id: str, wait: WaitRecord) -> None:
        """Record ``wait`` as the reason of the waiting job ``job_id``: :meth:`put` of the job with
        that reason, without looking for other changes (a simulation records about a million)."""
        old = self._jobs[job_id]
        job = self._jobs[job_id] = old.with_wait(wait)
        was, now = said(old.wait), said(wait)
        if was == now:
            return
        reasons = self._by_reason[job.priority][job.tenant][job.demand]
        key = _key(job)
        _discard(reasons, was, key)
        insort(reasons.setdefault(now, []), key)
        if _marked(was) or _marked(now):
            self._mark(job)

    def _mark(self, job: WaitingJob) -> None:
        """Count ``job`` among its class's claimants or heads as its recorded reason says."""
        claimants = self._claimants.setdefault(job.priority, set())
        headed = self._headed.setdefault(job.priority, set())
        wait = job.wait
        if wait is not None and wait.code is _PREEMPTION:
            claimants.add(job.job_id)
            headed.discard(job.job_id)
        else:
            claimants.discard(job.job_id)
            if wait is not None and wait.reserved_nodes:
                headed.add(job.job_id)
            else:
                headed.discard(job.job_id)

    def remove(self, job_id: str) -> WaitingJob | None:
        job = self._jobs.pop(job_id, None)
        if job is None:
            return None
        self.gpus -= job.demand.total_gpus
        tenants = self._fifos[job.priority]
        fifo = tenants[job.tenant]
        del fifo[bisect_left(fifo, _key(job))]
        order = self._orders[job.priority]
        del order[bisect_left(order, _key(job))]
        counts = self._demands[job.priority]
        counts[job.demand] -= 1
        if not counts[job.demand]:
            del counts[job.demand]
        if not fifo:
            del tenants[job.tenant]
            if not tenants:
                del self._fifos[job.priority]
                del self._orders[job.priority]
                del self._demands[job.priority]
        self._claimants[job.priority].discard(job_id)
        self._headed[job.priority].discard(job_id)
        demands = self._by_reason[job.priority][job.tenant]
        _discard(demands[job.demand], said(job.wait), _key(job))
        if not demands[job.demand]:
            del demands[job.demand]
        return job

    def _reasons_of(self, job: WaitingJob) -> dict[Said, list[QueueKey]]:
        tenants = self._by_reason.setdefault(job.priority, {})
        return tenants.setdefault(job.tenant, {}).setdefault(job.demand, {})

    def by_reason(self, priority: int, tenant: str) -> dict[Demand, dict[Said, list[QueueKey]]]:
        """The tenant's jobs of the class by demand, then by what their recorded reason says
        (:func:`said`), each list in queue order; read only."""
        return self._by_reason.get(priority, {}).get(tenant, {})

    def demands(self, priority: int) -> Collection[Demand]:
        """The demands of the class's waiting jobs, each once; read only."""
        return self._demands.get(priority, {}).keys()

    def priorities(self) -> list[int]:
        """The priority classes with waiting jobs, highest first."""
        return sorted(self._fifos, reverse=True)

    def claimants(self, priority: int) -> list[WaitingJob]:
        """The class's jobs whose preemption is under way, in queue order."""
        claimants = self._claimants.get(priority)
        if not claimants:  # (a set, or nothing: compiled, a set is walked as one, not as any iterable)
            return []
        jobs = [self._jobs[job_id] for job_id in claimants]
        jobs.sort(key=_key)
        return jobs

    def headed(self, priority: int) -> Set[str]:
        """The class's jobs whose recorded reason keeps nodes for them (its heads at the last step);
        read only."""
        return self._headed.get(priority, set())

    def fifos(self, priority: int) -> dict[str, list[QueueKey]]:
        """Each tenant's jobs of the class, first queued first, as (order, job id); read only."""
        return self._fifos.get(priority, {})

    def in_order(self, priority: int) -> Iterator[WaitingJob]:
        """The class's jobs in queue order, whatever their tenant (lazily: a walk may stop early)."""
        jobs = self._jobs
        order = self._orders.get(priority)  # (a list, or nothing: compiled, a list is read by index)
        if order is not None:
            for _, job_id in order:
                yield jobs[job_id]


QueueKey = tuple[tuple[float, str], str]  # (queued order, job id): a job's place in its queue
Grounds = tuple[object, ...]  # what a verdict rests on (see Planner._grounds)
Alike = tuple[int, Demand, str | None, bool]  # the settled jobs that share a verdict (Planner._alike)
Said = tuple[WaitReason, tuple[str, ...], tuple[str, ...]] | None


def said(wait: WaitRecord | None) -> Said:
    """What a reason says, its wording aside (see :meth:`WaitRecord.same_as`); None for no reason."""
    return None if wait is None else (wait.code, wait.waiting_for, wait.reserved_nodes)


def _marked(says: Said) -> bool:
    """Whether a reason that says ``says`` counts its job among the claimants or heads
    (:meth:`WaitingQueue._mark`): a job whose reason says neither before nor after a change
    stays out of both."""
    return says is not None and (says[0] is _PREEMPTION or bool(says[2]))


def _key(job: WaitingJob) -> QueueKey:
    return (job.queued_order, job.job_id)


def _past(fifo: list[QueueKey], at: int, first: Set[str]) -> int:
    """The position of the first job in ``fifo`` from ``at`` on that is not in ``first``."""
    if first:
        while at < len(fifo) and fifo[at][1] in first:
            at += 1
    return at


def _discard(reasons: dict[Said, list[QueueKey]], what: Said, key: QueueKey) -> None:
    keys = reasons[what]
    del keys[bisect_left(keys, key)]
    if not keys:
        del reasons[what]


@dataclass(frozen=True, slots=True)
class SchedulerPolicy:
    tenancy: TenancyPolicy = field(default_factory=TenancyPolicy)
    preemption: bool = True
    min_runtime_s: float = 60.0  # a job runs at least this long between being given GPUs and a preemption
    max_reservations: int = 2  # jobs waiting for capacity that get nodes reserved (backfill around them)
    #: a head of several nodes preempts jobs on them (halted with a checkpoint) instead of waiting for
    #: them to end when the drain would idle more GPU-time than the halts lose (Planner._preempt_drain);
    #: off by default: on the Philly trace it raises the mean JCT (docs/scheduling.md, "Results")
    preempt_drains: bool = False
    #: the GPU-seconds per GPU one halt and resume costs: writing the checkpoint, reading it back
    checkpoint_cost_s: float = 120.0
    #: least attained service within a class (Tiresias' discretised LAS, :mod:`ffdl.core.service`):
    #: the thresholds in GPU-seconds a job has run that split each class into bands, the least
    #: served first (empty: off; the configuration's default is 1 and 16 GPU-hours)
    service_queues: tuple[float, ...] = ()
    #: aging: a job of a lower band that has waited this long moves to the top band again (three
    #: days: an aged job starts its service afresh and is soon halted again by newcomers, so aging
    #: after a day cost long jobs a day's wait per few hours of running; docs/scheduling.md, "Aging")
    starve_after_s: float = 3 * 24 * 3600.0
    #: a loop guard: a job preempted this often by the bands is no longer moved down while it runs
    max_service_preemptions: int = 16

    def band_class(self, priority: int, band: int) -> int:
        """The class the planner sees for a job of ``priority`` in service ``band``: each priority
        class split into its bands, the least served (band 0) highest, below every band of a higher
        priority. Without bands, the priority itself."""
        bands = len(self.service_queues)
        return priority * (bands + 1) + bands - band

    def class_rank(self, planner_class: int) -> tuple[int, int]:
        """The priority and the band a class of :meth:`band_class` stands for."""
        bands = len(self.service_queues)
        return planner_class // (bands + 1), bands - planner_class % (bands + 1)

    def describe_band(self, band: int) -> str:
        """How much GPU time a band stands for, in the user's words."""
        if band == 0:
            return f"run under {self.service_queues[0] / 3600:g} GPU-hours"
        return f"run over {self.service_queues[band - 1] / 3600:g} GPU-hours"


@dataclass(frozen=True, slots=True)
class Allocation:
    job_id: str
    gang: Gang
    reason: str


@dataclass(frozen=True, slots=True)
class Eviction:
    """A job to halt with a checkpoint and requeue: preempted for ``preempted_by``, or its node has gone."""

    job_id: str
    reason: str
    preempted_by: str | None = None


class Decision:
    """What one planning step decided for one waiting job: GPUs now, or why not (and whom it preempts).
    (A plain class, not a named tuple or a dataclass: a step makes one per waiting job it passes,
    and compiled, only a class with its own ``__init__`` is made without running Python code.)"""

    __slots__ = ("allocation", "evictions", "job", "wait")

    def __init__(
        self,
        job: WaitingJob,
        allocation: Allocation | None = None,
        wait: WaitRecord | None = None,
        evictions: tuple[Eviction, ...] = (),
    ) -> None:
        self.job = job
        self.allocation = allocation
        self.wait = wait
        self.evictions = evictions


@dataclass(slots=True)
class Plan:
    """What one step decided. ``waits``: the reason of every waiting job the step weighed on its
    own, and of every other one whose reason changed; a waiting job not named keeps its recorded
    reason (it would have been given it again, wording and all)."""

    allocations: list[Allocation] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    waits: dict[str, WaitRecord] = field(default_factory=dict)


class Planner:
    """One planning step over ``state``, which it changes as it decides (see :class:`ClusterState`)."""

    def __init__(
        self,
        state: ClusterState,
        waiting: WaitingQueue | Iterable[WaitingJob],
        now: float,
        policy: SchedulerPolicy,
        *,
        weigh_all: bool = False,
    ) -> None:
        self._state = state
        self._room = state.room
        self._queue = waiting if isinstance(waiting, WaitingQueue) else WaitingQueue(waiting)
        self._weigh_all = weigh_all  # weigh every job on its own (a baseline): no verdict reused
        self._considered = 0  # jobs decided so far in this step, passed-over ones included
        self._now = now
        self._policy = policy
        self._claimed: dict[str, int] = {}  # tenant -> GPUs its preempting jobs will take
        self._ledger = TenantLedger(policy.tenancy, state.usage, state.releasing, self._claimed)
        self._reserved: dict[str, str] = {}  # node -> the job it is kept for
        self._head_nodes: dict[str, tuple[str, ...]] = {}  # head job -> the nodes reserved for it
        self._backfill_reservations = 0
        self._blocked: dict[tuple[int, str | None], str] = {}  # (priority, GPU type) -> first job blocked
        self._no_fit: set[Demand] = set()  # gangs that found no room this cycle (room only shrinks)
        self._held_back: dict[Demand, tuple[str, ...]] = {}  # gangs that only reservations keep out
        self._no_victims: set[tuple[Demand, int, str | None]] = set()
        self._cordoned: dict[str | None, int] = {}  # GPU type -> free GPUs on cordoned nodes
        self._pool: VictimPool | None = None
        self._claims: dict[str, tuple[str, ...]] = {}  # job preempting -> the nodes kept for it
        # What the planner has done so far: bumped by every placement, preemption and reservation.
        # Until it moves, a job that neither heads nor claims gets the verdict the last alike job
        # got (:meth:`_alike`); after, if what that verdict rests on is the same (see :meth:`_decide`).
        self._version = 0
        self._verdicts: dict[Alike, tuple[int, WaitRecord, Grounds]] = {}
        self._verdicts_made = 0  # verdicts stored: what :meth:`_settles_all` may have changed its mind on
        self._unsettled_at: tuple[int, int] | None = None  # (version, verdicts made) it last said no at
        self._settling: _Settling | None = None  # how far it got through a class's demands
        # the last class walked: no class after it names its first blocked job (_settle_unweighed)
        self._last_class = min(self._queue.priorities(), default=None)
        # (class, tenant, demand) -> its Alike, as of version ``_alikes_at``: the ledger that
        # decides it changes only with what bumps the version
        self._alikes: dict[tuple[int, str, Demand], Alike] = {}
        self._alikes_at = 0
        # job -> the wait this step gave it (None: placed), for every job it named on its own; a job
        # passed over keeps its recorded reason (what :meth:`_still_ahead` reads)
        self._given: dict[str, WaitRecord | None] = {}
        self.evictions = self._evacuate()
        self._keep_claims()

    def _keep_claims(self) -> None:
        """Keep for every job that is reclaiming its tenant's guarantee the nodes it preempted for,
        from the step's start: a job of a class walked before its own must not take them. Kept
        only from its own class's turn on (as for a job that preempts by priority: what is walked
        before it is of a class it could not preempt anyway), a reclaimed borrower's job of a
        higher class took the room its halted job had freed, was reclaimed from in turn once its
        minimum runtime had passed, and so on for ever: a halt every other step, and the job that
        reclaimed never ran."""
        queue = self._queue
        for priority in queue.priorities():
            for job in queue.claimants(priority):
                if not self._ledger.within_guarantee(job.tenant, self._state.charge(job.demand)):
                    continue
                assert job.wait is not None
                nodes = self._claims[job.job_id] = self._claimable(job.wait)
                self._reserve(job, nodes)

    def _claimable(self, wait: WaitRecord) -> tuple[str, ...]:
        """The nodes a preemption under way was for that are still there and kept for no one else."""
        room, reserved = self._room, self._reserved
        return tuple(node for node in wait.reserved_nodes if node in room and node not in reserved)

    def _evacuate(self) -> list[Eviction]:
        """Halt (to requeue) every running job on a node that left the inventory or is draining."""
        evictions = []
        for job_id, why in sorted(self._state.evacuees.items()):
            if self._state.held[job_id].stopping:
                continue
            evictions.append(Eviction(job_id, f"{why}: halted to resume elsewhere from its checkpoint"))
            self._state.stop(job_id)
        return evictions

    def decisions(self) -> Iterator[Decision]:
        """Decide for each waiting job in turn (the caller may time each step). Priority classes
        high to low; in each, first the jobs whose preemptions are under way, then the heads (they
        get reservations), then the rest by fair share, FIFO per tenant. Unless it weighs every
        job, a run of a tenant's jobs that verdicts already given settle (see :meth:`_decide`) is
        passed over at once, and of those only the jobs whose recorded reason says something else
        than their verdict are yielded: a step touches what changed and the head of each queue.
        What each decision gives a job is noted as it goes (``_given``: :meth:`_still_ahead`)."""
        given = self._given
        for decision in self._walk():
            given[decision.job.job_id] = decision.wait if decision.allocation is None else None
            yield decision

    def _walk(self) -> Iterator[Decision]:
        queue = self._queue
        for priority in queue.priorities():
            claimants = queue.claimants(priority)
            for job in claimants:
                yield self._weigh(job)
            first = {job.job_id for job in claimants}
            headed = queue.headed(priority)
            if self._backfill_reservations < self._policy.max_reservations or headed:
                walk = (job for job in queue.in_order(priority) if job.job_id not in first)
                heads = yield from self._heads(walk, len(queue.demands(priority)), headed - first, first)
                for job in heads:
                    yield self._weigh(job)
                first.update(job.job_id for job in heads)
            yield from self._fair_share(priority, first)

    def run(self) -> Plan:
        plan = Plan(evictions=list(self.evictions))
        for decision in self.decisions():
            if decision.allocation is not None:
                plan.allocations.append(decision.allocation)
            if decision.wait is not None:
                plan.waits[decision.job.job_id] = decision.wait
            plan.evictions.extend(decision.evictions)
        return plan

    # -- order ------------------------------------------------------------------------------------

    def _weigh(self, job: WaitingJob) -> Decision:
        self._considered += 1
        return self._decide(job, self._considered)

    def _fair_share(self, priority: int, first: Set[str]) -> Iterator[Decision]:
        """The class's jobs not in ``first``, the next one always from the tenant with the least
        GPUs per weight (as it was when that tenant was last served), FIFO per tenant. What a
        tenant holds or claims changes only when the planner does something (``_version``; a
        preemption for another tenant's job changes it too), so a key is worked out again only
        when the version moved since it was."""
        fifos = self._queue.fifos(priority)
        jobs = self._queue.get
        ledger = self._ledger
        cursors: dict[str, int] = {}  # tenant -> its next job not yet decided
        keyed_at: dict[str, int] = {}  # tenant -> the version its key in the heap was worked out at
        heap = []
        for tenant, fifo in fifos.items():
            at = _past(fifo, 0, first)
            if at < len(fifo):
                cursors[tenant] = at
                keyed_at[tenant] = self._version
                heap.append((ledger.order_key(tenant), tenant))
        heap.sort()
        while heap:
            if self._settles_all(priority):
                yield from self._settle_rest(priority, [tenant for _, tenant in heap], cursors, first)
                return
            entry = heappop(heap)
            tenant = entry[1]
            fifo = fifos[tenant]
            job = jobs(fifo[cursors[tenant]][1])
            assert job is not None
            yield self._weigh(job)
            at = _past(fifo, cursors[tenant] + 1, first)
            if at == len(fifo):
                continue
            if keyed_at[tenant] != self._version:
                entry = (ledger.order_key(tenant), tenant)
                keyed_at[tenant] = self._version
            if not self._weigh_all and (not heap or entry < heap[0]):
                # The tenant stays first while nothing changes: its settled jobs come next.
                at = _past(fifo, (yield from self._settled_run(priority, tenant, at, first)), first)
                if at == len(fifo):
                    continue
            cursors[tenant] = at
            heappush(heap, entry)

    def _settles_all(self, priority: int) -> bool:
        """Whether a verdict that holds settles every demand of the class's waiting jobs, whatever
        their tenant: then weighing the rest one by one changes nothing, and their fair-share
        order does not matter. A demand no job of which was weighed yet is settled without one
        where it can be (:meth:`_settle_unweighed`). Only where no tenant stands apart (no
        guarantee, no limit: the verdict of a job that counts is its class's and demand's alone,
        :meth:`_alike`), and asked again only once the planner did something or gave a verdict
        since it last said no."""
        if self._weigh_all or not self._ledger.flat:
            return False
        asked = (self._version, self._verdicts_made)
        if asked == self._unsettled_at:
            return False
        settling = self._settling
        if settling is None or (settling.priority, settling.version) != (priority, self._version):
            # a verdict that holds at a version holds at it for good: a demand found settled stays so
            # until the planner does something, and a class of many demands is gone through once
            settling = self._settling = _Settling(
                priority, self._version, list(self._queue.demands(priority))
            )
        demands = settling.demands
        while settling.settled < len(demands):
            demand = demands[settling.settled]
            alike: Alike = (priority, demand, None, False)
            if self._state.charge(demand) <= 0:
                break
            # (found once at this version to need a job weighed: the room and victims stay so)
            unsettled = self._verdict(priority, "", demand, alike) is None
            if unsettled and (settling.weigh_first or not self._settle_unweighed(priority, demand)):
                settling.weigh_first = True
                break
            settling.settled += 1
            settling.weigh_first = False
        else:
            return True
        self._unsettled_at = asked
        return False

    def _settle_unweighed(self, priority: int, demand: Demand) -> bool:
        """Give the class's jobs of ``demand`` the verdict a job of it would get, without weighing
        one, where no job of it could get anything else whatever the order: it fits nowhere and
        no victims could make room. What weighing would change besides is the class's first
        blocked job, which lower classes name; so only where that is named already, or no class is
        walked after this one. Whether it did."""
        blocked_as = (priority, demand.gpu_kind)
        if blocked_as not in self._blocked and priority != self._last_class:
            return False
        if demand not in self._no_fit:
            if self._room.find(demand, self._reserved.keys()) is not None:
                return False
            self._no_fit.add(demand)
        key = (demand, priority, None)
        if self._policy.preemption and key not in self._no_victims:
            bound = self._victim_bound(priority, "", reclaims=False)
            if bound is not None and self._room.free_for(demand) + bound >= demand.total_gpus:
                return False
            self._no_victims.add(key)
        code, waiting_for = self._blocking_reason(priority, demand, held_back=True)
        cordoned = self._cordoned_for(demand) if code in (_CAPACITY, _GPU_TYPE) and demand.gpus else 0
        wait = _blocked_record(code, demand, waiting_for, cordoned, ())
        self._verdicts[(priority, demand, None, False)] = (self._version, wait, (wait.code, wait.waiting_for))
        self._verdicts_made += 1
        return True

    def _settle_rest(
        self, priority: int, tenants: list[str], cursors: dict[str, int], first: Set[str]
    ) -> Iterator[Decision]:
        """Pass over every job of ``tenants`` from its cursor on (:meth:`_settles_all` said the
        class is settled), yielding those whose recorded reason differs from their verdict, as
        :meth:`_settled_run` does for one tenant: a step over thousands of one-job tenants weighed
        each tenant's job on its own, one verdict settling them all."""
        verdicts: dict[Demand, tuple[WaitRecord, Said]] = {}
        # (what a recorded reason says, demand) -> whether it is kept though the verdict differs:
        # it reads only the jobs of the classes walked before, so it stays so for the whole pass
        kept: dict[tuple[Said, Demand], bool] = {}
        firsts: dict[str, list[QueueKey]] = {}  # tenant -> the class's jobs decided first (_firsts_between)
        for job_id in first:
            job = self._queue.get(job_id)
            if job is not None and job.priority == priority:
                firsts.setdefault(job.tenant, []).append(_key(job))
        fifos = self._queue.fifos(priority)
        for tenant in sorted(tenants):
            fifo = fifos[tenant]
            at = cursors[tenant]
            start = fifo[at]
            ahead = firsts.get(tenant)
            self._considered += len(fifo) - at - (sum(key >= start for key in ahead) if ahead else 0)
            for demand, by_said in self._queue.by_reason(priority, tenant).items():
                verdict = verdicts.get(demand)
                if verdict is None:
                    record = self._verdict(priority, tenant, demand, (priority, demand, None, False))
                    assert record is not None  # what _settles_all found
                    verdict = verdicts[demand] = (record, said(record))
                record, says = verdict
                for what, keys in by_said.items():
                    if what == says:
                        continue
                    still = kept.get((what, demand))
                    if still is None:
                        still = kept[(what, demand)] = self._still_said(what, says, priority, demand)
                    if still:
                        continue
                    for _, job_id in keys[bisect_left(keys, start) :]:
                        job = self._queue.get(job_id)
                        if job is not None and job_id not in first:
                            yield Decision(job, wait=record)

    def _settled_run(
        self, priority: int, tenant: str, at: int, first: Set[str]
    ) -> Generator[Decision, None, int]:
        """Pass over the tenant's jobs from its queue's ``at`` up to the first one of a demand that
        has no verdict since the planner last did something (weighing them one by one would change
        nothing: the same verdict each, no state touched), yielding those whose recorded reason
        differs from their verdict; the position after them.

        The stop is looked up by demand, at a cost of the tenant's distinct demands, not of its
        jobs. A tenant with many of them (more than ``SHORT_RUN``) has its run read job by job
        first, up to that many jobs (:meth:`_short_run`): the lookup alone, one pass per job of a
        tenant whose every job asked for a demand of its own, made a step cost its jobs times its
        demands, and 3,000 such jobs took 4 s a step, for every tenant."""
        fifo = self._queue.fifos(priority)[tenant]
        demands = self._queue.by_reason(priority, tenant)
        short = None
        if len(demands) > SHORT_RUN:
            short = self._short_run(priority, tenant, fifo, at, first, len(demands))
        if short is not None:
            end, passed, decisions = short
            self._considered += passed
            yield from decisions
            return end
        start = fifo[at]
        stop: QueueKey | None = None
        settled: list[tuple[Demand, dict[Said, list[QueueKey]], WaitRecord]] = []
        for demand, by_said in demands.items():
            verdict = self._verdict(priority, tenant, demand, self._alike(priority, tenant, demand))
            if verdict is not None:
                settled.append((demand, by_said, verdict))
                continue
            for keys in by_said.values():
                index = bisect_left(keys, start)
                if index < len(keys) and (stop is None or keys[index] < stop):
                    stop = keys[index]
        end = len(fifo) if stop is None else bisect_left(fifo, stop, at)
        if end == at:
            return at
        self._considered += end - at - self._firsts_between(priority, tenant, start, stop, first)
        for demand, by_said, record in settled:
            says = said(record)
            for what, keys in by_said.items():
                if what == says or self._still_said(what, says, priority, demand):
                    continue
                low = bisect_left(keys, start)
                high = len(keys) if stop is None else bisect_left(keys, stop, low)
                for _, job_id in keys[low:high]:
                    job = self._queue.get(job_id)
                    if job is not None and job_id not in first:
                        yield Decision(job, wait=record)
        return end

    def _short_run(
        self, priority: int, tenant: str, fifo: list[QueueKey], at: int, first: Set[str], longest: int
    ) -> tuple[int, int, list[Decision]] | None:
        """:meth:`_settled_run` read job by job, if its run ends within ``longest`` jobs: the
        position after it, how many jobs it passes over (those decided first aside), and the
        decisions to yield; None if the run goes on further."""
        queue = self._queue
        verdicts: dict[Demand, WaitRecord | None] = {}
        decisions: list[Decision] = []
        passed = 0
        for end in range(at, min(len(fifo), at + longest + 1)):
            job_id = fifo[end][1]
            job = queue.get(job_id)
            assert job is not None
            demand = job.demand
            if demand in verdicts:
                verdict = verdicts[demand]
            else:
                alike = self._alike(priority, tenant, demand)
                verdict = verdicts[demand] = self._verdict(priority, tenant, demand, alike)
            if verdict is None:
                return end, passed, decisions
            if end - at == longest:
                return None
            if job_id not in first:
                passed += 1
                recorded, says = said(job.wait), said(verdict)
                if recorded != says and not self._still_said(recorded, says, priority, demand):
                    decisions.append(Decision(job, wait=verdict))
        return len(fifo), passed, decisions

    def _firsts_between(
        self, priority: int, tenant: str, start: QueueKey, stop: QueueKey | None, first: Set[str]
    ) -> int:
        """How many of the jobs decided first (claimants, heads) are the tenant's, of the class, in
        its queue from ``start`` up to ``stop``."""
        count = 0
        for job_id in first:
            job = self._queue.get(job_id)
            if job is not None and job.tenant == tenant and job.priority == priority:
                key = _key(job)
                count += start <= key and (stop is None or key < stop)
        return count

    def _heads(
        self, level: Iterable[WaitingJob], demands: int, headed: Set[str], first: set[str]
    ) -> Generator[Decision, None, list[WaitingJob]]:
        """The oldest jobs of a class (queue order) that waited before and still do not fit, each
        with nodes reserved for it, while reservations are left (EASY backfill: only jobs behind a
        head must keep off its nodes). A job is weighed once before it can be a head, so a cycle
        of new arrivals costs no search. The walk stops at the first job it cannot reserve for
        because older heads hold the nodes, so no younger job is ever reserved for ahead of an
        older one; a job too big for the open nodes whatever is kept (others are cordoned) is
        passed by, as it once held up every reservation of its class until the cordon lifted. Once
        every one of the class's ``demands`` is found to fit, no job left can head: the walk ends
        (it read the whole class, every step a GPU was free, to find none).

        A job that headed the class at the last step (``headed``: its recorded reason keeps nodes
        for it) and fits now is weighed where the walk meets it, before any younger job, and added
        to ``first``: left to the fair-share walk, it lost the nodes it had waited for to the
        younger jobs of any tenant that came before its own there, at the very step they had
        drained, and waited on for as long as those ran. The walk goes on, reserving nothing more
        once reservations are spent, until it has met every such job."""
        heads: list[WaitingJob] = []
        fits: dict[Demand, bool] = {}  # the room changes during the walk only by a former head placed
        fitting = 0  # how many of ``fits`` fit
        reserving = True  # reservations are left, and no older head keeps the next one from a job
        left = len(headed)  # former heads not met yet
        for job in level:
            reserving = reserving and self._backfill_reservations < self._policy.max_reservations
            if not reserving and not left:
                break
            was_head = job.job_id in headed
            left -= was_head
            demand = job.demand
            if job.wait is None or not self._ledger.within_limit(job.tenant, self._state.charge(demand)):
                continue
            if demand not in fits:
                fits[demand] = (
                    demand not in self._no_fit and self._room.find(demand, self._reserved.keys()) is not None
                )
                fitting += fits[demand]
            if fits[demand]:
                if was_head:
                    first.add(job.job_id)
                    yield self._weigh(job)
                    fits.clear()
                    fitting = 0
                elif fitting == demands and not left:
                    break
                continue
            self._no_fit.add(demand)
            if not reserving:
                continue
            nodes = self._reservation_nodes(job)
            if not nodes:
                if self._reserved and self._room.reservation(demand, frozenset()) is not None:
                    reserving = False  # only nodes kept for older jobs are missing: no younger job goes first
                continue  # too few open nodes for it whatever is kept (a cordon): it holds no one up
            self._reserve(job, nodes)
            self._head_nodes[job.job_id] = nodes
            self._backfill_reservations += 1
            heads.append(job)
            fits.clear()
            fitting = 0
        return heads

    # -- one job ----------------------------------------------------------------------------------

    def _decide(self, job: WaitingJob, position: int) -> Decision:
        """The job's verdict. One that neither heads (no nodes of its own) nor claims (no preemption
        under way) is decided by its class and demand, where its tenant stands (:meth:`_alike`) and
        what the planner has done: quota, placement (the room's memo), victims (their memo) and the
        reason all read nothing else. So while the planner has done nothing since the last alike
        job, it gets that job's verdict without weighing it again (a long queue of
        alike jobs costs a lookup each), and keeps its own recorded reason if that says the same.
        After the planner did something, the verdict still holds if what it rests on does
        (:meth:`_grounds`): checking that costs much less than weighing the job."""
        demand = job.demand
        settled = (
            not self._weigh_all
            and job.job_id not in self._head_nodes
            and (job.wait is None or job.wait.code is not _PREEMPTION)
        )
        alike = self._alike(job.priority, job.tenant, demand) if settled else None
        if (
            alike is not None
            and (verdict := self._verdict(job.priority, job.tenant, demand, alike)) is not None
        ):
            return Decision(job, wait=self._kept(job, verdict))
        if not self._ledger.within_limit(job.tenant, self._state.charge(demand)):
            wait = self._quota_wait(job)
            if alike is not None:
                self._verdicts[alike] = (self._version, wait, (_QUOTA,))
                self._verdicts_made += 1
            return Decision(job, wait=wait)
        gang = self._place(job)
        if gang is not None:
            self._state.hold(HeldJob(job.job_id, job.tenant, demand, job.priority, gang, self._now))
            self._held_back.clear()
            self._version += 1
            reason = (
                f"placed {demand.describe()} on {len(gang.nodes)} node(s) ({demand.policy}); "
                f"considered {_ordinal(position)} in this cycle"
            )
            return Decision(job, allocation=Allocation(job.job_id, gang, reason))
        claim = self._claim(job)
        if claim is not None:
            return Decision(job, wait=claim)
        if self._policy.preemption:
            preempted = self._preempt(job) or self._preempt_drain(job)
            if preempted is not None:
                self._version += 1
                return preempted
        wait = self._blocked_wait(job)
        if alike is not None:
            # It is within its quota, did not fit and found no victims (both memoised now), and it
            # holds no nodes: what :meth:`_grounds` would find is what the wait says.
            self._verdicts[alike] = (self._version, wait, (wait.code, wait.waiting_for))
            self._verdicts_made += 1
        return Decision(job, wait=self._kept(job, wait))

    def _alike(self, priority: int, tenant: str, demand: Demand) -> Alike:
        """Which settled jobs share the verdict of a job of ``priority``, ``tenant`` and ``demand``:
        those of its class and demand whose tenant stands as its does. Over its quota, only its own
        tenant's (the wait names the tenant and its quota). Inside it, the tenant matters only
        through the victims it may take (:meth:`_whose_victims`): a job that reclaims its
        guarantee may preempt borrowers, and once any tenant has a guarantee, the jobs of a
        tenant inside it are safe from other tenants' but not from its own; then a job shares
        with its own tenant's only. Otherwise with every tenant's, as nothing else in its verdict
        (room, victims of lower priority, the reason and its wording) reads the tenant."""
        if self._ledger.flat and self._state.charge(demand) > 0:
            # no tenant stands apart (save one whose job counts nothing: it is inside its guarantee)
            return (priority, demand, None, False)
        if self._alikes_at != self._version:
            self._alikes.clear()
            self._alikes_at = self._version
        key = (priority, tenant, demand)
        alike = self._alikes.get(key)
        if alike is None:
            need = self._state.charge(demand)
            if not self._ledger.within_limit(tenant, need):
                alike = (priority, demand, tenant, True)
            else:
                reclaims = self._ledger.within_guarantee(tenant, need)
                alike = (priority, demand, self._whose_victims(tenant, reclaims), False)
            self._alikes[key] = alike
        return alike

    def _whose_victims(self, tenant: str, reclaims: bool) -> str | None:
        """The tenant where the victims a job may take depend on it: when it reclaims, and once a
        tenant has a guarantee (another tenant's jobs inside theirs are not its to take, its own
        lower-priority jobs are); None where they do not."""
        return tenant if reclaims or self._ledger.any_guarantee else None

    def _verdict(self, priority: int, tenant: str, demand: Demand, alike: Alike) -> WaitRecord | None:
        """The verdict the last settled job alike to one of ``priority``, ``tenant`` and ``demand``
        got (``alike``: :meth:`_alike`), if it holds."""
        kept = self._verdicts.get(alike)
        if kept is None:
            return None
        version, record, grounds = kept
        if version != self._version:
            if self._grounds(priority, tenant, demand) != grounds:
                return None
            self._verdicts[alike] = (self._version, record, grounds)
        return record

    def _grounds(self, priority: int, tenant: str, demand: Demand) -> Grounds | None:
        """What a settled job's verdict rests on now: its tenant over quota; or, its gang having
        found no room and no victims this step (both only ever stay so), the code and the jobs its
        reason names, which with the kind of job fix the reason's wording. None where it must be
        weighed: it might fit, or find victims."""
        need = self._state.charge(demand)
        if not self._ledger.within_limit(tenant, need):
            return (_QUOTA,)
        if demand not in self._no_fit:
            return None
        if self._policy.preemption:
            reclaims = self._ledger.within_guarantee(tenant, need)
            if (demand, priority, self._whose_victims(tenant, reclaims)) not in self._no_victims:
                return None
        return self._blocking_reason(priority, demand, held_back=True)

    def _kept(self, job: WaitingJob, wait: WaitRecord) -> WaitRecord:
        """The job's recorded reason if ``wait`` says the same (its wording stays), or if it is a
        priority wait that still holds (:meth:`_still_said`); else ``wait``. A quota wait is always
        given afresh."""
        recorded = job.wait
        if recorded is None or wait.code is _QUOTA:
            return wait
        if (
            wait is recorded  # a wait's wording is kept across steps (_blocked_record): mostly this one
            or wait.same_as(recorded)
            or self._still_said(said(recorded), said(wait), job.priority, job.demand)
        ):
            return recorded
        return wait

    def _still_said(self, recorded: Said, verdict: Said, priority: int, demand: Demand) -> bool:
        """Whether a job of ``priority`` and ``demand`` whose recorded reason says ``recorded`` keeps
        it though its verdict says ``verdict``: the recorded one is a ``priority`` wait whose job
        still waits ahead of it, and the verdict another ``priority`` wait or a ``reservation``
        (on the same nodes, if any): a reason that still holds is kept.

        Which blocked job of a higher class a priority wait names is the first the step walks, and
        that order moves with every tenant's share; and whether a job of a lower class would fit
        but for the nodes kept for a head (``reservation``) or not at all (``priority``) moves with
        every job that ends or starts. Naming them anew made a reason change (an event, a new
        ``since``) for nearly every job of the lower classes at nearly every step, though the job
        named still waited ahead of them all."""
        return (
            recorded is not None
            and verdict is not None
            and recorded[0] is _PRIORITY
            and (verdict[0] is _PRIORITY or verdict[0] is _RESERVATION)
            and recorded[2] == verdict[2]
            and self._still_ahead(recorded[1], priority, demand)
        )

    def _still_ahead(self, named: tuple[str, ...], priority: int, demand: Demand) -> bool:
        """Whether the job ``named`` (of a priority wait) waits ahead of a job of ``priority`` and
        ``demand`` in this step, as :meth:`_higher_priority_blocked` asks of the first blocked job
        of each class: it is of a higher class, blocked in this step (a competing reason: it
        neither got GPUs nor preempts) and wants the same kind of GPUs. Every higher class is
        walked before, so its job was either named on its own (what ``_given`` holds) or passed
        over keeping its recorded reason."""
        if not named or not demand.gpus:
            return False
        ahead = self._queue.get(named[0])
        if ahead is None or ahead.priority <= priority:
            return False
        wait = self._given.get(ahead.job_id, ahead.wait)  # given None: it got GPUs
        if wait is None or wait.code not in _COMPETING:
            return False
        return _same_gpus(ahead.demand.gpu_kind, demand)

    def _place(self, job: WaitingJob) -> Gang | None:
        """A placement off the nodes reserved for others, or None (remembered for the cycle: the
        room only shrinks, so a gang that does not fit now fits no later job of this cycle)."""
        demand = job.demand
        if job.job_id in self._head_nodes or job.job_id in self._claims:
            return self._room.find(demand, self._excluded_for(job))
        if demand in self._no_fit:
            return None
        gang = self._room.find(demand, self._reserved.keys())
        if gang is None:
            self._no_fit.add(demand)
        return gang

    def _excluded_for(self, job: WaitingJob) -> Set[str]:
        """The nodes ``job`` must keep off: those reserved for others (its own are open to it)."""
        if job.job_id not in self._head_nodes and job.job_id not in self._claims:
            return self._reserved.keys()
        return {node for node, holder in self._reserved.items() if holder != job.job_id}

    def _quota_wait(self, job: WaitingJob) -> WaitRecord:
        quota = self._ledger.quota(job.tenant)
        charge = self._state.charge(job.demand)
        need = counted(charge, job.demand.total_gpus)
        limit = f"its tenant {job.tenant} may hold at most {quota.limit} GPUs ({quota.describe()})"
        if quota.limit is not None and charge > quota.limit * MILLI_GPUS:
            return WaitRecord(_QUOTA, f"{limit} and it needs {need}: it cannot run under this quota")
        return WaitRecord(_QUOTA, f"{limit}; it needs {need} on top of what the tenant holds")

    def _claim(self, job: WaitingJob) -> WaitRecord | None:
        """The job's own preemption, while its victims are still stopping: keep waiting for them."""
        wait = job.wait
        if wait is None or wait.code is not _PREEMPTION:
            return None
        held = self._state.held
        if not any(victim in held and held[victim].stopping for victim in wait.waiting_for):
            return None
        nodes = self._claims.get(job.job_id)
        if nodes is None:
            nodes = self._claimable(wait)
            self._reserve(job, nodes)
        return WaitRecord(_PREEMPTION, wait.detail, wait.waiting_for, nodes)

    def _preempt(self, job: WaitingJob) -> Decision | None:
        demand = job.demand
        reclaims = self._ledger.within_guarantee(job.tenant, self._state.charge(demand))
        key = (demand, job.priority, self._whose_victims(job.tenant, reclaims))
        if key in self._no_victims:
            return None
        bound = self._victim_bound(job.priority, job.tenant, reclaims)
        if bound is None or self._room.free_for(demand) + bound < demand.total_gpus:
            self._no_victims.add(key)
            return None
        if self._pool is None:
            self._pool = VictimPool.of(self._state, self._ledger, self._now, self._policy.min_runtime_s)
        preemptor = Preemptor(job.job_id, job.tenant, demand, job.priority, reclaims)
        found = self._pool.search(preemptor, self._excluded_for(job))
        if found is None:
            self._no_victims.add(key)
            return None
        victims, gang = found
        self._unreserve(job)
        evictions = tuple(
            Eviction(victim.job_id, self._eviction_reason(job, victim), job.job_id) for victim in victims
        )
        for victim in victims:
            self._state.stop(victim.job_id)
        self._claim_for(job, gang.nodes)
        named = tuple(victim.job_id for victim in victims)
        detail = f"preempting {len(victims)} job(s) ({_some(named)}); it starts once their GPUs are released"
        wait = WaitRecord(_PREEMPTION, detail, named[:NAMES_MAX], gang.nodes)
        return Decision(job, wait=wait, evictions=evictions)

    def _preempt_drain(self, job: WaitingJob) -> Decision | None:
        """A head whose reserved nodes are draining: halt jobs on them (with a checkpoint; they
        queue again) if waiting would idle more GPU-time than the halts lose.

        Runtimes are unknown, so each job is expected to run on as long as it has run (the tail of
        training runtimes is heavy: the longer a job has run, the longer it is likely to run). The
        drain ends when enough GPUs are free for the head, the expected earliest ends first; until
        then the nodes' free GPUs idle, and so do those of each job that ends before it is over.
        The halts are the fewest jobs, those expected to run longest, that free enough GPUs now,
        at ``checkpoint_cost_s`` per GPU. Never a job of a higher class, nor another tenant's
        inside its guarantee, nor one inside its minimum runtime (a job resumed after a halt runs
        at least that long, and its expected remaining time starts again from nothing, so it is
        not halted again at once); the claim and the reason are a preemption's."""
        nodes = self._head_nodes.get(job.job_id)
        if not self._policy.preempt_drains or not nodes or len(nodes) < 2:
            return None  # a gang of one node waits for the first jobs to end there, not for all
        held = self._state.held
        need = job.demand.total_gpus
        free = sum(len(room.free) for node in nodes if (room := self._room.room(node)) is not None)
        running: dict[str, HeldJob] = {}
        for node in nodes:
            for job_id in self._state.on_node.get(node, ()):
                victim = held[job_id]
                if victim.stopping or victim.priority <= job.priority:
                    running[job_id] = victim  # a stopping job ends first (expected in no time)
        # by expected end, soonest first: (expected remaining time, GPUs, job)
        ends = sorted(
            (0.0 if victim.stopping else self._now - victim.started_at, victim.gang.gpus, victim.job_id)
            for victim in running.values()
        )
        idle, freed, last = 0.0, free, 0.0
        for remaining, gpus, _ in ends:
            if freed >= need:
                break
            idle += (remaining - last) * freed  # every GPU freed so far idles until this end
            freed += gpus
            last = remaining
        if freed < need:
            return None  # higher-class jobs hold the rest: a preemption of its own class would not do
        chosen: list[HeldJob] = []
        freeing = free
        for _, gpus, job_id in reversed(ends):
            if freeing >= need:
                break
            victim = running[job_id]
            if victim.stopping:
                continue
            young = not may_halt(victim.started_at, self._now, self._policy.min_runtime_s)
            if young or self._guaranteed(victim, job):
                return None
            chosen.append(victim)
            freeing += gpus
        cost = self._policy.checkpoint_cost_s * sum(victim.gang.gpus for victim in chosen)
        if not chosen or idle <= cost:
            return None
        chosen.sort(key=lambda victim: victim.job_id)
        self._unreserve(job)
        evictions = tuple(
            Eviction(
                victim.job_id,
                f"preempted so that job {job.job_id} need not wait for its nodes to drain: "
                "it resumes from its checkpoint",
                job.job_id,
            )
            for victim in chosen
        )
        for victim in chosen:
            self._state.stop(victim.job_id)
        if self._pool is not None:  # no later search may halt them again (nor count them)
            self._pool.chosen.update(victim.job_id for victim in chosen)
        self._claim_for(job, nodes)
        named = tuple(victim.job_id for victim in chosen)
        detail = (
            f"preempting {len(chosen)} job(s) ({_some(named)}) on the nodes kept for it, as waiting for them "
            f"would idle about {idle / 3600:.1f} GPU-hours and the halts cost {cost / 3600:.1f}; "
            "it starts once their GPUs are released"
        )
        wait = WaitRecord(_PREEMPTION, detail, named[:NAMES_MAX], nodes)
        return Decision(job, wait=wait, evictions=evictions)

    def _guaranteed(self, victim: HeldJob, job: WaitingJob) -> bool:
        """Whether ``victim`` is another tenant's job inside that tenant's guarantee: no halt for
        ``job`` may take it (:meth:`VictimPool.may_preempt`)."""
        ledger = self._ledger
        return (
            victim.tenant != job.tenant
            and ledger.guaranteed(victim.tenant)
            and not ledger.borrowed(victim.tenant)
        )

    def _victim_bound(self, priority: int, tenant: str, reclaims: bool) -> int | None:
        """An upper bound on the GPUs preemption could free for a job of ``priority`` and
        ``tenant``, from running totals alone; None when no running job could be its victim. (A
        victim may hold no GPUs: a job without them can hold the CPUs or memory a gang needs on a
        node, and must not keep it out.)"""
        state = self._state
        below = state.gpus_below(priority)
        if not reclaims:
            return below
        ledger = self._ledger
        borrowers = [t for t in ledger.tenants() if t != tenant and ledger.borrowed(t)]
        if below is None and not borrowers:
            return None
        # all the GPUs a borrower holds: the last job taken from it may hold more than it borrows
        return (below or 0) + sum(state.gpus_held.get(tenant, 0) for tenant in borrowers)

    def _eviction_reason(self, job: WaitingJob, victim: HeldJob) -> str:
        if victim.priority < job.priority:
            (priority, band), (below, victim_band) = map(
                self._policy.class_rank, (job.priority, victim.priority)
            )
            if priority > below:
                return f"preempted by job {job.job_id} (priority {priority} over {below})"
            served = f"{self._policy.describe_band(band)}, this one {self._policy.describe_band(victim_band)}"
            return f"preempted by job {job.job_id}, which has had less GPU time ({served})"
        quota = self._ledger.quota(job.tenant)
        return (
            f"preempted to reclaim tenant {job.tenant}'s guarantee of {quota.guaranteed_gpus} GPUs "
            f"for job {job.job_id}: tenant {victim.tenant} borrows beyond its own"
        )

    def _blocked_wait(self, job: WaitingJob) -> WaitRecord:
        demand = job.demand
        nodes = self._head_nodes.get(job.job_id, ())
        code, waiting_for = self._blocking_reason(job.priority, demand, held_back=not nodes)
        if code in _COMPETING:
            self._blocked.setdefault((job.priority, demand.gpu_kind), job.job_id)
        cordoned = self._cordoned_for(demand) if code in (_CAPACITY, _GPU_TYPE) and demand.gpus else 0
        return _blocked_record(code, demand, waiting_for, cordoned, nodes)

    def _blocking_reason(
        self, priority: int, demand: Demand, held_back: bool
    ) -> tuple[WaitReason, tuple[str, ...]]:
        """Why a job of ``priority`` and ``demand`` does not fit; ``held_back``: whether to check if
        reservations are all that stop it."""
        room = self._room
        need = demand.total_gpus
        if demand.gpus and room.free_for(demand) < need:
            code = _GPU_TYPE if demand.gpu_type is not None and room.free_gpus() >= need else _CAPACITY
        else:
            code = _FRAGMENTATION if demand.gpus else _CAPACITY
            holders = self._held_back_by(demand) if held_back else ()
            if holders:
                return _RESERVATION, holders
        ahead = self._higher_priority_blocked(priority, demand)
        if ahead is not None:
            return _PRIORITY, (ahead,)
        return code, ()

    def _cordoned_for(self, demand: Demand) -> int:
        """Free GPUs for ``demand`` on cordoned nodes, for the wait detail (memoised for the plan)."""
        cordoned = self._cordoned.get(demand.gpu_type)
        if cordoned is None:
            cordoned = self._cordoned[demand.gpu_type] = self._room.cordoned_for(demand)
        return cordoned

    def _held_back_by(self, demand: Demand) -> tuple[str, ...]:
        """The jobs whose reserved nodes are all that keep ``demand`` from fitting now (none if it
        would not fit anyway). Memoised until the room or the reservations change."""
        if not self._reserved:
            return ()
        holders = self._held_back.get(demand)
        if holders is None:
            anywhere = self._room.find(demand)
            nodes = anywhere.nodes if anywhere is not None else ()
            holders = tuple(sorted({self._reserved[n] for n in nodes if n in self._reserved}))
            self._held_back[demand] = holders
        return holders

    def _higher_priority_blocked(self, priority: int, demand: Demand) -> str | None:
        """A job of a class above ``priority`` that waits for the same kind of GPUs as ``demand``, if any."""
        if not demand.gpus:
            return None
        for (blocked, kind), job_id in self._blocked.items():
            if blocked > priority and _same_gpus(kind, demand):
                return job_id
        return None

    def _reservation_nodes(self, job: WaitingJob) -> tuple[str, ...]:
        """The job's recorded reservation while it is still valid and free; else a new one (or none)."""
        wait = job.wait
        if wait is not None and wait.reserved_nodes and wait.code is not _PREEMPTION:
            kept = wait.reserved_nodes
            if all(node not in self._reserved for node in kept) and self._room.can_hold_when_empty(
                job.demand, kept
            ):
                return kept
        return self._room.reservation(job.demand, self._reserved.keys()) or ()

    def _claim_for(self, job: WaitingJob, nodes: Iterable[str]) -> None:
        """The job preempts for GPUs on ``nodes``: they are kept for it and count for its tenant."""
        self._reserve(job, nodes)
        self._claimed[job.tenant] = self._claimed.get(job.tenant, 0) + self._state.charge(job.demand)

    def _reserve(self, job: WaitingJob, nodes: Iterable[str]) -> None:
        for node in nodes:
            self._reserved.setdefault(node, job.job_id)
        self._held_back.clear()
        self._version += 1

    def _unreserve(self, job: WaitingJob) -> None:
        """A head, or a job whose victims are gone, that preempts instead: the nodes kept for it give
        way to the nodes it preempts for."""
        head = self._head_nodes.pop(job.job_id, None) is not None
        if self._claims.pop(job.job_id, None) is None and not head:
            return
        self._reserved = {node: holder for node, holder in self._reserved.items() if holder != job.job_id}
        self._backfill_reservations -= head
        self._held_back.clear()
        self._version += 1


class _Settling:
    """How far :meth:`Planner._settles_all` got through a class's demands at a version. (A plain
    class: compiled, a dataclass's generated ``__init__`` runs as Python code, many times a step.)"""

    __slots__ = ("demands", "priority", "settled", "version", "weigh_first")

    def __init__(self, priority: int, version: int, demands: list[Demand]) -> None:
        self.priority = priority
        self.version = version
        self.demands = demands
        self.settled = 0  # the first ``settled`` of ``demands`` have a verdict that holds
        self.weigh_first = False  # the next one cannot be settled before one of its jobs is weighed


_DETAILS: dict[WaitReason, str] = {
    _CAPACITY: "needs {need}; not enough are free",
    _GPU_TYPE: "needs {need}; GPUs are free, but too few of that type",
    _FRAGMENTATION: "needs {need}; enough GPUs are free, but not on few enough nodes to hold the gang",
    _PRIORITY: "needs {need}; job {ahead}, of a higher priority or with less GPU time run, waits "
    "ahead of it for the same GPUs",
    _RESERVATION: "needs {need}; it would fit, but only on nodes kept free for {ahead}, ahead of it",
}


@lru_cache(maxsize=4096)
def _blocked_record(
    code: WaitReason, demand: Demand, waiting_for: tuple[str, ...], cordoned: int, nodes: tuple[str, ...]
) -> WaitRecord:
    """The wait of a job that does not fit, worded. A function of what it says alone, so it is
    kept across steps: the same few reasons are given again and again, every step."""
    detail = _DETAILS[code].format(need=demand.describe(), ahead=_some(waiting_for))
    if cordoned:
        detail += f"; {cordoned} more are free on cordoned nodes"
    if nodes:
        detail += f"; {len(nodes)} node(s) are kept free for it, so jobs behind it cannot delay it"
    return WaitRecord(code, detail, waiting_for[:NAMES_MAX], nodes)


def _same_gpus(kind: str | None, demand: Demand) -> bool:
    """Whether a job blocked for GPUs of ``kind`` (:attr:`Demand.gpu_kind`) waits for the GPUs
    ``demand``, which asks for some, could use: either of them takes any type, or both the same."""
    return kind is None or demand.gpu_type is None or kind == demand.gpu_type


def _some(job_ids: tuple[str, ...]) -> str:
    """The first few of ``job_ids`` for a reason's detail: a reason is at most ``REASON_MAX``
    characters and a job id up to 128, and naming every holder of a reservation or every victim
    once made a reason the scheduler could not send, which ended its every planning step."""
    return ", ".join(job_ids[:5]) + (" ..." if len(job_ids) > 5 else "")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plan(
    state: ClusterState, waiting: WaitingQueue | Iterable[WaitingJob], now: float, policy: SchedulerPolicy
) -> Plan:
    """Decide one cycle: allocations, evictions and wait reasons; ``state`` is left as the plan leaves it."""
    return Planner(state, waiting, now, policy).run()
