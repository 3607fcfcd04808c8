"""Prometheus metrics, read at scrape time from the projections and the roles' counters.

Jobs by state and tenant, queue length and the longest and mean wait per tenant, nodes by status
(folded from the node events), GPUs allocated and total (of the present nodes), the projector's
lag behind the log per partition, dead letters by reason, duplicate or conflicting events
ignored, and (observed by the projector as it applies events) the event-to-projection latency
histogram.

Dead letters are counted from the dead-letter topic itself by the
:class:`~ffdl.handlers.deadletters.DeadLetterTally` that the API role's process follows, so one
scrape sees the whole platform's, whichever process parked them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ffdl.core.nodes import NodeStatus
from ffdl.handlers.messaging import utcnow

if TYPE_CHECKING:
    from ffdl.wiring.platform import Platform

log = structlog.get_logger(__name__)


class PlatformCollector(Collector):
    """The platform's metrics; ``wall_clock`` is what the queued jobs' waits are measured against."""

    def __init__(self, platform: Platform, *, wall_clock: Callable[[], datetime] = utcnow) -> None:
        self._platform = platform
        self._wall_clock = wall_clock
        self.log_ends: dict[int, int] = {}

    def collect(self) -> Iterator[Metric]:
        platform = self._platform
        projection = platform.projection
        jobs = GaugeMetricFamily("ffdl_jobs", "Jobs by state and tenant", labels=["tenant", "state"])
        for (tenant, state), count in sorted(projection.counts().items()):
            jobs.add_metric([tenant, state], count)
        yield jobs
        nodes = projection.nodes()
        by_status = Counter(node["status"] for node in nodes)
        statuses = GaugeMetricFamily("ffdl_nodes", "Nodes of the inventory by status", labels=["status"])
        for status in NodeStatus:
            statuses.add_metric([status.value], by_status[status.value])
        yield statuses
        allocated = sum(len(learner["gpus"]) for job in projection.holdings() for learner in job["placement"])
        gpus = GaugeMetricFamily("ffdl_gpus", "GPUs of the inventory", labels=["status"])
        gpus.add_metric(["allocated"], allocated)
        gpus.add_metric(["total"], sum(node["gpus"] for node in nodes if NodeStatus(node["status"]).present))
        yield gpus
        yield from self._queues()
        lag = GaugeMetricFamily(
            "ffdl_projection_lag_events", "Events on the log not yet projected", labels=["partition"]
        )
        applied = projection.positions()
        for partition, end in sorted(self.log_ends.items()):
            lag.add_metric([str(partition)], max(0, end - applied.get(partition, 0)))
        yield lag
        dead = CounterMetricFamily(
            "ffdl_dead_letters", "Records on the dead-letter topic, by class of reason", labels=["reason"]
        )
        for reason, count in sorted(platform.dead_letters.counts.items()):
            dead.add_metric([reason], count)
        yield dead
        ignored = CounterMetricFamily(
            "ffdl_ignored_events", "Duplicate or conflicting events readers ignored"
        )
        ignored.add_metric([], projection.ignored_events())
        yield ignored

    def _queues(self) -> Iterator[Metric]:
        now = self._wall_clock()
        waits: dict[str, list[float]] = {}
        for job in self._platform.projection.queue():
            queued_at = next(
                (e["at"] for e in reversed(job["history"]) if e["state"] == "QUEUED"), job["submitted_at"]
            )
            waits.setdefault(job["tenant"], []).append(
                (now - datetime.fromisoformat(queued_at)).total_seconds()
            )
        length = GaugeMetricFamily("ffdl_queue_length", "Queued jobs per tenant", labels=["tenant"])
        longest = GaugeMetricFamily(
            "ffdl_queue_wait_max_seconds", "Longest current wait per tenant", labels=["tenant"]
        )
        mean = GaugeMetricFamily(
            "ffdl_queue_wait_mean_seconds", "Mean current wait per tenant", labels=["tenant"]
        )
        for tenant, values in sorted(waits.items()):
            length.add_metric([tenant], len(values))
            longest.add_metric([tenant], max(values))
            mean.add_metric([tenant], sum(values) / len(values))
        yield from (length, longest, mean)


def registry_for(*collectors: Collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    return registry
