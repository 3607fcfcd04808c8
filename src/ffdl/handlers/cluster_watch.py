"""The job owner's read-only view of the whole cluster, caught up with the events topic when it is needed.

An owner folds the jobs and nodes of its own partitions; to check a placement it needs every node and
every GPU held (:mod:`ffdl.core.cluster_view`). :meth:`ClusterWatch.catch_up` reads every partition of
the events topic from where it stopped up to the ends the log has now, skipping, by the record's
``ce_type`` header, every record the view does not need before decoding it. The owner catches up once
per batch of commands that holds an allocation, before deciding it: whatever the scheduler saw on the
log when it chose the placement was appended before the owner asked for the ends, so the view has it.
What the owner decides itself is applied at once (:meth:`ClusterWatch.apply`), so two allocations of
one batch are checked against each other too; should their append fail, :meth:`ClusterWatch.reset`
forgets everything and the next catch-up reads the log again.

What the view cannot see is an allocation another owner decides at the same moment: both may check
before either appends. The owners only decide allocations from the scheduler leader (its principal,
its current fencing token), which never promises a GPU twice; two such allocations can only meet
across a change of leader (an allocation of the deposed leader, checked against the election just
before the new leader was elected, appended after the new leader read the log). ``docs/security.md``
describes that window.
"""

from __future__ import annotations

import structlog

from ffdl.core.cluster_view import VIEW_EVENT_TYPES, ClusterView
from ffdl.events.codec import AnyEvent
from ffdl.handlers.ports import Bus
from ffdl.handlers.runtime import decode_event, may_hold

log = structlog.get_logger(__name__)


class ClusterWatch:
    """A :class:`ClusterView` of every partition of ``events_topic``, caught up on demand."""

    def __init__(self, bus: Bus, events_topic: str) -> None:
        self._bus = bus
        self._topic = events_topic
        self.view = ClusterView()
        self._next: dict[int, int] = {}  # partition -> the offset to read next

    async def catch_up(self) -> None:
        """Fold what every partition has gained since the last catch-up, up to its end now."""
        read = 0
        for partition, end in sorted((await self._bus.end_offsets(self._topic)).items()):
            start = self._next.get(partition, 0)
            if end <= start:
                continue
            async for record in self._bus.read(self._topic, partition, start, end):
                if may_hold(record, VIEW_EVENT_TYPES):
                    event = decode_event(record)
                    if event is not None:
                        self.view.apply(event)
                        read += 1
            self._next[partition] = end
        if read:
            log.debug("cluster view caught up", events=read, nodes=len(self.view.nodes))

    def apply(self, event: AnyEvent) -> None:
        """Fold an event this owner just decided (read back from the log later, it changes nothing)."""
        self.view.apply(event, ahead=True)

    def reset(self) -> None:
        """Forget everything (events this owner applied may never have reached the log)."""
        self.view = ClusterView()
        self._next = {}
