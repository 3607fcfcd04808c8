"""Least attained service in the scheduler role: bands from the fold, their wake-ups, aging, the loop guard.

The role derives each job's service from its folded history (:func:`ffdl.core.service.service_of`)
and brings a job's class up to date when its band changes with no event: a run crossing a threshold,
a wait aging. These drive the real deciders in virtual time (:class:`tests.scheduling.World`, which
also holds every step to a plan over state rebuilt from the fold).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from ffdl.core.job import Job
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.service import Service, band, next_change, service_of, started, stopped
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.wiring.config import SchedulerConfig, Settings
from tests.scheduling import World

#: one threshold of 100 GPU-seconds: a job of one node's 4 GPUs crosses it after 25 s
POLICY = SchedulerPolicy(min_runtime_s=10.0, service_queues=(100.0,), starve_after_s=300.0)


def run(world: World, job_id: str) -> None:
    """The job's learners start (it has GPUs)."""
    job = world.jobs[job_id]
    for rank in range(job.spec.learners):
        world.user(job_id, cmd.ReportLearnerStarted(rank=rank, attempt=max(job.attempt, 1)))


def exit_all(world: World, job_id: str) -> None:
    """The job's learners exit 0 and its GPUs are released: a halting job is halted (and requeued,
    if preempted)."""
    job = world.jobs[job_id]
    for rank in range(job.spec.learners):
        world.user(job_id, cmd.ReportLearnerExited(rank=rank, attempt=job.attempt, exit_code=0))
    world.user(job_id, cmd.ReleaseGpus())


def tick(world: World, seconds: float) -> None:
    world.clock += timedelta(seconds=seconds)


def test_a_job_past_its_threshold_is_halted_for_a_newcomer_of_its_priority() -> None:
    world = World(1, POLICY)
    world.submit("a", 1, 4, 0)
    world.settle()
    run(world, "job-1")
    tick(world, 20)
    world.submit("b", 1, 4, 0)
    world.settle()
    assert world.jobs["job-1"].state is JobState.RUNNING, "under its threshold (80 of 100 GPU-s): FIFO"
    assert world.jobs["job-2"].waiting is not None

    tick(world, 10)  # 120 GPU-s: the band changed with no event, and the next step sees it
    world.settle()
    first = world.jobs["job-1"]
    assert first.state is JobState.HALTING
    assert "preempted by job job-2, which has had less GPU time" in first.reason, first.reason

    exit_all(world, "job-1")
    world.settle()
    first, second = world.jobs["job-1"], world.jobs["job-2"]
    assert first.state is JobState.QUEUED and first.preemptions == 1
    assert second.placement is not None
    service = service_of(first, POLICY, 4)
    assert service.attained == 4 * 30.0  # from its allocation to the halt's start
    assert service.running_since is None and service.queued_since == world.now()


def halted_for_a_newcomer(world: World, job_id: str, tenant: str) -> Job:
    """``tenant`` submits a job of one node's GPUs that halts running ``job_id`` by its band; the
    halted job once its learners have exited, requeued."""
    world.submit(tenant, 1, 4, 0)
    world.settle()
    assert world.jobs[job_id].state is JobState.HALTING
    exit_all(world, job_id)
    world.settle()
    return world.jobs[job_id]


