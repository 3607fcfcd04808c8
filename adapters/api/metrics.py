"""Prometheus metrics, read from the projections and the roles' counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ffdl.adapters.platform import Platform


class PlatformCollector(Collector):
    def __init__(self, platform: Platform) -> None:
        self._platform = platform

    def collect(self) -> Iterator[Metric]:
        platform = self._platform
        jobs = GaugeMetricFamily("ffdl_jobs", "Jobs by state and tenant", labels=["tenant", "state"])
        for (tenant, state), count in sorted(platform.projection.counts().items()):
            jobs.add_metric([tenant, state], count)
        yield jobs
        holdings = platform.projection.holdings()
        allocated = sum(len(learner["gpus"]) for job in holdings for learner in job["placement"])
        total = sum(node.gpus for node in platform.settings.inventory())
        gpus = GaugeMetricFamily("ffdl_gpus", "GPUs of the inventory", labels=["status"])
        gpus.add_metric(["allocated"], allocated)
        gpus.add_metric(["total"], total)
        yield gpus
        queue = GaugeMetricFamily("ffdl_queue_length", "Queued jobs per tenant", labels=["tenant"])
        per_tenant: dict[str, int] = {}
        for job in platform.projection.queue():
            per_tenant[job["tenant"]] = per_tenant.get(job["tenant"], 0) + 1
        for tenant, count in sorted(per_tenant.items()):
            queue.add_metric([tenant], count)
        yield queue
        dead = CounterMetricFamily("ffdl_dead_letters", "Records sent to the dead-letter topic by this process")
        dead.add_metric([], platform.owner.dead_letters if platform.owner else 0)
        yield dead
        applied = CounterMetricFamily("ffdl_projected_events", "Events applied to the projections by this process")
        applied.add_metric([], platform.projector.applied)
        yield applied


def registry_for(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry
