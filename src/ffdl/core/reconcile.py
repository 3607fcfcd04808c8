"""What the platform should do next for a job, as a pure function of the job's state.

Reactions are level-triggered: after every event of a job the driver asks ``next_action`` and
runs it unless the same action already runs or ran for the same state entry. After a crash the
same question asked of the folded state re-drives whatever was interrupted (a pending relaunch,
a release after an end), so no reaction is lost between an event and its effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from ffdl.core.decider import next_attempt
from ffdl.core.job import Job
from ffdl.core.states import JobState

S = JobState


class ActionKind(StrEnum):
    BEGIN_LAUNCH = "begin-launch"  # GPUs reserved by an older owner, which did not launch: start attempt N
    LAUNCH = "launch"  # start the learners of the attempt (idempotent)
    RELAUNCH = "relaunch"  # stop the failed gang, wait out the backoff, begin the next attempt
    STOP = "stop"  # stop the learners (halt)
    STORE = "store"  # record the results of a finished job
    RELEASE = "release"  # stop whatever is left, then free the GPUs


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    attempt: int
    since_seq: int  # the seq at which the job entered the state that calls for this action
    delay_s: float = 0.0

    @property
    def key(self) -> tuple[ActionKind, int, int]:
        return (self.kind, self.attempt, self.since_seq)


def next_action(job: Job, now: datetime) -> Action | None:
    entered = job.history[-1]
    state = job.state
    if state is S.SCHEDULED:
        return Action(ActionKind.BEGIN_LAUNCH, next_attempt(job) or 0, entered.seq)
    if state is S.LAUNCHING:
        return Action(ActionKind.LAUNCH, job.attempt, entered.seq)
    if state is S.RESTARTING:
        waited = (now - entered.at).total_seconds()
        return Action(ActionKind.RELAUNCH, job.attempt, entered.seq, max(0.0, job.backoff_s - waited))
    if state is S.HALTING:
        return Action(ActionKind.STOP, job.attempt, entered.seq)
    if state is S.STORING:
        return Action(ActionKind.STORE, job.attempt, entered.seq)
    if job.placement is not None and state.releasable:
        return Action(ActionKind.RELEASE, job.attempt, entered.seq)
    return None