def test_a_tenant_cannot_halt_its_own_job_into_the_loop_guard() -> None:
    """Halted for a job of its own tenant, a job's preemption does not count towards the guard: a
    tenant once kicked its long job with short jobs of its own until the guard kept it in the top
    band for the rest of its run, above every other tenant's newcomers."""
    guarded_after_one = replace(POLICY, max_service_preemptions=1)
    world = World(1, guarded_after_one)
    world.submit("a", 1, 4, 0)
    world.settle()
    run(world, "job-1")
    tick(world, 30)  # 120 GPU-s: below a newcomer's band
    first = halted_for_a_newcomer(world, "job-1", "a")  # the same tenant's newcomer
    assert (first.preemptions, first.preemptions_for_own_tenant) == (1, 1)
    service = service_of(first, guarded_after_one, 4)
    assert service.preemptions == 0 and band(guarded_after_one, service, world.now()) == 1, "not guarded"

    run(world, "job-2")
    world.user("job-2", cmd.CancelJob(reason="done"))
    world.user("job-2", cmd.ReleaseGpus())
    world.settle()
    run(world, "job-1")
    tick(world, 10)
    first = halted_for_a_newcomer(world, "job-1", "b")  # another tenant's newcomer: this halt counts
    assert (first.preemptions, first.preemptions_for_own_tenant) == (2, 1)
    assert band(guarded_after_one, service_of(first, guarded_after_one, 4), world.now()) == 0, "guarded"


def test_a_job_without_gpus_is_served_by_what_its_cpus_count_as_and_moves_down_too() -> None:
    """A node has 16 CPUs per GPU: a job of 32 CPUs and no GPUs counts 2 GPUs, so it crosses the
    100 GPU-second threshold after 50 s. Counted by GPUs alone it stayed in the top band for ever,
    ahead of every GPU job of its priority that had run a while."""
    world = World(1, POLICY)
    world.submit("a", 1, 0, 0, cpus=32)
    world.settle()
    run(world, "job-1")
    tick(world, 45)
    world.settle()
    cpu_job = world.jobs["job-1"]
    assert service_of(cpu_job, POLICY, 2).attained == 0.0
    assert band(POLICY, service_of(cpu_job, POLICY, 2), world.now()) == 0, "90 of 100 GPU-s"
    tick(world, 10)
    assert band(POLICY, service_of(cpu_job, POLICY, 2), world.now()) == 1, "110 of 100 GPU-s"
    world.submit("b", 1, 4, 0, cpus=40)  # its CPUs do not fit beside the 32 taken
    world.settle()
    first = world.jobs["job-1"]
    assert first.state is JobState.HALTING
    assert "preempted by job job-2, which has had less GPU time" in first.reason, first.reason


def test_aging_serves_a_starved_job_first_and_it_starts_afresh() -> None:
    world = World(1, POLICY)
    world.submit("a", 1, 4, 0)
    world.settle()
    run(world, "job-1")
    tick(world, 30)
    world.submit("b", 1, 4, 0)
    world.settle()
    exit_all(world, "job-1")  # halted for job-2, requeued in the lower band
    world.settle()
    run(world, "job-2")
    aged_at = world.jobs["job-1"].history[-1].at.timestamp() + POLICY.starve_after_s
    assert next_change(POLICY, service_of(world.jobs["job-1"], POLICY, 4), world.now()) == aged_at

    tick(world, POLICY.starve_after_s)  # job-2 is past its threshold too; job-1 has aged on top
    world.settle()
    assert world.jobs["job-2"].state is JobState.HALTING
    exit_all(world, "job-2")
    world.settle()
    first = world.jobs["job-1"]
    assert first.placement is not None
    assert service_of(first, POLICY, 4).attained == 0.0, "aged into the top band, it is served afresh"


def test_the_loop_guard_keeps_a_job_halted_often_enough_on_top() -> None:
    guarded = SchedulerPolicy(min_runtime_s=10.0, service_queues=(100.0,), max_service_preemptions=1)
    once = Service(gpus=4, attained=500.0, preemptions=1, running_since=0.0)
    assert band(guarded, once, 1000.0) == 0 and next_change(guarded, once, 0.0) is None
    assert band(POLICY, once, 1000.0) == 1


def test_a_run_crosses_each_threshold_when_its_gpu_seconds_reach_it() -> None:
    policy = SchedulerPolicy(service_queues=(100.0, 400.0))
    service = started(policy, Service(gpus=4, attained=40.0), 1000.0)
    assert [band(policy, service, at) for at in (1000.0, 1014.9, 1015.0, 1089.9, 1090.0)] == [0, 0, 1, 1, 2]
    assert next_change(policy, service, 1000.0) == 1015.0
    assert next_change(policy, service, 1015.0) == 1090.0
    assert next_change(policy, service, 1090.0) is None
    assert stopped(policy, service, 1050.0).attained == 40.0 + 4 * 50.0


