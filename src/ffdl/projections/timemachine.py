"""The time machine: the whole cluster (nodes, who holds which GPU, the queues, every job's state)
as it was at any moment, rebuilt from the log.

It folds every event up to the moment with the one fold step every reader takes
(:class:`~ffdl.core.aggregate.Aggregates`, which runs :func:`~ffdl.core.aggregate.fold_step`), and
renders jobs and nodes with the documents the projections store, so the picture at the log's end
is what the live API shows. Nothing is sampled: a moment between two events shows the state after
the earlier one, and the answer names the events either side so a reader can step event by event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from operator import attrgetter

from ffdl.core.aggregate import Aggregates, Skipped
from ffdl.core.cluster import Charges
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS, KINDS, NODES
from ffdl.core.nodes import NodePresence, NodeRecord, NodeStatus
from ffdl.core.tenancy import TenancyPolicy
from ffdl.events.envelope import NODE_KEY_PREFIX
from ffdl.projections.documents import JsonObject, charges_on, counts_as_gpus, job_document, node_document
from ffdl.projections.store import KeptEntry, KeptLog, KeptLogChanged, LoggedEvent, instant_of


def span(events: Sequence[LoggedEvent]) -> JsonObject:
    """The first and last event times of the log (None for an empty one)."""
    if not events:
        return {"start": None, "end": None, "events": 0}
    times = [logged.event.occurred_at for logged in events]
    return {"start": min(times).isoformat(), "end": max(times).isoformat(), "events": len(events)}


def fold_at(
    events: Iterable[LoggedEvent], at: datetime | None, on: tuple[Aggregates, int] | None = None
) -> tuple[Aggregates, int]:
    """Every aggregate folded with the events that occurred at or before ``at`` (None: all), and how
    many events that was; ``on``: aggregates folded already (changed in place), with their count,
    to fold the events on from."""
    folded, count = on or (Aggregates(KINDS), 0)
    for logged in events:
        if at is not None and logged.event.occurred_at > at:
            continue  # partitions interleave by time only roughly: keep reading, skip later ones
        folded.fold(logged.event)
        count += 1
    return folded, count


def _queued_at(job: Job) -> str:
    return next((e.at.isoformat() for e in reversed(job.history) if str(e.state) == "QUEUED"), "")


#: the most copies of the folded aggregates :class:`ClusterAtEnd` keeps along the log: a copy holds
#: a reference to every aggregate of its moment (about 35 bytes each), so their number is bounded,
#: and their spacing doubles instead
SNAPSHOTS_KEPT = 32


class ClusterAtEnd:
    """The aggregates folded with every event of a kept log (:class:`KeptLog`), and the utilisation over the
    log's span, kept between reads of the cluster as it is now: the events the log adds after those
    folded are folded on, and only an event that sorts in among them (a partition behind the
    others) means folding them all again. The live cluster page reads the present after every
    change; folding the whole log twice each time cost seconds on a long one.

    Along the way it keeps copies of what it had folded, every ``snapshot_every`` events (at most
    :data:`SNAPSHOTS_KEPT` of them, the spacing doubled when there would be more), so that a past
    moment is folded on from the last copy before it (:meth:`folded_at`) instead of from the log's
    start: every new moment a tenant asked for cost a fold of the whole log."""

    def __init__(self, snapshot_every: int = 2_000) -> None:
        if snapshot_every < 1:
            raise ValueError(f"a copy every {snapshot_every} events: it takes at least one")
        self._first_spacing = snapshot_every
        self._start_over()

    def _start_over(self) -> None:
        self._folded = Aggregates(KINDS)
        self._count = 0
        self._generation = 0  # the kept log's (KeptLog.generation) whose events are folded
        self._last: KeptEntry | None = None
        self._held: dict[str, tuple[str, int]] = {}  # job -> (its tenant, the GPUs it holds)
        self._present: dict[str, int] = {}  # node -> its GPUs, while present
        self._points: list[JsonObject] = []
        self._spacing = self._first_spacing
        self._snapshots: list[tuple[int, Aggregates]] = []  # (events folded, a copy of what they made)

    def folded(self, kept: KeptLog, entries: Sequence[KeptEntry]) -> tuple[Aggregates, int]:
        """The aggregates folded with every event of ``entries`` (what ``kept``'s
        :meth:`~KeptLog.located` gave, read once for all a picture says), and how many that is.
        Should the file have been replaced (:class:`KeptLogChanged`), what was folded is dropped;
        should an event fail to decode, what was folded before it is kept (the next read folds on
        from it, instead of folding the whole log again, under the fold lock, every request)."""
        count = self._count
        if not (
            kept.generation == self._generation
            and count <= len(entries)
            and (count == 0 or entries[count - 1] == self._last)
        ):
            self._start_over()  # an event sorted in among those folded, or another file: all again
            self._generation = kept.generation
        try:
            for logged in kept.events(entries[self._count :]):
                self._fold(logged)
                self._count += 1
                self._last = entries[self._count - 1]
                if self._count % self._spacing == 0:
                    self._keep_snapshot(self._count)
        except KeptLogChanged:
            self._start_over()
            raise
        return self._folded, self._count

    def folded_at(self, kept: KeptLog, entries: Sequence[KeptEntry], at: datetime) -> tuple[Aggregates, int]:
        """What :func:`fold_at` gives for ``at`` over the events of ``entries`` (as for
        :meth:`folded`): the last copy kept before the first event after ``at``, with the events
        from there on that occurred at or before ``at`` folded on (only those are decoded)."""
        self.folded(kept, entries)
        until = instant_of(at)
        first_after = next(
            (index for index, entry in enumerate(entries) if entry.instant > until), len(entries)
        )
        start, copy = next(
            ((count, copy) for count, copy in reversed(self._snapshots) if count <= first_after), (0, None)
        )
        on = (copy.copy(), start) if copy is not None else None
        return fold_at(kept.events(entry for entry in entries[start:] if entry.instant <= until), None, on)

    def _keep_snapshot(self, count: int) -> None:
        self._snapshots.append((count, self._folded.copy()))
        if len(self._snapshots) > SNAPSHOTS_KEPT:
            self._snapshots = self._snapshots[1::2]  # those at every other spacing: twice as far apart
            self._spacing *= 2

    def utilisation(self) -> list[JsonObject]:
        """The GPUs present and held per tenant after each event that changed either, in time
        order, as of the last :meth:`folded`: the cluster's utilisation over the log's span."""
        return list(self._points)

    def _fold(self, logged: LoggedEvent) -> None:
        applied = self._folded.fold(logged.event)
        if applied is None or isinstance(applied, Skipped):
            return
        job = applied.of(JOBS)
        if job is not None:
            placement = job.after.placement
            gpus = sum(len(learner.gpus) for learner in placement.learners) if placement else 0
            if gpus == self._held.get(job.after.job_id, ("", 0))[1]:
                return
            self._held[job.after.job_id] = (job.after.tenant, gpus)
        node = applied.of(NODES)
        if node is not None:
            gpus = node.after.spec.gpus if node.after.presence is NodePresence.PRESENT else 0
            if gpus == self._present.get(node.after.name, 0):
                return
            self._present[node.after.name] = gpus
        by_tenant: dict[str, int] = {}
        for tenant, gpus in self._held.values():
            if gpus:
                by_tenant[tenant] = by_tenant.get(tenant, 0) + gpus
        self._points.append(
            {"at": _when(logged).isoformat(), "gpus": sum(self._present.values()), "held": by_tenant}
        )


def cluster_at(
    events: Sequence[LoggedEvent], at: datetime | None, folded: tuple[Aggregates, int] | None = None
) -> JsonObject:
    """The cluster at ``at``: its present nodes with the job holding each GPU, the queued jobs per
    tenant in the scheduler's order, every job's state, and the events either side of the moment.
    ``folded``: the aggregates already folded at ``at``, with how many events (:class:`ClusterAtEnd`)."""
    before = [logged for logged in events if at is None or logged.event.occurred_at <= at]
    after = [logged for logged in events if at is not None and logged.event.occurred_at > at]
    return _picture(
        folded or fold_at(events, at),
        at,
        span(events),
        max(before, key=_when) if before else None,
        min(after, key=_when) if after else None,
    )


def kept_cluster_at(
    kept: KeptLog, entries: Sequence[KeptEntry], at: datetime | None, folded: tuple[Aggregates, int]
) -> JsonObject:
    """:func:`cluster_at` over the ``entries`` of ``kept`` (``folded`` at ``at`` already): the span
    and the events either side of the moment are found by the entries' instants, and only those
    two events are decoded."""
    if not entries:
        return _picture(folded, at, span([]), None, None)
    instant = attrgetter("instant")  # the first of equals, as min and max of the events' times give
    first, last = min(entries, key=instant), max(entries, key=instant)
    previous: KeptEntry | None = last
    following: KeptEntry | None = None
    if at is not None:
        until = instant_of(at)
        previous = max((entry for entry in entries if entry.instant <= until), key=instant, default=None)
        following = min((entry for entry in entries if entry.instant > until), key=instant, default=None)
    either_side = kept.events(entry for entry in (previous, following) if entry is not None)
    return _picture(
        folded,
        at,
        # stored as each event's occurred_at.isoformat(): what span() words
        {"start": first.occurred_at, "end": last.occurred_at, "events": len(entries)},
        next(either_side) if previous is not None else None,
        next(either_side) if following is not None else None,
    )


def kept_picture(
    kept: KeptLog, at_end: ClusterAtEnd, at: datetime | None
) -> tuple[JsonObject, list[JsonObject]]:
    """The time machine's read of a kept log: the cluster at ``at`` (None: now) and the utilisation
    over the log, read once so that the two agree. A file replaced since the last read is read
    afresh (:meth:`KeptLog.located`); one replaced between the read and the decoding
    (:class:`KeptLogChanged`) is read afresh once more."""
    try:
        return _kept_picture(kept, at_end, at)
    except KeptLogChanged:
        kept.forget()
        return _kept_picture(kept, at_end, at)


def _kept_picture(
    kept: KeptLog, at_end: ClusterAtEnd, at: datetime | None
) -> tuple[JsonObject, list[JsonObject]]:
    entries = kept.located()
    folded = at_end.folded(kept, entries) if at is None else at_end.folded_at(kept, entries, at)
    return kept_cluster_at(kept, entries, at, folded), at_end.utilisation()


def _picture(
    folded: tuple[Aggregates, int],
    at: datetime | None,
    extent: JsonObject,
    previous: LoggedEvent | None,
    following: LoggedEvent | None,
) -> JsonObject:
    aggregates, applied = folded
    jobs: dict[str, Job] = aggregates.of(JOBS)
    nodes: dict[str, NodeRecord] = aggregates.of(NODES)
    holders: dict[str, dict[str, str]] = {}
    for job in jobs.values():
        if job.placement is None:
            continue
        for learner in job.placement.learners:
            for gpu in learner.gpus:
                holders.setdefault(learner.node, {})[str(gpu)] = job.job_id
    node_rows: list[JsonObject] = []
    for name in sorted(nodes):
        document = node_document(nodes[name])
        document["allocated"] = holders.get(name, {})
        document["present"] = NodeStatus(document["status"]).present
        node_rows.append(document)
    queued = sorted(
        (job for job in jobs.values() if str(job.state) == "QUEUED"),
        key=lambda job: (-job.spec.priority, _queued_at(job), job.job_id),
    )
    queue = [
        {
            "job_id": job.job_id,
            "tenant": job.tenant,
            "position": position,
            "priority": job.spec.priority,
            "learners": job.spec.learners,
            "gpus": job.spec.gpus,
            "reason": job.reason,
        }
        for position, job in enumerate(queued, start=1)
    ]
    charges = charges_on(node_rows)
    job_rows = [_job_row(job, charges) for job in sorted(jobs.values(), key=lambda job: job.submitted_at)]
    return {
        "at": at.isoformat() if at else None,
        "span": extent,
        "applied": applied,
        "previous_event": _event_ref(previous) if previous is not None else None,
        "next_event": _event_ref(following) if following is not None else None,
        "nodes": node_rows,
        "queue": queue,
        "jobs": job_rows,
    }


def tenant_rows(picture: JsonObject, policy: TenancyPolicy) -> list[JsonObject]:
    """Per tenant with jobs in the picture: GPUs held, and what they count as (GPU-equivalents, as the
    scheduler counts quotas, fair share and reclaiming: a job asking much CPU or memory per GPU
    counts more than its GPUs, a job without GPUs counts what it takes from gangs that need them),
    jobs queued, its quota, what it borrows beyond its guarantee (in GPU-equivalents too, and of
    the jobs not on their way out, as the scheduler counts it: a tenant shown borrowing nothing
    while the scheduler reclaimed from it once made the reason look false),
    and its fair share (the present GPUs split by weight among the tenants that hold or want GPUs)."""
    held: dict[str, int] = {}
    counted: dict[str, float] = {}
    kept: dict[str, float] = {}  # of what it holds, what it keeps (as the scheduler: not releasing)
    queued: dict[str, int] = {}
    for job in picture["jobs"]:
        tenant = job["tenant"]
        held[tenant] = held.get(tenant, 0) + job["gpus_held"]
        counted[tenant] = counted.get(tenant, 0.0) + job["counts_as_gpus"]
        kept[tenant] = kept.get(tenant, 0.0) + (0.0 if job["releasing"] else job["counts_as_gpus"])
        if job["state"] == "QUEUED":
            queued[tenant] = queued.get(tenant, 0) + 1
    active = sorted(t for t in held if held[t] or counted[t] or queued.get(t))
    total = sum(int(node["gpus"]) for node in picture["nodes"] if node["present"])
    weights = sum(policy.quota(t).weight for t in active) or 1.0
    rows = []
    for tenant in sorted(held):
        quota = policy.quota(tenant)
        rows.append(
            {
                "tenant": tenant,
                "gpus_held": held[tenant],
                "counts_as_gpus": round(counted[tenant], 3),
                "queued": queued.get(tenant, 0),
                "guaranteed_gpus": quota.guaranteed_gpus,
                "borrowing_limit_gpus": quota.borrowing_limit_gpus,
                "weight": quota.weight,
                "borrowed": round(max(0.0, kept[tenant] - quota.guaranteed_gpus), 3),
                "fair_share_gpus": round(total * quota.weight / weights, 2) if tenant in active else 0.0,
            }
        )
    return rows


def _when(logged: LoggedEvent) -> datetime:
    return logged.event.occurred_at


def _event_ref(logged: LoggedEvent) -> JsonObject:
    event = logged.event
    return {
        "at": event.occurred_at.isoformat(),
        "type": event.type,
        "key": event.key,
        "seq": event.seq,
        "position": logged.position,
    }


def _job_row(job: Job, charges: Charges) -> JsonObject:
    """A job's row at the moment: its reason is that of the state it is in (the last history entry),
    not the job's ``reason``, which keeps the scheduler's last word (a COMPLETED job's "needs 2
    GPU(s)"); what it holds, in GPUs and in the GPU-equivalents its tenant is charged."""
    document = job_document(job)
    held = sum(len(learner["gpus"]) for learner in document["placement"] or [])
    return {
        "job_id": job.job_id,
        "tenant": job.tenant,
        "name": document["name"],
        "state": document["state"],
        "attempt": document["attempt"],
        "reason": job.history[-1].reason if job.history else document["reason"],
        "gpus_held": held,
        "counts_as_gpus": counts_as_gpus(document, charges),
        "releasing": job.releasing,
        "learners": document["spec"]["learners"],
        "gpus": document["spec"]["gpus"],
    }


def hide_others(picture: JsonObject, may_see: Callable[[str], bool]) -> JsonObject:
    """The picture as a tenant may see it: other tenants' jobs left out, their GPUs held by 'other',
    their events named by time and type only."""
    visible = {row["job_id"] for row in picture["jobs"] if may_see(row["tenant"])}
    nodes = [
        {
            **node,
            "allocated": {gpu: job if job in visible else "other" for gpu, job in node["allocated"].items()},
        }
        for node in picture["nodes"]
    ]

    def seen(ref: JsonObject | None) -> JsonObject | None:
        if ref is None or ref["key"].startswith(NODE_KEY_PREFIX) or ref["key"] in visible:
            return ref
        return {**ref, "key": "other", "seq": None, "position": None}

    return {
        **picture,
        "nodes": nodes,
        "queue": [row for row in picture["queue"] if row["job_id"] in visible],
        "jobs": [row for row in picture["jobs"] if row["job_id"] in visible],
        "previous_event": seen(picture["previous_event"]),
        "next_event": seen(picture["next_event"]),
    }
