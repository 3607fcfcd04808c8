"""Prometheus metrics, read at scrape time from the projections and the roles' counters.

Jobs by state and tenant, queue length and the longest and mean wait per tenant, GPUs allocated
and total, the projector's lag behind the log per partition, dead letters, and (observed by the
projector as it applies events) the event-to-projection latency histogram.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ffdl.adapters.platform import Platform


class PlatformCollector(Collector):
    def __init__(self, platform: Platform) -> None:
        self._platform = platform
        self.log_ends: dict[int, int] = {}

    def collect(self) -> Iterator[Metric]:
        platform = self._platform
        projection = platform.projection
        jobs = GaugeMetricFamily("ffdl_jobs", "Jobs by state and tenant", labels=["tenant", "state"])
        for (tenant, state), count in sorted(projection.counts().items()):
            jobs.add_metric([tenant, state], count)
        yield jobs
        allocated = sum(len(learner["gpus"]) for job in projection.holdings() for learner in job["placement"])
        gpus = GaugeMetricFamily("ffdl_gpus", "GPUs of the inventory", labels=["status"])
        gpus.add_metric(["allocated"], allocated)
        gpus.add_metric(["total"], sum(node.gpus for node in platform.inventory()))
        yield gpus
        yield from self._queues()
        lag = GaugeMetricFamily(
            "ffdl_projection_lag_events", "Events on the log not yet projected", labels=["partition"]
        )
        applied = projection.positions()
        for partition, end in sorted(self.log_ends.items()):
            lag.add_metric([str(partition)], max(0, end - applied.get(partition, 0)))
        yield lag
        dead = CounterMetricFamily("ffdl_dead_letters", "Records this process sent to the dead-letter topic")
        dead.add_metric([], platform.owner.dead_letters if platform.owner else 0)
        yield dead
        ignored = CounterMetricFamily(
            "ffdl_ignored_events", "Duplicate or conflicting events readers ignored"
        )
        ignored.add_metric([], projection.ignored_events())
        yield ignored

    def _queues(self) -> Iterator[Metric]:
        now = datetime.now(UTC)
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
