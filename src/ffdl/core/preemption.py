"""Choosing victims: which running jobs to halt so that a waiting gang fits, and which are off limits.

A waiting job may preempt a running job of strictly lower priority: any of its own tenant's, and
another tenant's if that tenant still holds its guarantee without it (or has none). A waiting job
whose tenant stays inside its guarantee with it may also *reclaim*: preempt jobs of other tenants
that borrow (hold more than their own guarantee), whatever their priority — a guarantee that a
borrower could keep from its owner would be none, and one that another tenant's priority could
take would be none either. Preemption halts the victims with a checkpoint and requeues them; they
resume from it (see :mod:`ffdl.core.decider`).

What keeps preemption from looping:

* a guarantee is a floor against other tenants whatever their priority, so what a tenant reclaims
  is not preempted back by priority (that was a halt every other cycle, for ever);
* the nodes a job reclaims for are kept for it from the start of every step until it has them,
  so a reclaimed borrower's next job of a higher class cannot take them first (see
  :mod:`ffdl.core.scheduling`);

* a job is protected until it has held its GPUs for ``min_runtime_s`` since it last got them, so
  a victim that is re-admitted runs at least that long before it can be preempted again, and a
  job admitted in this very cycle is never a victim of it;
* a job already being stopped is never chosen again, and the GPUs it frees are reserved for the
  job it was stopped for (see :mod:`ffdl.core.scheduling`), so a requeued victim cannot take them
  back in between and be preempted at once;
* victims are the fewest the search finds: lowest priority first, then the youngest (the least
  work since its start), added until the gang fits, then pruned of every victim it fits without.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field

from ffdl.core.cluster import ClusterState, Demand, Gang, HeldJob
from ffdl.core.tenancy import TenantLedger


class Preemptor:
    """The waiting job that needs room, as the victim search sees it. (A plain class: compiled, a
    dataclass's generated ``__init__`` runs as Python code, at every one of a step's searches.)"""

    __slots__ = ("demand", "job_id", "priority", "reclaims", "tenant")

    def __init__(self, job_id: str, tenant: str, demand: Demand, priority: int, reclaims: bool) -> None:
        self.job_id = job_id
        self.tenant = tenant
        self.demand = demand
        self.priority = priority
        self.reclaims = reclaims  # its tenant stays inside its guarantee with this job


def may_halt(started_at: float, now: float, min_runtime_s: float) -> bool:
    """Whether a job given its GPUs at ``started_at`` may be halted at ``now``: past its minimum
    runtime, and not given them at this very moment (a job placed in this step is never halted in
    it, even with no minimum runtime: the plan would start and halt it at once)."""
    return started_at + min_runtime_s <= now and started_at < now


def young(state: ClusterState, priority: int, now: float, min_runtime_s: float) -> int:
    """How many of the class's running jobs may not be victims yet: those still inside their
    minimum runtime, and those given their GPUs at this very moment (a job placed in this step is
    never its victim, even with no minimum runtime). A prefix of ``ClusterState.by_start``, the
    youngest first."""

    def victim(entry: tuple[float, str, HeldJob]) -> bool:
        return may_halt(-entry[0], now, min_runtime_s)

    return bisect_left(state.by_start.get(priority, ()), True, key=victim)


def candidates(state: ClusterState, priority: int, now: float, min_runtime_s: float) -> list[HeldJob]:
    """The class's jobs that may be victims at ``now`` (past their minimum runtime), youngest
    first: those without GPUs too, as their CPUs and memory can keep a gang off a node as GPUs can."""
    entries = state.by_start.get(priority, [])
    return [entry[2] for entry in entries[young(state, priority, now, min_runtime_s) :]]


def halts_allowed(state: ClusterState, now: float, min_runtime_s: float) -> tuple[tuple[int, int], ...]:
    """Which running jobs may be halted at ``now``, as (class, how many of its jobs may not): all
    that time changes in a planning step's inputs while no job comes, goes or moves (see
    :func:`ffdl.core.simulation.simulate`)."""
    classes = sorted(state.by_start)
    return tuple((priority, young(state, priority, now, min_runtime_s)) for priority in classes)


@dataclass(slots=True)
class VictimPool:
    """The running jobs that may be preempted in this cycle, lowest priority and youngest first.

    Each class's running jobs are kept youngest first by the state (``ClusterState.by_start``), so
    those still inside their minimum runtime are a prefix found by bisection, and a search that
    a bound rules out never lists the candidates at all."""

    state: ClusterState
    ledger: TenantLedger
    now: float
    min_runtime_s: float
    priorities: list[int]  # ascending
    chosen: set[str] = field(default_factory=set)
    # (priority, GPU type, tenant or None) -> (what it rests on when found, what _eligible_of found)
    eligible: dict[tuple[int, str | None, str | None], tuple[tuple[int, int], Eligible]] = field(
        default_factory=dict
    )

    @classmethod
    def of(cls, state: ClusterState, ledger: TenantLedger, now: float, min_runtime_s: float) -> VictimPool:
        return cls(state, ledger, now, min_runtime_s, sorted(p for p, jobs in state.running.items() if jobs))

    def _young(self, priority: int) -> int:
        return young(self.state, priority, self.now, self.min_runtime_s)

    def may_preempt(self, preemptor: Preemptor, victim: HeldJob, taking: Mapping[str, int]) -> bool:
        """Whether ``victim`` may be halted for ``preemptor``, with ``taking`` (GPU-equivalents per
        tenant) already picked in this search. Another tenant's job is taken by priority (a lower
        class) only if its tenant keeps its guarantee without it, and by reclaiming (any class)
        while its tenant still borrows. A guarantee is a floor against other tenants whatever
        their priority: were it not, a tenant reclaiming its guarantee from a borrower's job of a
        higher class would have that job preempt it back by priority once requeued, and so on for
        ever. By priority the floor holds after the halt, not only before it: a gang of 16 GPUs
        took both jobs (1 and 8 GPUs) of a tenant guaranteed 4 that held 9, leaving it none, and
        the 1-GPU job reclaimed the gang's GPUs, which then took them back, every other step for
        ever. A reclaim may leave a borrower under its own guarantee (a gang is halted whole, and
        a guarantee that a gang larger than what its holder borrows could keep would be none)."""
        if victim.job_id in self.chosen:
            return False
        if victim.tenant == preemptor.tenant:
            return victim.priority < preemptor.priority
        beyond = self.ledger.borrowed(victim.tenant) - taking.get(victim.tenant, 0)
        if victim.priority < preemptor.priority:
            return not self.ledger.guaranteed(victim.tenant) or beyond >= self.state.held_charge(victim)
        return preemptor.reclaims and beyond > 0

    def search(self, preemptor: Preemptor, excluded: Set[str]) -> tuple[list[HeldJob], Gang] | None:
        """The fewest victims found whose GPUs let the preemptor's gang fit (outside ``excluded``),
        with the placement it would then get; ``None`` if halting every candidate would not do.

        It counts the eligible candidates freed in order (:class:`~ffdl.core.cluster.Freeing`, the
        room untouched) up to the shortest prefix of them that makes the gang fit, then drops every
        victim of that prefix but the last that the gang fits without, last first, and places the
        gang with the rest freed. The room is left exactly as it was."""
        room = self.state.room
        demand = preemptor.demand
        # Ruled out cheaply first, by what the state keeps: not even halting every running job of
        # the classes it outranks (young ones too: more than may be halted) makes room.
        outranked = demand.gpus and not preemptor.reclaims
        none_kept: dict[str, int] = {}
        if outranked and not self.state.frees_room_below(demand, preemptor.priority, excluded, none_kept):
            return None
        found = self._eligible_of(preemptor)
        if found.gpus < demand.total_gpus - room.free_for(demand):
            return None
        if demand.gpus and not found.fits(demand, excluded):
            return None  # not even halting every candidate would make room
        eligible = found.jobs()
        if not eligible:
            return None
        freeing = room.freeing(demand, excluded)
        high = 0  # the gang fits with the first ``high`` victims freed (at least one)
        while high == 0 or not freeing.fits():
            if high == len(eligible):
                return None
            freeing.release(eligible[high].demand, eligible[high].gang)
            high += 1
        victims = eligible[:high]
        needed = [True] * high  # by position: a list's remove compares whole jobs, one by one
        for at in range(high - 2, -1, -1):
            victim = victims[at]
            freeing.take(victim.demand, victim.gang)
            if freeing.fits():
                needed[at] = False
            else:
                freeing.release(victim.demand, victim.gang)
        victims = [victim for victim, kept in zip(victims, needed, strict=True) if kept]
        for victim in victims:
            room.release(victim.demand, victim.gang)
        gang = room.find(demand, excluded)
        assert gang is not None  # the slots said it fits
        for victim in victims:
            room.take(victim.demand, victim.gang)
        self.chosen.update(victim.job_id for victim in victims)
        return victims, gang

    def _eligible_of(self, preemptor: Preemptor) -> Eligible:
        """The victims :meth:`_eligible` would list, with the GPUs they hold in all and on each
        node. For a preemptor that does not reclaim they depend only on its class, its GPU type,
        the running jobs and, where a tenant has a guarantee, its tenant and what each tenant
        holds, so they are memoised on those."""
        demand = preemptor.demand
        # whose jobs it may take depends on its tenant once a tenant has a guarantee (may_preempt)
        tenant = preemptor.tenant if self.ledger.any_guarantee else None
        gpu_type = demand.gpu_kind
        key = (preemptor.priority, gpu_type, tenant)
        known = None if preemptor.reclaims else self.eligible.get(key)
        # what they rest on: the victims chosen so far (and the jobs a drain's preemption halted,
        # which count as chosen), and where a guarantee protects jobs, what each tenant holds (every
        # hold, stop or release of a running job moves running_changes); a job placed in this step
        # is no victim yet (:meth:`_young`), so placements change none of them
        stamp = (len(self.chosen), self.state.running_changes if tenant is not None else 0)
        if known is not None and known[0] == stamp:
            return known[1]
        if preemptor.reclaims or tenant is not None or gpu_type is not None:
            eligible = self._eligible(preemptor)
            gpus = sum(victim.gang.gpus for victim in eligible)
            per_node, room = gpus_per_node(eligible), self.state.room
            found = Eligible(
                gpus,
                lambda demand, excluded: room.slots_with(demand, per_node, excluded) >= demand.learners,
                lambda: eligible,
                eligible,
            )
        else:
            found = self._below(preemptor.priority)
        if not preemptor.reclaims:
            self.eligible[key] = (stamp, found)
        return found

    def _below(self, priority: int) -> Eligible:
        """Every candidate of the classes below ``priority``: :meth:`_eligible` where no guarantee
        protects a job and no GPU type narrows the search. What they hold is what the state keeps
        for those classes less what their young jobs hold, so it costs the young jobs, not the
        running ones; the list is made only for a search that gets past the bounds."""
        state = self.state
        classes = sorted(p for p in state.by_start if p < priority)
        young = [entry[2] for p in classes for entry in state.by_start[p][: self._young(p)]]
        gpus = sum(state.gpus_by_priority.get(p, 0) for p in classes) - sum(job.gang.gpus for job in young)
        kept = gpus_per_node(young)
        # (the callables name what they read, not the pool: a pool whose memo held a listing that
        # held the pool was a cycle, and a run left every step's pool to the cyclic collector)
        now, min_runtime_s = self.now, self.min_runtime_s
        return Eligible(
            gpus,
            lambda demand, excluded: state.frees_room_below(demand, priority, excluded, kept),
            lambda: [job for p in classes for job in candidates(state, p, now, min_runtime_s)],
        )

    def _eligible(self, preemptor: Preemptor) -> list[HeldJob]:
        """The candidates that may be halted for ``preemptor`` and hold GPUs of a type it can use,
        lowest priority first (classes it does not outrank only when it reclaims its guarantee)."""
        room = self.state.room
        demand = preemptor.demand
        gpu_type = demand.gpu_kind
        taking: dict[str, int] = {}
        eligible = []
        for priority in self.priorities:
            if priority >= preemptor.priority and not preemptor.reclaims:
                break
            for victim in candidates(self.state, priority, self.now, self.min_runtime_s):
                if not self.may_preempt(preemptor, victim, taking):
                    continue
                if gpu_type is not None and all(
                    room.gpu_type(node) != gpu_type for node in victim.gang.nodes
                ):
                    continue
                eligible.append(victim)
                taking[victim.tenant] = taking.get(victim.tenant, 0) + self.state.held_charge(victim)
        return eligible


@dataclass(slots=True)
class Eligible:
    """The victims a search may take: the GPUs they hold, whether every learner of a demand would
    fit outside the nodes left out were they all halted (by GPUs: what its bounds read), and the
    jobs themselves in the order it takes them, listed only when a search gets past those bounds
    (:meth:`jobs`)."""

    gpus: int
    fits: Callable[[Demand, Set[str]], bool]
    listing: Callable[[], list[HeldJob]]
    listed: list[HeldJob] | None = None

    def jobs(self) -> list[HeldJob]:
        if self.listed is None:
            self.listed = self.listing()
        return self.listed


def gpus_per_node(jobs: Iterable[HeldJob]) -> dict[str, int]:
    """The GPUs ``jobs`` hold on each node."""
    held: dict[str, int] = {}
    for job in jobs:
        for node, gpus in job.gang.learners:
            held[node] = held.get(node, 0) + len(gpus)
    return held
