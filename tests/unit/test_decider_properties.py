"""Random command sequences through the decider keep every invariant of architecture §4 and §5.

Hypothesis drives two jobs with requests and observations (right and wrong attempts, ranks that
exist and ranks that do not, valid and broken placements, a scheduler that gets deposed, another
tenant, redelivered commands) through ``decide`` and folds the events with ``evolve``, as the job's
owner does. After every step: seq is contiguous, every event is legal in its state, terminal states
absorb, restarts stay within the manifest's limit, placements are held only where they may be,
deciding is deterministic, a redelivered command decides nothing, an accepted allocation launches
the next attempt in the same decision (no decision leaves a job in SCHEDULED), and the invariant
checker finds no violation in the log. An older owner's allocation (``GpusAllocated`` alone, as logs
of the older release hold) is folded in too, so the ``BeginLaunch`` from SCHEDULED keeps being tried.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from ffdl.core.aggregate import COMMAND_WINDOW
from ffdl.core.decider import UnknownJob, decide, next_attempt
from ffdl.core.invariants import InvariantChecker, check
from ffdl.core.job import Job, evolve
from ffdl.core.states import TERMINAL, JobState, is_legal
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.envelope import Command, CommandData, Event
from ffdl.events.model import (
    Checkpoint,
    ErrorCode,
    JobSpec,
    LearnerPlacement,
    LossReason,
    Placement,
    ResultSummary,
)

S = JobState
JOB_IDS = ("job-a", "job-b")
TENANT = "tenant-a"
START = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
COMMAND_IDS = uuid.UUID("0b8f3f1e-32c4-4a57-9a5e-8d7a61c2f4d0")

#: States in which a job must hold its gang's GPUs, and the one in which it never holds any.
MUST_HOLD_PLACEMENT = frozenset({S.SCHEDULED, S.LAUNCHING, S.RUNNING, S.RESTARTING, S.HALTING, S.STORING})
NEVER_HOLDS_PLACEMENT = frozenset({S.SUBMITTED})

job_ids = st.sampled_from(JOB_IDS)
ranks = st.integers(0, 3)  # specs have 1..3 learners, so some ranks do not exist
attempt_offsets = st.sampled_from((0, 0, 0, -1, 1))  # mostly the current attempt, sometimes stale or early
specs = st.builds(
    JobSpec,
    name=st.just("train"),
    command=st.just("python train.py"),
    learners=st.integers(1, 3),
    gpus=st.integers(0, 2),
    max_restarts=st.integers(0, 2),
)


class DeciderMachine(RuleBasedStateMachine):
    """The job owner's loop, in miniature: decide a command, check it, fold its events."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: dict[str, JobSpec] = {}
        self.jobs: dict[str, Job | None] = dict.fromkeys(JOB_IDS)
        self.log: list[Event] = []
        self.checker = InvariantChecker()
        self.leader_token = 1
        self.sent = 0
        self.now = START
        #: per job, the commands that produced events, oldest first (the ones the window remembers)
        self.effective: dict[str, list[Command]] = {job_id: [] for job_id in JOB_IDS}

    @initialize(chosen=st.tuples(specs, specs))
    def choose_specs(self, chosen: tuple[JobSpec, JobSpec]) -> None:
        self.specs = dict(zip(JOB_IDS, chosen, strict=True))

    # -- the owner's loop ------------------------------------------------------------------

    def _command(self, job_id: str, data: CommandData, tenant: str, token: int | None) -> Command:
        self.sent += 1
        self.now += timedelta(seconds=1)
        return Command(
            command_id=uuid.uuid5(COMMAND_IDS, str(self.sent)),
            job_id=job_id,
            tenant=tenant,
            issued_at=self.now,
            producer="property-test",
            fencing_token=token,
            data=data,
        )

    def _decide(self, job: Job | None, command: Command) -> list[Event]:
        return decide(job, command, self.now, leader_token=self.leader_token)

    def send(
        self, job_id: str, data: CommandData, *, tenant: str = TENANT, token: int | None = None
    ) -> list[Event]:
        """Decide ``data`` for ``job_id``, check the decision, fold it; returns the events."""
        command = self._command(job_id, data, tenant, token)
        before = self.jobs[job_id]
        if before is None and not isinstance(data, cmd.SubmitJob):
            with pytest.raises(UnknownJob):
                self._decide(before, command)
            return []
        events = self._decide(before, command)
        assert self._decide(before, command) == events, (
            "the same command on the same state decided differently"
        )
        after = before
        for event in events:
            state = after.state if after else None
            assert is_legal(state, type(event.data)), f"{event.type} decided in state {state}"
            assert event.seq == (after.seq if after else 0) + 1
            assert (event.job_id, event.tenant) == (job_id, TENANT), (
                f"{event.type} is not on the job's own log"
            )
            after = evolve(after, event)
            self.checker.feed(event, f"{job_id}#{event.seq}")
        assert after is not None
        if before is not None and after.state is S.SCHEDULED:
            assert before.state is S.SCHEDULED, (
                "a decision left the job in SCHEDULED: the launch is due with it"
            )
        if isinstance(data, cmd.AllocateGpus) and any(isinstance(e.data, ev.GpusAllocated) for e in events):
            assert before is not None
            launch = ev.JobLaunching(attempt=before.attempt + 1, resume_from=before.latest_checkpoint)
            assert [e.data for e in events][-1] == launch, (
                "the allocation's decision launches the next attempt"
            )
        if before is not None and before.state.terminal:
            assert after.state is before.state, f"terminal {before.state} became {after.state}"
        assert self._decide(after, command) == [], f"redelivered {command.type} decided again"
        self.jobs[job_id] = after
        self.log.extend(events)
        if events:
            self.effective[job_id].append(command)
        return events

    def _attempt(self, job_id: str, offset: int) -> int:
        job = self.jobs[job_id]
        return max(1, (job.attempt if job else 0) + offset)

    def _placement(self, job_id: str, shape: str) -> Placement:
        """A placement on the job's own nodes: whole and valid, or broken in the way ``shape`` says."""
        spec = self.specs[job_id]
        gpus = tuple(range(spec.gpus))
        if shape == "shared-gpu":
            gpus = (0,) * max(2, spec.gpus)
        elif shape == "extra-gpu":
            gpus = tuple(range(spec.gpus + 1))
        count = spec.learners - 1 if shape == "missing-rank" else spec.learners
        return Placement(
            learners=tuple(
                LearnerPlacement(rank=rank, node=f"{job_id}-node{rank}", gpus=gpus) for rank in range(count)
            )
        )

    # -- requests --------------------------------------------------------------------------

    @rule(job_id=job_ids)
    def submit(self, job_id: str) -> None:
        self.send(job_id, cmd.SubmitJob(spec=self.specs[job_id]))

    @rule(job_id=job_ids)
    def admit(self, job_id: str) -> None:
        self.send(job_id, cmd.AdmitJob())

    @rule(job_id=job_ids, code=st.sampled_from((ErrorCode.INVALID_MANIFEST, ErrorCode.UNSCHEDULABLE)))
    def reject(self, job_id: str, code: ErrorCode) -> None:
        self.send(job_id, cmd.RejectJob(code=code, reason="admission said no"))

    @rule(
        job_id=job_ids, shape=st.sampled_from(("valid", "valid", "missing-rank", "shared-gpu", "extra-gpu"))
    )
    def allocate(self, job_id: str, shape: str) -> None:
        self.send(job_id, cmd.AllocateGpus(placement=self._placement(job_id, shape)), token=self.leader_token)

    @rule(job_id=job_ids)
    def older_owner_allocates(self, job_id: str) -> None:
        """A log of the older release: its owner appended ``GpusAllocated`` alone, and launched on
        ``BeginLaunch``."""
        job = self.jobs[job_id]
        if job is None or job.state is not S.QUEUED or job.placement is not None:
            return
        self.now += timedelta(seconds=1)
        allocated = Event(
            event_id=uuid.uuid5(COMMAND_IDS, f"older-owner/{job_id}/{job.seq + 1}"),
            job_id=job_id,
            tenant=TENANT,
            seq=job.seq + 1,
            occurred_at=self.now,
            producer="older-owner",
            data=ev.GpusAllocated(placement=self._placement(job_id, "valid")),
        )
        self.jobs[job_id] = evolve(job, allocated)
        self.checker.feed(allocated, f"{job_id}#{allocated.seq}")
        self.log.append(allocated)

    @rule(job_id=job_ids, offset=st.sampled_from((-1, 0, 1, 2)))
    def begin_launch(self, job_id: str, offset: int) -> None:
        self.send(job_id, cmd.BeginLaunch(attempt=self._attempt(job_id, offset)))

    @rule(job_id=job_ids, reason=st.sampled_from(("", "maintenance")))
    def halt(self, job_id: str, reason: str) -> None:
        self.send(job_id, cmd.HaltJob(reason=reason))

    @rule(job_id=job_ids)
    def resume(self, job_id: str) -> None:
        self.send(job_id, cmd.ResumeJob())

    @rule(job_id=job_ids)
    def cancel(self, job_id: str) -> None:
        self.send(job_id, cmd.CancelJob(reason="changed my mind"))

    @rule(job_id=job_ids)
    def finish_storing(self, job_id: str) -> None:
        self.send(job_id, cmd.FinishStoring(result=ResultSummary(files=2, size_bytes=10)))

    @rule(job_id=job_ids)
    def release(self, job_id: str) -> None:
        self.send(job_id, cmd.ReleaseGpus())

    # -- observations ----------------------------------------------------------------------

    @rule(job_id=job_ids, rank=ranks, offset=attempt_offsets)
    def learner_started(self, job_id: str, rank: int, offset: int) -> None:
        self.send(
            job_id, cmd.ReportLearnerStarted(rank=rank, attempt=self._attempt(job_id, offset), pid=100 + rank)
        )

    @rule(job_id=job_ids, rank=ranks, offset=attempt_offsets, step=st.integers(0, 5))
    def progress(self, job_id: str, rank: int, offset: int, step: int) -> None:
        attempt = self._attempt(job_id, offset)
        self.send(
            job_id,
            cmd.ReportProgress(rank=rank, attempt=attempt, step=step, metrics={"loss": 1 / (step + 1)}),
        )

    @rule(job_id=job_ids, rank=ranks, offset=attempt_offsets, step=st.integers(0, 5))
    def checkpoint(self, job_id: str, rank: int, offset: int, step: int) -> None:
        attempt = self._attempt(job_id, offset)
        checkpoint = Checkpoint(
            rank=rank, attempt=attempt, step=step, uri=f"file:///ckpt/{job_id}/{attempt}/{step}"
        )
        self.send(job_id, cmd.ReportCheckpoint(checkpoint=checkpoint))

    @rule(job_id=job_ids, rank=ranks, offset=attempt_offsets, code=st.sampled_from((0, 0, 1, 137)))
    def learner_exited(self, job_id: str, rank: int, offset: int, code: int) -> None:
        self.send(
            job_id, cmd.ReportLearnerExited(rank=rank, attempt=self._attempt(job_id, offset), exit_code=code)
        )

    @rule(job_id=job_ids, rank=ranks, offset=attempt_offsets, reason=st.sampled_from(tuple(LossReason)))
    def learner_lost(self, job_id: str, rank: int, offset: int, reason: LossReason) -> None:
        self.send(
            job_id, cmd.ReportLearnerLost(rank=rank, attempt=self._attempt(job_id, offset), reason=reason)
        )

    # -- the happy path, so that random runs reach the deep states -------------------------

    @rule(job_id=job_ids, steps=st.integers(1, 8), exit_code=st.sampled_from((0, 0, 0, 1)))
    def advance(self, job_id: str, steps: int, exit_code: int) -> None:
        """Send, ``steps`` times, the command that a healthy platform would send next in the job's state."""
        for _ in range(steps):
            data = self._next_step(job_id, exit_code)
            self.send(job_id, data, token=self.leader_token if isinstance(data, cmd.AllocateGpus) else None)

    def _next_step(self, job_id: str, exit_code: int) -> CommandData:
        job = self.jobs[job_id]
        if job is None:
            return cmd.SubmitJob(spec=self.specs[job_id])
        pending = [learner.rank for learner in job.learners if not learner.has_started]
        active = [learner.rank for learner in job.learners if learner.active]
        idle = [learner.rank for learner in job.learners if learner.active and learner.step == 0]
        checkpointed = any(checkpoint.attempt == job.attempt for checkpoint in job.checkpoints)
        match job.state:
            case S.SUBMITTED:
                return cmd.AdmitJob()
            case S.QUEUED if job.placement is None:
                return cmd.AllocateGpus(placement=self._placement(job_id, "valid"))
            case S.SCHEDULED | S.RESTARTING:
                return cmd.BeginLaunch(attempt=next_attempt(job) or 1)
            case S.LAUNCHING if pending:
                return cmd.ReportLearnerStarted(rank=pending[0], attempt=job.attempt)
            case S.RUNNING if idle:
                return cmd.ReportProgress(
                    rank=idle[0], attempt=job.attempt, step=10 * job.attempt, metrics={"loss": 0.5}
                )
            case S.RUNNING if not checkpointed:
                uri = f"file:///ckpt/{job_id}/{job.attempt}/final"
                return cmd.ReportCheckpoint(
                    checkpoint=Checkpoint(rank=0, attempt=job.attempt, step=10 * job.attempt, uri=uri)
                )
            case S.RUNNING | S.HALTING | S.LAUNCHING if active:
                return cmd.ReportLearnerExited(rank=active[0], attempt=job.attempt, exit_code=exit_code)
            case S.HALTED:
                return cmd.ResumeJob()
            case S.STORING:
                return cmd.FinishStoring(result=ResultSummary())
            case _:
                return cmd.ReleaseGpus()

    # -- other senders ---------------------------------------------------------------------

    @rule()
    def elect_new_scheduler(self) -> None:
        self.leader_token += 1

    @rule(job_id=job_ids)
    def deposed_scheduler_allocates(self, job_id: str) -> None:
        placement = self._placement(job_id, "valid")
        events = self.send(job_id, cmd.AllocateGpus(placement=placement), token=self.leader_token - 1)
        if self.jobs[job_id] is not None:
            assert [type(event.data) for event in events] == [ev.CommandRejected]

    @rule(job_id=job_ids)
    def another_tenant_cancels(self, job_id: str) -> None:
        before = self.jobs[job_id]
        events = self.send(job_id, cmd.CancelJob(reason="not yours"), tenant="tenant-b")
        if before is not None:
            assert [type(event.data) for event in events] == [ev.CommandRejected]
            after = self.jobs[job_id]
            assert after is not None
            assert after.state is before.state

    @rule(job_id=job_ids, data=st.data())
    def redeliver_a_recent_command(self, job_id: str, data: st.DataObject) -> None:
        recent = self.effective[job_id][-COMMAND_WINDOW:]
        if not recent:
            return
        command = data.draw(st.sampled_from(recent), label="redelivered")
        assert self._decide(self.jobs[job_id], command) == [], f"redelivered {command.type} decided again"

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def seq_is_contiguous_per_job(self) -> None:
        for job_id in JOB_IDS:
            seqs = [event.seq for event in self.log if event.job_id == job_id]
            assert seqs == list(range(1, len(seqs) + 1))

    @invariant()
    def restarts_within_the_manifest_limit(self) -> None:
        for job in self.jobs.values():
            if job is not None:
                assert job.restarts <= job.spec.max_restarts

    @invariant()
    def placement_held_only_where_it_may_be(self) -> None:
        for job in self.jobs.values():
            if job is None:
                continue
            if job.state in MUST_HOLD_PLACEMENT:
                assert job.placement is not None, f"{job.state} without GPUs"
            if job.state in NEVER_HOLDS_PLACEMENT:
                assert job.placement is None, f"{job.state} holding GPUs"

    @invariant()
    def reason_belongs_to_the_current_state(self) -> None:
        """The reason a job shows is its current state's (a queued job's refined by the scheduler's
        wait, a halting one's by a later halt request), never one left from an earlier state."""
        for job in self.jobs.values():
            if job is not None and job.state not in (S.QUEUED, S.HALTING):
                assert job.reason == job.history[-1].reason, (job.state, job.reason)

    @invariant()
    def log_has_no_violation(self) -> None:
        assert self.checker.violations == []

    def teardown(self) -> None:
        """Release what ended jobs still hold (the finaliser's part); then the whole log is clean."""
        for job_id, job in self.jobs.items():
            if job is not None and job.state in TERMINAL and job.placement is not None:
                self.send(job_id, cmd.ReleaseGpus())
        assert self.checker.finish() == []
        assert check((event, f"{event.job_id}#{event.seq}") for event in self.log) == []


def test_random_command_sequences_keep_every_invariant() -> None:
    run_state_machine_as_test(
        DeciderMachine,
        settings=settings(
            max_examples=150,
            stateful_step_count=40,
            deadline=None,
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
