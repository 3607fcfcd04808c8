"""Every reason ``ffdl why`` can give, each from a scenario that produces it, and the answer the
projection builds from the recorded reason (queue position, what the job waits for)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ffdl.core.allocator import Node
from ffdl.core.cluster import ClusterState, Demand, Gang, HeldJob
from ffdl.core.decider import decide
from ffdl.core.job import Job, WaitRecord, evolve
from ffdl.core.scheduling import Plan, SchedulerPolicy, WaitingJob, plan
from ffdl.core.tenancy import TenancyPolicy, TenantQuota
from ffdl.events import job_commands as cmd
from ffdl.events.envelope import Command, CommandData, Event
from ffdl.events.model import JobSpec, WaitReason
from ffdl.projections.store import LoggedEvent, Projection

W = WaitReason
NOW = 10_000.0


def hold(
    state: ClusterState, job_id: str, node: str, gpus: range, *, priority: int = 0, tenant: str = "a"
) -> None:
    state.hold(HeldJob(job_id, tenant, Demand(1, len(gpus)), priority, Gang(((node, tuple(gpus)),)), 0.0))


def job(
    job_id: str, demand: Demand, *, tenant: str = "a", priority: int = 0, order: float = 1.0
) -> WaitingJob:
    return WaitingJob(job_id, tenant, demand, priority, (order, job_id))


def again(jobs: list[WaitingJob], decided: Plan) -> list[WaitingJob]:
    return [
        WaitingJob(j.job_id, j.tenant, j.demand, j.priority, j.queued_order, decided.waits.get(j.job_id))
        for j in jobs
        if j.job_id in decided.waits
    ]


def test_quota_a_tenant_at_its_limit_waits_even_with_free_gpus() -> None:
    policy = SchedulerPolicy(TenancyPolicy({"a": TenantQuota(guaranteed_gpus=4, borrowing_limit_gpus=2)}))
    state = ClusterState([Node("n0", 8)])
    hold(state, "running", "n0", range(4))
    wait = plan(state, [job("more", Demand(1, 4))], NOW, policy).waits["more"]
    assert wait.code is W.QUOTA
    assert "at most 6 GPUs (4 guaranteed + 2 borrowed)" in wait.detail


def test_quota_a_job_bigger_than_its_tenant_may_ever_hold_says_it_can_never_run() -> None:
    policy = SchedulerPolicy(TenancyPolicy({"a": TenantQuota(guaranteed_gpus=2, borrowing_limit_gpus=0)}))
    wait = plan(ClusterState([Node("n0", 8)]), [job("huge", Demand(1, 4))], NOW, policy).waits["huge"]
    assert wait.code is W.QUOTA and "cannot run under this quota" in wait.detail


def test_capacity_too_few_gpus_are_free() -> None:
    state = ClusterState([Node("n0", 8)])
    hold(state, "busy", "n0", range(6))
    assert (
        plan(state, [job("wants-4", Demand(1, 4))], NOW, SchedulerPolicy()).waits["wants-4"].code
        is W.CAPACITY
    )


def test_fragmentation_enough_gpus_are_free_but_scattered() -> None:
    state = ClusterState([Node("n0", 8), Node("n1", 8)])
    hold(state, "left", "n0", range(4))
    hold(state, "right", "n1", range(4))
    wait = plan(state, [job("wants-8", Demand(1, 8))], NOW, SchedulerPolicy()).waits["wants-8"]
    assert wait.code is W.FRAGMENTATION


def test_gpu_type_gpus_are_free_but_not_of_the_type_asked_for() -> None:
    state = ClusterState([Node("a100-node", 8, "a100"), Node("h100-node", 8, "h100")])
    hold(state, "busy", "h100-node", range(8))
    wanted = Demand(1, 4, gpu_type="h100")
    assert plan(state, [job("h100-job", wanted)], NOW, SchedulerPolicy()).waits["h100-job"].code is W.GPU_TYPE


def test_priority_a_higher_priority_job_waits_ahead_for_the_same_gpus() -> None:
    state = ClusterState([Node("n0", 8)])
    hold(state, "busy", "n0", range(8), priority=20)
    jobs = [job("important", Demand(1, 8), priority=10), job("ordinary", Demand(1, 4), priority=0)]
    wait = plan(state, jobs, NOW, SchedulerPolicy()).waits["ordinary"]
    assert wait.code is W.PRIORITY and wait.waiting_for == ("important",)


def test_priority_a_wait_keeps_naming_a_job_while_it_still_waits_ahead() -> None:
    """A priority wait names the first blocked job of a higher class the step walks, and that order
    moves with the tenants' shares; a job whose recorded wait names another that still waits
    ahead keeps it (no new event, the same ``since``) and is given the first anew once the job
    it names got GPUs."""
    policy = SchedulerPolicy(max_reservations=0)
    state = ClusterState([Node("n0", 8)])
    hold(state, "busy-a", "n0", range(4), priority=20, tenant="z")
    hold(state, "busy-b", "n0", range(4, 8), priority=20, tenant="z")
    later = job("hi-b", Demand(1, 4), tenant="b", priority=10, order=2.0)
    low = job("low", Demand(1, 4), tenant="c", order=0.0)
    first = plan(state, [later, low], NOW, policy)
    recorded = first.waits["low"]
    assert recorded.code is W.PRIORITY and recorded.waiting_for == ("hi-b",)

    walked_first = job("hi-a", Demand(1, 8), tenant="a", priority=10, order=3.0)
    newcomer = job("low-new", Demand(1, 4), tenant="d", order=4.0)
    second = plan(state, [*again([later, low], first), walked_first, newcomer], NOW + 1, policy)
    assert second.waits["low-new"].waiting_for == ("hi-a",)  # the first blocked job walked now
    assert second.waits.get("low", recorded) is recorded  # hi-b still waits ahead: no change

    state.release("busy-b")  # hi-b fits now; hi-a still does not
    recorded_now = {**first.waits, **second.waits}  # a job not named keeps its reason
    queue = [j.with_wait(recorded_now[j.job_id]) for j in (later, low, walked_first)]
    third = plan(state, queue, NOW + 2, policy)
    assert [a.job_id for a in third.allocations] == ["hi-b"]
    assert third.waits["low"].code is W.PRIORITY and third.waits["low"].waiting_for == ("hi-a",)


def test_priority_a_recorded_wait_that_names_no_job_waiting_ahead_is_given_afresh() -> None:
    """A recorded priority wait is kept only on what this step finds: one naming a job that is not
    waiting (gone, or a name the log should never have held), a job of the same class, or one
    blocked for another GPU type, is replaced by the job that does wait ahead."""
    state = ClusterState([Node("n0", 8, "a100"), Node("n1", 8, "h100")])
    hold(state, "busy-0", "n0", range(8), priority=20, tenant="z")
    hold(state, "busy-1", "n1", range(8), priority=20, tenant="z")
    ahead = job("ahead", Demand(1, 8, gpu_type="a100"), priority=10, order=0.0)
    other_type = job("other-type", Demand(1, 8, gpu_type="h100"), tenant="b", priority=10, order=0.5)
    peer = job("peer", Demand(1, 8, gpu_type="a100"), tenant="c", order=1.0)
    queue = [ahead, other_type, peer]
    first = plan(state, queue, NOW, SchedulerPolicy())
    told = first.waits["peer"]
    assert told.code is W.PRIORITY and told.waiting_for == ("ahead",)
    recorded = {job.job_id: first.waits[job.job_id] for job in queue}
    for named in ("ghost", "peer-of-its-class", "other-type"):
        stale = WaitRecord(W.PRIORITY, f"needs 1 learner(s) x 8 GPU(s); job {named} waits ahead", (named,))
        waiting = [j.with_wait(stale if j is peer else recorded[j.job_id]) for j in queue]
        if named == "peer-of-its-class":  # walked before peer (tenant a), and blocked too
            waiting.append(job(named, Demand(1, 8, gpu_type="a100"), order=0.9).with_wait(told))
        decided = plan(state, waiting, NOW + 1, SchedulerPolicy())
        assert decided.waits["peer"].waiting_for == ("ahead",), named


def test_priority_a_wait_that_still_holds_is_kept_when_reservations_are_what_keep_the_job_out() -> None:
    """A job of a lower class behind a head of a higher class: while the head still waits, the
    job's recorded priority wait (it fit nowhere) is kept when the room changes so that it would
    fit but for the head's reserved nodes (a ``reservation`` for a job with no recorded reason):
    the two would otherwise swap at every job that ends or starts near it."""
    state = ClusterState([Node("n0", 8), Node("n1", 8)])
    hold(state, "busy", "n0", range(4), priority=20)
    hold(state, "other", "n1", range(8), priority=20)
    big = job("big", Demand(2, 8), priority=10, order=0.0)
    low = job("low", Demand(1, 8), tenant="c", order=1.0)
    first = plan(state, [big], NOW, SchedulerPolicy())
    second = plan(state, [*again([big], first), low], NOW + 1, SchedulerPolicy())
    recorded = second.waits["low"]
    assert recorded.code is W.PRIORITY and recorded.waiting_for == ("big",)
    assert second.waits["big"].reserved_nodes == ("n0", "n1")

    state.release("other")  # n1 is empty now, but kept for big
    newcomer = job("low-new", Demand(1, 8), tenant="d", order=2.0)
    third = plan(state, [*again([big, low], second), newcomer], NOW + 2, SchedulerPolicy())
    assert third.waits["low-new"].code is W.RESERVATION  # what a job with no reason is told
    assert third.waits.get("low", recorded) is recorded
    assert not third.allocations


def test_reservation_it_would_fit_but_only_on_nodes_kept_for_an_older_job() -> None:
    state = ClusterState([Node("n0", 8), Node("n1", 8)])
    hold(state, "busy", "n0", range(4))
    jobs = [job("big", Demand(2, 8), order=0.0)]
    first = plan(state, jobs, NOW, SchedulerPolicy(max_reservations=1))
    decided = plan(state, [*again(jobs, first), job("small", Demand(1, 2))], NOW + 1, SchedulerPolicy())
    wait = decided.waits["small"]
    assert wait.code is W.RESERVATION and wait.waiting_for == ("big",)
    assert decided.waits["big"].reserved_nodes == ("n0", "n1")


def test_preemption_it_waits_for_the_jobs_halted_for_it() -> None:
    state = ClusterState([Node("n0", 8)])
    hold(state, "low", "n0", range(8), priority=0, tenant="b")
    wait = plan(state, [job("high", Demand(1, 8), priority=5)], NOW, SchedulerPolicy()).waits["high"]
    assert wait.code is W.PREEMPTION and wait.waiting_for == ("low",)
    assert "preempting 1 job(s) (low)" in wait.detail


# -- the answer from the projection ---------------------------------------------------------------

START = datetime(2026, 1, 1, tzinfo=UTC)


class Log:
    """Jobs driven through the real decider, their events folded into a real projection."""

    def __init__(self, path: Path) -> None:
        self.projection = Projection(path)
        self.jobs: dict[str, Job] = {}
        self.offset = 0

    def send(self, job_id: str, data: CommandData, at: timedelta, tenant: str = "a") -> list[Event]:
        command = Command(
            command_id=uuid.uuid4(),
            job_id=job_id,
            tenant=tenant,
            issued_at=START + at,
            producer="test",
            data=data,
        )
        events = decide(self.jobs.get(job_id), command, START + at)
        for event in events:
            self.jobs[job_id] = evolve(self.jobs.get(job_id), event)
        self.projection.apply([LoggedEvent(e, 0, self.offset + i) for i, e in enumerate(events)])
        self.offset += len(events)
        return events

    def queue(self, job_id: str, gpus: int, at: timedelta, priority: int = 0, tenant: str = "a") -> None:
        spec = JobSpec(name=job_id, command="train", gpus=gpus, priority=priority)
        self.send(job_id, cmd.SubmitJob(spec=spec), at, tenant)
        self.send(job_id, cmd.AdmitJob(), at, tenant)


def test_a_reason_names_a_few_of_many_long_ids_and_stays_one_the_scheduler_can_send() -> None:
    """Thirty preempting jobs with 128-character ids (a tenant picks them) each keep a node; a gang
    spread over all thirty waits for them. Naming every one made a reason over the 2,000 characters
    a ``RecordWaitReason`` may have: building it raised in every planning step, for every tenant."""
    nodes = 30
    state = ClusterState([Node(f"n{i}", 2) for i in range(nodes)])
    for i in range(nodes):
        hold(state, f"victim-{i}", f"n{i}", range(1), tenant="victims")
    claimants = [
        job(f"{i:02d}" + "x" * 126, Demand(1, 2), tenant="attacker", priority=100, order=1.0 + i)
        for i in range(nodes)
    ]
    spread = job("spread", Demand(nodes, 1, policy="spread"), tenant="attacker", priority=50, order=100.0)

    waits = plan(state, [*claimants, spread], NOW, SchedulerPolicy(min_runtime_s=0.0)).waits

    assert waits["spread"].code is W.RESERVATION and len(waits["spread"].waiting_for) == nodes
    assert waits["spread"].detail.count("x" * 126) == 5 and " ..." in waits["spread"].detail
    for wait in waits.values():
        sent = cmd.RecordWaitReason(
            code=wait.code,
            detail=wait.detail,
            waiting_for=wait.waiting_for,
            reserved_nodes=wait.reserved_nodes,
        )
        assert sent.detail == wait.detail


def test_why_answers_with_the_recorded_reason_the_queue_position_and_what_it_waits_for(
    tmp_path: Path,
) -> None:
    log = Log(tmp_path / "projections.sqlite")
    log.queue("first", 8, timedelta(seconds=1))
    log.queue("urgent", 8, timedelta(seconds=2), priority=5, tenant="b")
    log.queue("second", 4, timedelta(seconds=3))
    reason = cmd.RecordWaitReason(
        code=W.RESERVATION,
        detail="needs 1 learner(s) x 4 GPU(s); it would fit, "
        "but only on nodes kept free for first, ahead of it",
        waiting_for=("first",),
    )
    assert [e.type for e in log.send("second", reason, timedelta(seconds=4))] == ["JobWaiting"]
    assert log.send("second", reason, timedelta(seconds=5)) == [], "an unchanged reason is not recorded again"
    answer = log.projection.why("second")
    assert answer is not None
    assert answer["state"] == "QUEUED"
    assert answer["position"] == 3 and answer["queue_length"] == 3 and answer["tenant_position"] == 2
    assert answer["waiting"]["code"] == "reservation" and answer["waiting"]["waiting_for"] == ["first"]
    assert answer["summary"].startswith("second waits (reservation, position 3 of 3 in the queue)")
    assert "waiting for first" in answer["summary"]
    fresh = log.projection.why("first")
    assert fresh is not None and fresh["waiting"] is None and "has not weighed it yet" in fresh["summary"]


def test_why_for_a_job_that_waits_no_more_gives_its_state(tmp_path: Path) -> None:
    log = Log(tmp_path / "projections.sqlite")
    log.queue("done-waiting", 1, timedelta(seconds=1))
    log.send("done-waiting", cmd.CancelJob(reason="not needed"), timedelta(seconds=2))
    answer = log.projection.why("done-waiting")
    assert answer is not None and answer["waiting"] is None
    assert answer["summary"] == "done-waiting is CANCELLED: not needed"
    assert log.projection.why("no-such-job") is None
