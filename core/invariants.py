"""The invariants of DESIGN §5, checked over an event log as a pure streaming fold.

The tests and ``ffdl verify`` use this one checker. It reads events in log order (per job that is
seq order; across jobs it is the order the log gives) and reports every violation with the
position it was found at:

* seq of each job contiguous from 1 (a repeated seq with the same event id is a redelivered
  duplicate, which readers ignore; a repeated seq with another id is a conflict);
* every event legal in its job's state (the transition table), so terminal states absorb;
* no GPU held by two jobs at any instant;
* every allocation released exactly once, and no ended job left holding GPUs at the end;
* no event from a deposed leader: fencing tokens never go backwards, per job and, when the feeder
  says which partition an event is in, across the jobs of a partition.

Fencing. The scheduler is the one fenced role: its commands carry the token of its term, and the
events a job's owner decides from them carry it on. A ``CommandRejected`` carrying an old token is
the fencing working, not a breach, so rejections are never reported (their token still counts as
proof that a leader with that token existed). Across jobs the check is per partition, because that
is where the log has an order that means something: one owner at a time appends a partition's
events in the order it decided them, and it checks a fenced command against the leader's current
token before it decides, so an accepted token below one already applied in the partition means a
deposed leader's command was accepted. Across partitions there is no such order: events are merged
by their owners' clocks, and an owner's token check and its append are not one atomic step, so a
global check would report races that no owner could have prevented.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from ffdl.core.job import EvolveError, Job, evolve
from ffdl.events import types as ev
from ffdl.events.envelope import Event


class ViolationKind(StrEnum):
    SEQ_GAP = "seq-gap"
    SEQ_CONFLICT = "seq-conflict"
    ILLEGAL_TRANSITION = "illegal-transition"
    GPU_DOUBLE_HELD = "gpu-double-held"
    DOUBLE_RELEASE = "double-release"
    NOT_RELEASED = "not-released"
    STALE_FENCING_TOKEN = "stale-fencing-token"


@dataclass(frozen=True, slots=True)
class Violation:
    kind: ViolationKind
    job_id: str
    position: str
    detail: str


@dataclass(slots=True)
class InvariantChecker:
    """Feed events in log order with their position; read ``violations`` at any time."""

    jobs: dict[str, Job] = field(default_factory=dict)
    event_ids: dict[tuple[str, int], str] = field(default_factory=dict)
    gpu_holders: dict[tuple[str, int], str] = field(default_factory=dict)
    partition_tokens: dict[int, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    duplicates: int = 0
    events: int = 0

    def _report(self, kind: ViolationKind, event: Event, position: str, detail: str) -> None:
        self.violations.append(Violation(kind, event.job_id, position, detail))

    def feed(self, event: Event, position: str, *, partition: int | None = None) -> None:
        """Check one event; ``partition`` (when given) enables the fencing check across jobs."""
        self.events += 1
        key = (event.job_id, event.seq)
        seen = self.event_ids.get(key)
        if seen is not None:
            if seen == str(event.event_id):
                self.duplicates += 1
            else:
                self._report(
                    ViolationKind.SEQ_CONFLICT, event, position, f"seq {event.seq} taken by event {seen}"
                )
            return
        job = self.jobs.get(event.job_id)
        expected = job.seq + 1 if job else 1
        if event.seq != expected:
            self._report(ViolationKind.SEQ_GAP, event, position, f"expected seq {expected}, got {event.seq}")
            return
        self._check_fencing(job, event, position, partition)
        try:
            after = evolve(job, event)
        except EvolveError as exc:
            self._report(ViolationKind.ILLEGAL_TRANSITION, event, position, str(exc))
            return
        self.event_ids[key] = str(event.event_id)
        self.jobs[event.job_id] = after
        if partition is not None and event.fencing_token is not None:
            newest = self.partition_tokens.get(partition, event.fencing_token)
            self.partition_tokens[partition] = max(newest, event.fencing_token)
        self._track_gpus(job, event, position)

    def _check_fencing(self, job: Job | None, event: Event, position: str, partition: int | None) -> None:
        token = event.fencing_token
        if token is None or isinstance(event.data, ev.CommandRejected):
            return
        if job is not None and job.fencing_token is not None and token < job.fencing_token:
            detail = f"fencing token {token} after {job.fencing_token}"
            self._report(ViolationKind.STALE_FENCING_TOKEN, event, position, detail)
            return
        newest = self.partition_tokens.get(partition) if partition is not None else None
        if newest is not None and token < newest:
            detail = f"fencing token {token} after token {newest} was applied in partition {partition}"
            self._report(ViolationKind.STALE_FENCING_TOKEN, event, position, detail)

    def _track_gpus(self, before: Job | None, event: Event, position: str) -> None:
        match event.data:
            case ev.GpusAllocated(placement=placement):
                for slot in sorted(placement.gpu_slots()):
                    holder = self.gpu_holders.get(slot)
                    if holder is not None and holder != event.job_id:
                        detail = f"GPU {slot[1]} on {slot[0]} already held by job {holder}"
                        self._report(ViolationKind.GPU_DOUBLE_HELD, event, position, detail)
                    self.gpu_holders[slot] = event.job_id
            case ev.GpusReleased(placement=placement):
                if before is None or before.placement is None:
                    self._report(
                        ViolationKind.DOUBLE_RELEASE, event, position, "released GPUs it did not hold"
                    )
                    return
                for slot in placement.gpu_slots():
                    if self.gpu_holders.get(slot) == event.job_id:
                        del self.gpu_holders[slot]
            case _:
                pass

    def finish(self) -> list[Violation]:
        """All violations, including ended jobs that still hold GPUs at the end of the log."""
        leaks = [
            Violation(ViolationKind.NOT_RELEASED, job.job_id, "end", f"{job.state} but still holds GPUs")
            for job in self.jobs.values()
            if job.placement is not None and job.state.terminal
        ]
        return [*self.violations, *leaks]


def check(events: Iterable[tuple[Event, str]]) -> list[Violation]:
    """Every violation in a log given as (event, position) pairs in log order."""
    checker = InvariantChecker()
    for event, position in events:
        checker.feed(event, position)
    return checker.finish()
