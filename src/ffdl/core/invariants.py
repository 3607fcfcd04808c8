"""The invariants of architecture §5, checked over an event log as a pure streaming fold.

The tests and ``ffdl verify`` use this one checker. It reads events in log order (per job and per
node that is seq order; across them it is the order the log gives) and reports every violation
with the position it was found at. Jobs and nodes are both aggregates on the log, numbered and
owned alike, so each of them is held to the same rules:

* seq contiguous from 1 (a repeated seq with the same event id is a redelivered duplicate, which
  readers ignore; a repeated seq with another id is a conflict);
* every event legal in its aggregate's state (the job transition table, ``evolve_node``), so
  terminal job states absorb;
* no event from a deposed leader: fencing tokens never go backwards, per job and per node and,
  when the feeder says which partition an event is in, across the jobs and nodes of a partition.

and the GPUs are accounted for:

* no GPU held by two jobs at any instant;
* every allocation released exactly once, and no ended job left holding GPUs at the end;
* every GPU a job was given was offered by its node (see below).

Fencing. The scheduler is the one fenced role: its commands (allocations, preemptions, inventory
observations) carry the token of its term, and the events an owner decides from them carry it on.
A rejection carrying an old token is the fencing working, not a breach, so rejections are never
reported (their token still counts as proof that a leader with that token existed). Across
aggregates the check is per partition, because that is where the log has an order that means
something: one owner at a time appends a partition's events, jobs' and nodes' alike, in the order
it decided them, and it checks every fenced command against the leader's current token before it
decides, so an accepted token below one already applied in the partition means a deposed leader's
command was accepted. Across partitions there is no such order: events are merged by their
owners' clocks, and an owner's token check and its append are not one atomic step, so a global
check would report races that no owner could have prevented.

Jobs and nodes together. The same lack of a cross-partition order rules out the tempting
point-in-time checks. "No GPU allocated on a cordoned, lost or removed node" does not hold: the
scheduler places from its fold of the node's partition, which may not have reached the cordon yet,
and the merge by clocks cannot tell an allocation decided before the cordon was folded from one
decided after. "No GPU allocated on a node before it joined" does not hold either: the allocation
is caused by the join (the scheduler read it first), but the two owners' clocks may be skewed, so
the merge can put the allocation first. What is guaranteed is order-free: the scheduler places
only on nodes folded from node events, and those events were on the log before it read them, so
over a whole log every GPU a job is given lies within what its node offered at some time: an
index below the largest GPU count of the node's ``NodeJoined``/``NodeResized`` events, of a GPU
type one of them reported. That is checked at the end, for the nodes that joined in the log (a
log written before the inventory was on the log, or exported for jobs only, holds allocations on
nodes with no event, and says nothing about them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ffdl.core.aggregate import Aggregates, Applied, Skip, Skipped
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS, KINDS, NODES
from ffdl.core.nodes import NodeRecord
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyEvent
from ffdl.events.envelope import Event


class ViolationKind(StrEnum):
    SEQ_GAP = "seq-gap"
    SEQ_CONFLICT = "seq-conflict"
    ILLEGAL_TRANSITION = "illegal-transition"
    GPU_DOUBLE_HELD = "gpu-double-held"
    DOUBLE_RELEASE = "double-release"
    NOT_RELEASED = "not-released"
    STALE_FENCING_TOKEN = "stale-fencing-token"
    GPU_NOT_OFFERED = "gpu-not-offered"
    #: A record of the log that is no event: found by the log's reader (the checker sees events only).
    UNDECODABLE = "undecodable"


@dataclass(frozen=True, slots=True)
class Violation:
    """One finding: its kind, the job and the node it concerns (either or both), where, and why."""

    kind: ViolationKind
    job_id: str | None
    position: str
    detail: str
    node: str | None = None


@dataclass(frozen=True, slots=True)
class _Offer:
    """What a node's inventory ever offered: its largest GPU count, and every GPU type it reported."""

    gpus: int
    gpu_types: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Use:
    """The first allocation of one GPU (or GPU type) of a node: by which job, where."""

    job_id: str
    position: str


