"""Job states and the single transition table (architecture §4): nothing else changes a job's state.

The table maps each event type to the states in which it may be applied and the state it leads to.
An event absent from a state's row is illegal there; the decider never emits one, ``evolve``
refuses one, and ``ffdl verify`` reports one. Terminal states accept only the bookkeeping events
that follow an end (GPUs released, a command rejected).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from ffdl.events import job_events as ev
from ffdl.events.envelope import EventData


class JobState(StrEnum):
    """FfDL's nearest status in brackets: SUBMITTED [NOT_STARTED], SCHEDULED [PENDING], ..."""

    SUBMITTED = "SUBMITTED"
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    HALTING = "HALTING"
    HALTED = "HALTED"
    STORING = "STORING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    # The classes of states every role asks about. Each is read off the transition table or the
    # sets beside it, so no role keeps a copy of its own that could drift from the table.

    @property
    def terminal(self) -> bool:
        """An end: the state absorbs every event but bookkeeping."""
        return self in TERMINAL

    @property
    def holds_learners(self) -> bool:
        """Learner processes of this job may be alive (and record checkpoints) in this state."""
        return self in _WITH_LEARNERS

    @property
    def observes_learners(self) -> bool:
        """The current attempt's learners run, so their starts, progress, exits and losses apply."""
        return self in _ACTIVE

    @property
    def releasable(self) -> bool:
        """GPUs the job still holds are given back in this state (an end, a halt, a requeue)."""
        return self in TRANSITIONS[ev.GpusReleased]

    @property
    def haltable(self) -> bool:
        """A halt request starts a halt here (HALTING and HALTED are halts already)."""
        return self in TRANSITIONS[ev.HaltRequested] and self not in (JobState.HALTING, JobState.HALTED)

    @property
    def preemptible(self) -> bool:
        """The scheduler may halt the job to make room: it holds GPUs and is not stopping already."""
        return self in _PREEMPTIBLE


S = JobState
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED})
_WITH_LEARNERS = frozenset({S.LAUNCHING, S.RUNNING, S.RESTARTING, S.HALTING, S.STORING})
_LIVE = frozenset(S) - TERMINAL
_ACTIVE = frozenset({S.LAUNCHING, S.RUNNING, S.HALTING})
_PREEMPTIBLE = frozenset({S.SCHEDULED, S.LAUNCHING, S.RUNNING, S.RESTARTING})


def _same(states: frozenset[JobState]) -> dict[JobState | None, JobState]:
    return {state: state for state in states}


#: event type -> {state before -> state after}. ``None`` stands for "no job yet".
TRANSITIONS: Mapping[type[EventData], Mapping[JobState | None, JobState]] = {
    ev.JobSubmitted: {None: S.SUBMITTED},
    ev.JobAccepted: {S.SUBMITTED: S.SUBMITTED},
    ev.JobRejected: {S.SUBMITTED: S.FAILED},
    ev.JobQueued: {S.SUBMITTED: S.QUEUED, S.HALTED: S.QUEUED},
    ev.JobWaiting: {S.QUEUED: S.QUEUED},
    ev.GpusAllocated: {S.QUEUED: S.SCHEDULED},
    ev.JobLaunching: {S.SCHEDULED: S.LAUNCHING, S.RESTARTING: S.LAUNCHING},
    ev.LearnerStarted: _same(_ACTIVE),
    ev.JobRunning: {S.LAUNCHING: S.RUNNING},
    ev.LearnerProgressed: _same(_ACTIVE),
    ev.CheckpointRecorded: _same(_WITH_LEARNERS),
    ev.LearnerExited: _same(_ACTIVE),
    ev.LearnerLost: _same(_ACTIVE),
    ev.JobRestarting: {S.LAUNCHING: S.RESTARTING, S.RUNNING: S.RESTARTING},
    ev.HaltRequested: {
        S.QUEUED: S.QUEUED,
        S.SCHEDULED: S.SCHEDULED,
        S.LAUNCHING: S.HALTING,
        S.RUNNING: S.HALTING,
        S.RESTARTING: S.HALTING,
        S.HALTING: S.HALTING,  # a user's halt overriding a preemption's requeue
    },
    ev.JobHalted: {S.QUEUED: S.HALTED, S.SCHEDULED: S.HALTED, S.HALTING: S.HALTED},
    ev.ResumeRequested: {S.HALTED: S.HALTED},
    ev.CancelRequested: _same(_LIVE),
    ev.JobCancelled: {state: S.CANCELLED for state in _LIVE},
    ev.JobStoring: {S.RUNNING: S.STORING},
    ev.JobCompleted: {S.STORING: S.COMPLETED},
    ev.JobFailed: {state: S.FAILED for state in _LIVE},
    ev.GpusReleased: _same(TERMINAL | {S.HALTED, S.QUEUED}),
    ev.CommandRejected: _same(frozenset(S)),
    ev.JobDeleted: _same(TERMINAL),
}


class IllegalTransition(ValueError):
    """An event that the transition table does not allow in the job's current state."""


def next_state(current: JobState | None, event_type: type[EventData]) -> JobState:
    """The state after applying an event of ``event_type`` in ``current``; raises if illegal."""
    row = TRANSITIONS.get(event_type)
    if row is None or current not in row:
        raise IllegalTransition(f"{event_type.type_name()} is not allowed in state {current}")
    return row[current]


def is_legal(current: JobState | None, event_type: type[EventData]) -> bool:
    row = TRANSITIONS.get(event_type)
    return row is not None and current in row
