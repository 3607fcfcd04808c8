"""Prometheus metrics, read at scrape time from the projections and the roles' counters.

Jobs by state and tenant, queue length and the longest and mean wait per tenant, nodes by status
(folded from the node events), GPUs allocated and total (of the present nodes), the projector's
lag behind the log per partition, dead letters by reason, duplicate or conflicting events
ignored, and (observed by the projector as it applies events) the event-to-projection latency
histogram.

Dead letters are counted from the dead-letter topic itself by a :class:`DeadLetterTally` that the
API role's process follows (every second), so one scrape sees the whole platform's, whichever
process parked them. Their reasons are free text; the metric labels them by class.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ffdl.core.nodes import NodeStatus
from ffdl.handlers.ports import Bus, BusUnavailable

if TYPE_CHECKING:
    from ffdl.adapters.platform import Platform

log = structlog.get_logger(__name__)

#: Dead-letter reasons as ``events/codec.py`` and ``handlers/owner.py`` word them -> the reason's class.
_REASON_CLASSES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), label)
    for pattern, label in (
        (r"not JSON|not a JSON object|missing 'type'|'data' must be|'schema_version' must be", "undecodable"),
        (r"unknown type ", "unknown_type"),
        (r"no upcaster for |\S+ schema_version \d+ is newer than", "schema_version"),
        (r"invalid ", "invalid"),
        (r"record key .* is not the command's key", "wrong_key"),
        (r"wrong partition: ", "wrong_partition"),
        (r"no job ", "unknown_job"),
        (r"no node ", "unknown_node"),
        (r"internal error: ", "internal_error"),
    )
)
DEAD_LETTER_REASON_HEADER = "ffdl_dlq_reason"


def reason_class(reason: str) -> str:
    """The class of a dead letter's reason, a label value of the metric ("other" when unknown)."""
    return next((label for pattern, label in _REASON_CLASSES if pattern.match(reason)), "other")


class DeadLetterTally:
    """Records on the dead-letter topic, by reason class, read from the topic (from its start)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._next_offsets: dict[int, int] = {}

    async def catch_up(self, bus: Bus, topic: str) -> None:
        """Count the records appended since the last call."""
        for partition, end in sorted((await bus.end_offsets(topic)).items()):
            start = self._next_offsets.get(partition, 0)
            if start >= end:
                continue
            async for record in bus.read(topic, partition, start, end):
                reason = dict(record.headers).get(DEAD_LETTER_REASON_HEADER, b"").decode(errors="replace")
                self.counts[reason_class(reason)] += 1
            self._next_offsets[partition] = end

    async def follow(self, bus: Bus, topic: str, stop: asyncio.Event, every_s: float = 1.0) -> None:
        """Catch up every ``every_s`` until ``stop``."""
        while not stop.is_set():
            try:
                await self.catch_up(bus, topic)
            except BusUnavailable as exc:
                log.warning("cannot count dead letters now", topic=topic, error=str(exc))
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                continue


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
