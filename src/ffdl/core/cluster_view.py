"""What a job's owner knows of the whole cluster: the nodes, and which job holds each GPU.

An owner holds the jobs and nodes of its own partitions only, but a placement is about nodes and
GPUs anywhere: before an ``AllocateGpus`` becomes ``GpusAllocated`` the owner checks it against a
read-only view folded from every partition of the events topic (:meth:`ClusterView.refusal`, the
``outside`` check of :func:`ffdl.core.authorization.decide_as`). The placement must name nodes in
the inventory and present, open to new learners (not cordoned, not draining), offering GPUs of the
type it names, GPU indices the node has, each once, and none held by another job. So the owner never
double-books, whoever sends.

The view folds only what it needs (readers filter on the record's type before decoding, see
:data:`VIEW_EVENT_TYPES`): every node event (through :func:`~ffdl.core.aggregate.fold_step`, as every
reader folds nodes) and the job events that take and give back GPUs. A job's GPU events are applied
in seq order and each once: one whose seq is not above the last applied one of its job is a repeat
(a redelivery, or an event the owner applied *ahead* of the log, when it decided it, and reads back
from the log later). Once the log itself shows a job's latest GPU event to be a release, nothing of
the job can come back, and the view forgets it: it keeps only jobs that hold GPUs or may.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from ffdl.core.aggregate import Kinds, Skipped, fold_step
from ffdl.core.decider import JOBS, allocates
from ffdl.core.job import Job
from ffdl.core.nodes import NODES, NodeRecord, NodeStatus
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import AnyEvent
from ffdl.events.envelope import Event, NodeEvent
from ffdl.events.model import Placement
from ffdl.events.nodes import NODE_EVENT_TYPES

#: The job events that change who holds a GPU.
GPU_EVENT_TYPES = frozenset({ev.GpusAllocated.type_name(), ev.GpusReleased.type_name()})
#: The event types the view folds; a reader may skip any other record without decoding it.
VIEW_EVENT_TYPES = frozenset(NODE_EVENT_TYPES) | GPU_EVENT_TYPES

Slot = tuple[str, int]  # (node, GPU index)


#: The kinds the view folds: nodes, and jobs for the GPUs they hold.
_KINDS = Kinds(JOBS, NODES)


@dataclass
class ClusterView:
    """The nodes and the GPUs held, as folded so far."""

    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    holders: dict[Slot, str] = field(default_factory=dict)  # who holds each GPU
    _held: dict[str, frozenset[Slot]] = field(default_factory=dict)  # what each job holds
    _seq: dict[str, int] = field(default_factory=dict)  # each job's last GPU event applied

    def copy(self) -> ClusterView:
        return ClusterView(dict(self.nodes), dict(self.holders), dict(self._held), dict(self._seq))

    def apply(self, event: AnyEvent, *, ahead: bool = False) -> None:
        """Fold one event of any partition, read from the log (``ahead``: decided by this owner and not
        read back yet); one the view does not need changes nothing."""
        kind = _KINDS.find(event)
        if kind is NODES:
            node = cast(NodeEvent, event)
            after = fold_step(NODES, self.nodes.get(node.node), node)
            if not isinstance(after, Skipped):
                self.nodes[node.node] = after
            return
        if kind is not JOBS:
            return  # an aggregate of another kind: it holds no GPUs
        job_id = JOBS.identity(cast(Event, event))
        match event.data:
            case ev.GpusAllocated(placement=placement) if self._is_new(job_id, event.seq):
                self._hold(job_id, placement.gpu_slots())
            case ev.GpusReleased():
                if self._is_new(job_id, event.seq):
                    for slot in self._held.pop(job_id, frozenset()):
                        if self.holders.get(slot) == job_id:
                            del self.holders[slot]
                if not ahead and self._seq.get(job_id) == event.seq:
                    del self._seq[job_id]  # the log is past all the view had of the job
            case _:
                pass

    def _is_new(self, job_id: str, seq: int) -> bool:
        if seq <= self._seq.get(job_id, 0):
            return False
        self._seq[job_id] = seq
        return True

    def _hold(self, job_id: str, slots: frozenset[Slot]) -> None:
        self._held[job_id] = self._held.get(job_id, frozenset()) | slots
        for slot in slots:
            self.holders.setdefault(slot, job_id)  # a GPU the log shows held twice stays its first holder's

    def placement_problem(self, job_id: str, placement: Placement) -> str:
        """Why ``placement`` cannot be given to ``job_id`` now (empty when it can)."""
        placed: set[Slot] = set()
        for learner in placement.learners:
            node = self.nodes.get(learner.node)
            if node is None:
                return f"node {learner.node} is not in the inventory"
            if node.status is not NodeStatus.READY:
                return f"node {learner.node} is {node.status}: nothing new is placed on it"
            if learner.gpu_type is not None and learner.gpus and learner.gpu_type != node.spec.gpu_type:
                return f"node {learner.node} offers {node.spec.gpu_type} GPUs, not {learner.gpu_type}"
            for gpu in learner.gpus:
                slot = (learner.node, gpu)
                if gpu >= node.spec.gpus:
                    return f"node {learner.node} has no GPU {gpu} (it has {node.spec.gpus})"
                if slot in placed:
                    return f"GPU {gpu} of node {learner.node} is placed twice"
                holder = self.holders.get(slot)
                if holder is not None and holder != job_id:
                    return f"GPU {gpu} of node {learner.node} is held by another job"
                placed.add(slot)
        return ""

    def refusal(self, state: object, command: object) -> str:
        """The owner's check of a command against the cluster: an allocation the job would take now
        must fit the nodes and the free GPUs (empty for anything else)."""
        data = getattr(command, "data", None)  # an allocation is a job's command, whatever its envelope
        if isinstance(data, cmd.AllocateGpus) and isinstance(state, Job) and allocates(state):
            return self.placement_problem(state.job_id, data.placement)
        return ""