@dataclass(slots=True)
class InvariantChecker:
    """Feed events in log order with their position; read ``violations`` at any time."""

    aggregates: Aggregates = field(default_factory=lambda: Aggregates(KINDS))
    event_ids: dict[tuple[str, int], str] = field(default_factory=dict)  # (log key, seq) -> event id
    tokens: dict[str, int] = field(default_factory=dict)  # log key -> newest fencing token applied
    gpu_holders: dict[tuple[str, int], str] = field(default_factory=dict)
    partition_tokens: dict[int, int] = field(default_factory=dict)
    offers: dict[str, _Offer] = field(default_factory=dict)
    gpu_uses: dict[tuple[str, int], _Use] = field(default_factory=dict)
    gpu_type_uses: dict[tuple[str, str], _Use] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    duplicates: int = 0
    events: int = 0

    @property
    def jobs(self) -> dict[str, Job]:
        return self.aggregates.of(JOBS)

    @property
    def nodes(self) -> dict[str, NodeRecord]:
        return self.aggregates.of(NODES)

    def _report(self, kind: ViolationKind, event: AnyEvent, position: str, detail: str) -> None:
        ids = KINDS.of(event).ids(event)  # the job's id or the node's name
        self.violations.append(Violation(kind, ids.get("job_id"), position, detail, node=ids.get("node")))

    def feed(self, event: AnyEvent, position: str, *, partition: int | None = None) -> None:
        """Check one event; ``partition`` (when given) enables the fencing check across aggregates."""
        self.events += 1
        folded = self.aggregates.fold(event)
        if isinstance(folded, Skipped) and folded.why is not Skip.ILLEGAL:
            self._out_of_sequence(event, position, folded)
            return
        self._check_fencing(event, position, partition)
        if isinstance(folded, Skipped):
            self._report(ViolationKind.ILLEGAL_TRANSITION, event, position, folded.detail)
            return
        assert folded is not None  # every kind is registered
        self._track(folded, position)
        self.event_ids[(event.key, event.seq)] = str(event.event_id)
        token = event.fencing_token
        if token is not None:
            self.tokens[event.key] = max(self.tokens.get(event.key, token), token)
            if partition is not None:
                self.partition_tokens[partition] = max(self.partition_tokens.get(partition, token), token)

    def _out_of_sequence(self, event: AnyEvent, position: str, skipped: Skipped) -> None:
        """A seq already taken (by this very event: a redelivered duplicate; else a conflict), or a gap."""
        if skipped.why is Skip.GAP:
            self._report(ViolationKind.SEQ_GAP, event, position, skipped.detail)
            return
        seen = self.event_ids[(event.key, event.seq)]
        if seen == str(event.event_id):
            self.duplicates += 1
        else:
            detail = f"seq {event.seq} taken by event {seen}"
            self._report(ViolationKind.SEQ_CONFLICT, event, position, detail)

    def _check_fencing(self, event: AnyEvent, position: str, partition: int | None) -> None:
        token = event.fencing_token
        if token is None or isinstance(event.data, ev.CommandRejected | nd.NodeCommandRejected):
            return
        newest = self.tokens.get(event.key)
        if newest is not None and token < newest:
            self._report(
                ViolationKind.STALE_FENCING_TOKEN, event, position, f"fencing token {token} after {newest}"
            )
            return
        in_partition = self.partition_tokens.get(partition) if partition is not None else None
        if in_partition is not None and token < in_partition:
            detail = f"fencing token {token} after token {in_partition} was applied in partition {partition}"
            self._report(ViolationKind.STALE_FENCING_TOKEN, event, position, detail)

    def _track(self, applied: Applied[Any, Any], position: str) -> None:
        """What the GPUs' accounting needs from an applied event: a job's allocations and releases,
        a node's offers."""
        job = applied.of(JOBS)
        if job is not None:
            self._track_gpus(job.before, job.event, position)
        node = applied.of(NODES)
        if node is not None:
            match node.event.data:
                case nd.NodeJoined(spec=spec) | nd.NodeResized(spec=spec):
                    offer = self.offers.get(node.event.node, _Offer(0, frozenset()))
                    self.offers[node.event.node] = _Offer(
                        max(offer.gpus, spec.gpus), offer.gpu_types | {spec.gpu_type}
                    )
                case _:
                    pass

    def _track_gpus(self, before: Job | None, event: Event, position: str) -> None:
        match event.data:
            case ev.GpusAllocated(placement=placement):
                for slot in sorted(placement.gpu_slots()):
                    holder = self.gpu_holders.get(slot)
                    if holder is not None and holder != event.job_id:
                        detail = f"GPU {slot[1]} on {slot[0]} already held by job {holder}"
                        self._report(ViolationKind.GPU_DOUBLE_HELD, event, position, detail)
                    self.gpu_holders[slot] = event.job_id
                    self.gpu_uses.setdefault(slot, _Use(event.job_id, position))
                for learner in placement.learners:
                    if learner.gpu_type is not None and learner.gpus:
                        self.gpu_type_uses.setdefault(
                            (learner.node, learner.gpu_type), _Use(event.job_id, position)
                        )
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

    def _not_offered(self) -> list[Violation]:
        """GPUs given to jobs beyond what their node ever offered, for the nodes that joined in the log."""
        beyond: dict[tuple[_Use, str], list[int]] = {}
        for (node, index), use in sorted(self.gpu_uses.items()):
            offer = self.offers.get(node)
            if offer is not None and index >= offer.gpus:
                beyond.setdefault((use, node), []).append(index)
        found = [
            Violation(
                ViolationKind.GPU_NOT_OFFERED,
                use.job_id,
                use.position,
                f"GPU(s) {', '.join(map(str, indices))} on {node}, which never offered more than "
                f"{self.offers[node].gpus}",
                node=node,
            )
            for (use, node), indices in beyond.items()
        ]
        for (node, gpu_type), use in sorted(self.gpu_type_uses.items()):
            offer = self.offers.get(node)
            if offer is not None and gpu_type not in offer.gpu_types:
                offered = ", ".join(sorted(offer.gpu_types))
                detail = f"{gpu_type} GPUs on {node}, which only ever offered {offered}"
                found.append(
                    Violation(ViolationKind.GPU_NOT_OFFERED, use.job_id, use.position, detail, node=node)
                )
        return found

    def finish(self) -> list[Violation]:
        """All violations, including what only the whole log shows: GPUs never offered, and ended
        jobs still holding GPUs at the end of the log."""
        leaks = [
            Violation(ViolationKind.NOT_RELEASED, job.job_id, "end", f"{job.state} but still holds GPUs")
            for job in self.jobs.values()
            if job.placement is not None and job.state.terminal
        ]
        return [*self.violations, *self._not_offered(), *leaks]


def check(events: Iterable[tuple[AnyEvent, str]]) -> list[Violation]:
    """Every violation in a log given as (event, position) pairs in log order."""
    checker = InvariantChecker()
    for event, position in events:
        checker.feed(event, position)
    return checker.finish()