# Times as float seconds since the epoch: ``(q + s) - q`` may round below ``s``, and
# ``since + (t - a) / g`` times ``g`` may round below ``t``; the band must not depend on it.
SECONDS = st.floats(0, 2e9, allow_nan=False, allow_infinity=False)
THRESHOLDS = (3600.0, 57600.0)


@given(queued_at=SECONDS, attained=st.sampled_from([3600.0, 4000.0, 57600.0, 1e6]), wait=st.floats(1, 1e6))
@example(queued_at=505834.93993568985, attained=4000.0, wait=86400.0)
def test_a_waiting_job_is_in_the_top_band_when_its_aging_wakes_it(
    queued_at: float, attained: float, wait: float
) -> None:
    policy = SchedulerPolicy(service_queues=THRESHOLDS, starve_after_s=wait)
    service = Service(gpus=1, attained=attained, queued_since=queued_at)
    wake = next_change(policy, service, queued_at)
    assert wake is not None
    assert band(policy, service, wake) == 0
    assert started(policy, service, wake).attained == 0.0  # and it starts afresh


@given(since=SECONDS, gpus=st.sampled_from([1, 2, 3, 4, 8, 16, 24]))
@example(since=260457.0375251003, gpus=2)
def test_a_run_stopped_as_it_crosses_a_threshold_has_attained_it(since: float, gpus: int) -> None:
    policy = SchedulerPolicy(service_queues=THRESHOLDS)
    service = started(policy, Service(gpus=gpus), since)
    crossing = next_change(policy, service, since)
    assert crossing is not None and band(policy, service, crossing) == 1
    halted = stopped(policy, service, crossing)
    assert halted.attained >= THRESHOLDS[0]
    assert band(policy, halted, crossing) == 1


def test_without_service_queues_the_class_is_the_priority() -> None:
    world = World(1, SchedulerPolicy(min_runtime_s=10.0))
    world.submit("a", 1, 4, 0)
    world.settle()
    run(world, "job-1")
    tick(world, 3600)
    world.submit("b", 1, 4, 0)
    world.settle()
    assert world.jobs["job-1"].state is JobState.RUNNING, "no bands: a newcomer of its class waits"


def test_the_configuration_turns_bands_on_by_default_and_refuses_thresholds_that_do_not_rise() -> None:
    assert Settings().scheduler_policy().service_queues == (3600.0, 16 * 3600.0)
    assert (
        Settings(scheduler=SchedulerConfig(service_queues_gpu_hours=[])).scheduler_policy().service_queues
        == ()
    )
    for wrong in ([16.0, 1.0], [1.0, 1.0], [0.0], [math.inf]):
        with pytest.raises(ValidationError):
            SchedulerConfig(service_queues_gpu_hours=wrong)


def test_the_configuration_sets_whether_a_drain_may_preempt_and_what_a_halt_costs() -> None:
    configured = Settings(scheduler=SchedulerConfig(preempt_drains=True, checkpoint_cost_s=600.0))
    policy = configured.scheduler_policy()
    assert (policy.preempt_drains, policy.checkpoint_cost_s) == (True, 600.0)
    for wrong in (-1.0, math.inf):
        with pytest.raises(ValidationError):
            SchedulerConfig(checkpoint_cost_s=wrong)


def test_the_configuration_refuses_an_endless_aging_or_minimum_runtime() -> None:
    # an aging at infinity would be a wake-up the simulator runs to (and utilisation NaN) and one the
    # role keeps for ever; a minimum runtime of NaN compares false with everything
    for field in ("starve_after_s", "min_runtime_s"):
        for wrong in (math.inf, math.nan):
            with pytest.raises(ValidationError):
                SchedulerConfig.model_validate({field: wrong})
