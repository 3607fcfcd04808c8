"""The scheduler's kept cluster state and queue decide exactly what ones rebuilt from its fold decide.

The scheduler brings its cluster state and waiting queue up to date between planning steps instead
of rebuilding them from every job it knows (:mod:`ffdl.handlers.scheduler_state`). Here it runs
against the real deciders of the owner and the nodes, over random sequences of submissions,
deliveries of its commands (in any order, some late), learners ending, GPUs released, cancels,
cordons and the clock moving; before every step its plan must equal, placements, preemptions and
every reason, the plan over a cluster state and queue built afresh from the same fold.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.tenancy import TenancyPolicy, TenantQuota
from ffdl.events import job_commands as cmd
from tests.scheduling import World

TENANTS = ("a", "b", "c")
POLICY = SchedulerPolicy(
    tenancy=TenancyPolicy(
        {"a": TenantQuota(4, None), "b": TenantQuota(2, 6, weight=2.0), "c": TenantQuota(0, 4)}
    ),
    min_runtime_s=10.0,
)
#: with least-attained-service bands small enough for the clock's ticks to cross them and age waits
BANDED = replace(POLICY, service_queues=(40.0, 200.0), starve_after_s=90.0, max_service_preemptions=2)


actions = st.lists(
    st.one_of(
        *[
            st.tuples(
                st.just("submit"),
                st.sampled_from(TENANTS),
                st.integers(1, 3),
                st.sampled_from([0, 1, 2, 4]),
                st.sampled_from([-5, 0, 5]),
                st.sampled_from([1.0, 24.0]),  # 24 of a node's 64 CPUs count more than its 4 GPUs' share
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


@pytest.mark.parametrize("policy", [POLICY, BANDED], ids=["classes", "service-bands"])
@settings(max_examples=80, deadline=None)
@given(nodes=st.integers(1, 4), steps=actions)
def test_the_kept_state_plans_exactly_as_one_rebuilt_from_the_fold(
    policy: SchedulerPolicy, nodes: int, steps: list[Any]
) -> None:
    world = World(nodes, policy)
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
