"""Least attained service within a priority class: Tiresias' discretised LAS, with aging and a loop guard.

Runtimes are unknown, and training runtimes have a heavy tail: a job that has run long is likely
to run much longer. So within each priority class the jobs that have been served least come first.
``SchedulerPolicy.service_queues`` are thresholds in GPU-seconds a job has run (the sum of its
running intervals, which the event log holds, times its GPUs, or the GPU-equivalents its CPUs or
memory count as where more: :class:`~ffdl.core.cluster.Charges`): they split the class into bands,
the least served band first. The planner sees a band as a finer priority class
(:meth:`~ffdl.core.scheduling.SchedulerPolicy.band_class`), so its queue
order, reservations and preemption of a lower class (checkpointed halts, never within
``min_runtime_s`` of a start) rank the least served first: a running job that crosses a threshold
holds its GPUs in the lower band's class from then on, and a newcomer may halt it.

* **Aging**: a job of a lower band that has waited ``starve_after_s`` since it queued is in the top
  band, and when it starts its attained service counts from zero again.
* **Loop guard**: a job halted ``max_service_preemptions`` times stays in the top band. Halts that
  made room for its own tenant's jobs do not count: else a tenant halted its own long job that
  many times with short jobs of its own, and that job held the top band, above every other
  tenant's newcomers, for the rest of its run.

One definition for both users of it: the scheduler role derives a job's :class:`Service` from its
folded history (:func:`service_of`), the simulator keeps one per job as virtual time goes by; both
ask the functions here what band a job is in and when it next changes without any event.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ffdl.core.job import Job
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.states import JobState

#: The states of a run: GPUs allocated and not being given up. A run ends when the job leaves them
#: (a halt starts, it ends or stores its results): what it attained is counted up to there.
_SERVING = frozenset({JobState.SCHEDULED, JobState.LAUNCHING, JobState.RUNNING, JobState.RESTARTING})


@dataclass(frozen=True, slots=True)
class Service:
    """What least-attained-service needs to know of one job."""

    #: what it holds while it runs, in GPUs: GPU-equivalents where its CPUs or memory count more
    #: (:class:`~ffdl.core.cluster.Charges`), so a job without GPUs is served, and moves down, too
    gpus: float
    #: GPU-seconds run in its past runs (since aging last let it start afresh)
    attained: float = 0.0
    #: how often it was halted to be requeued (preempted, or moved off a node), preemptions that made
    #: room for its own tenant's jobs aside: what the loop guard counts
    preemptions: int = 0
    #: when its current run started, if it runs
    running_since: float | None = None
    #: when it last queued, if it waits
    queued_since: float | None = None


def _guarded(policy: SchedulerPolicy, service: Service) -> bool:
    """Whether the loop guard keeps the job in the top band: halted often enough already."""
    return service.preemptions >= policy.max_service_preemptions


def _crossings(policy: SchedulerPolicy, service: Service) -> list[tuple[float, float]]:
    """Each threshold the current run has not attained yet, with when it crosses it (one formula, so
    the band, the time it changes and what a run stopped then has attained agree to the last bit)."""
    since = service.running_since
    if since is None or service.gpus <= 0:
        return []
    return [
        (threshold, since + (threshold - service.attained) / service.gpus)
        for threshold in policy.service_queues
        if threshold > service.attained
    ]


def _aged(policy: SchedulerPolicy, service: Service, now: float) -> bool:
    """Whether the job has waited ``starve_after_s`` by ``now``: compared with the very sum its
    wake-up is set for, so the wake-up always finds it aged (``now - queued_since`` may round below)."""
    return service.queued_since is not None and now >= service.queued_since + policy.starve_after_s


def band(policy: SchedulerPolicy, service: Service, now: float) -> int:
    """The job's band at ``now``: how many thresholds it has attained; the top band for a job the
    loop guard protects or, waiting, one that has waited ``starve_after_s``."""
    if not policy.service_queues or _guarded(policy, service):
        return 0
    attained = sum(1 for threshold in policy.service_queues if threshold <= service.attained)
    if service.running_since is not None:
        return attained + sum(1 for _, at in _crossings(policy, service) if at <= now)
    if attained and _aged(policy, service, now):
        return 0
    return attained


def band_changes(policy: SchedulerPolicy, service: Service) -> list[float]:
    """Every time the job's band may change with nothing happening to it: its run crossing each
    threshold not attained yet, its wait aging (none for a job the loop guard keeps on top)."""
    if not policy.service_queues or _guarded(policy, service):
        return []
    if service.running_since is not None:
        return [at for _, at in _crossings(policy, service)]
    if service.queued_since is not None and any(t <= service.attained for t in policy.service_queues):
        return [service.queued_since + policy.starve_after_s]
    return []


def next_change(policy: SchedulerPolicy, service: Service, now: float) -> float | None:
    """When the job's band changes next after ``now`` with nothing happening to it, if ever."""
    return min((at for at in band_changes(policy, service) if at > now), default=None)


def started(policy: SchedulerPolicy, service: Service, now: float) -> Service:
    """The job gets GPUs at ``now``: a run starts; aged into the top band, it starts afresh."""
    attained = service.attained
    if _aged(policy, service, now) and any(threshold <= attained for threshold in policy.service_queues):
        attained = 0.0
    return Service(service.gpus, attained, service.preemptions, now, None)


def stopped(policy: SchedulerPolicy, service: Service, now: float) -> Service:
    """The run ends at ``now``: what it ran is attained, and at least every threshold it has crossed
    by then (stopped at the very time of a crossing, the product may round just below it)."""
    attained = service.attained
    if service.running_since is not None:
        attained += (now - service.running_since) * service.gpus
        attained = max([attained, *(threshold for threshold, at in _crossings(policy, service) if at <= now)])
    return Service(service.gpus, attained, service.preemptions, None, None)


def queued(service: Service, now: float) -> Service:
    """The job queues at ``now``."""
    return Service(service.gpus, service.attained, service.preemptions, None, now)


def service_of(job: Job, policy: SchedulerPolicy, gpus: float) -> Service:
    """A job's service, read off its folded history: each run from its SCHEDULED entry to the first
    entry out of the running states, each wait from its QUEUED entry; and the halts that requeued
    it. ``gpus``: what it holds while it runs (:attr:`Service.gpus`)."""
    service = Service(gpus)
    for entry in job.history:
        at = entry.at.timestamp()
        if entry.state is JobState.SCHEDULED:
            service = started(policy, service, at)
        elif service.running_since is not None and entry.state not in _SERVING:
            service = stopped(policy, service, at)
        if entry.state is JobState.QUEUED:
            service = queued(service, at)
    return replace(service, preemptions=job.preemptions - job.preemptions_for_own_tenant)
