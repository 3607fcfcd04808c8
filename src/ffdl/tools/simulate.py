"""``ffdl simulate``: a trace through the scheduler's planning step on a cluster of N x G GPUs.

The simulation itself is pure (:mod:`ffdl.core.simulation`); this module builds the cluster,
applies the configured tenant quotas and scheduler settings, times the run, and renders the
report as tables or one JSON object.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.table import Table

from ffdl.core.allocator import Node, PlacementPolicy
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.simulation import TraceJob, simulate, summarize
from ffdl.tools.simulate_report import render_report

PLACEMENTS: dict[str, PlacementPolicy] = {"pack": "pack", "spread": "spread"}


def homogeneous_cluster(nodes: int, gpus_per_node: int, gpu_type: str = "simulated") -> list[Node]:
    width = len(str(max(nodes - 1, 0)))
    return [Node(f"node-{index:0{width}d}", gpus_per_node, gpu_type) for index in range(nodes)]


def run_simulation(
    trace: list[TraceJob],
    nodes: list[Node],
    policy: SchedulerPolicy,
    placement: PlacementPolicy | None = None,
    html: Path | None = None,
) -> dict[str, Any]:
    """The report of :func:`ffdl.core.simulation.summarize`, with the cluster and the wall time;
    with ``html``, also written there as a self-contained page with pictures."""
    started = time.perf_counter()
    result = simulate(trace, nodes, policy, placement=placement, record=html is not None)
    wall_s = time.perf_counter() - started
    report = summarize(result)
    report["cluster"] = {
        "nodes": len(nodes),
        "gpus": result.capacity_gpus,
        "placement": placement or "per job (pack)",
    }
    report["wall_s"] = wall_s
    report["jobs_per_wall_second"] = len(trace) / wall_s if wall_s > 0 else 0.0
    if html is not None:
        html.write_text(render_report(report, result, nodes))
    return report


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def _pair(p50: float, p99: float) -> str:
    return f"{_hours(p50)} / {_hours(p99)}"


def report_tables(report: dict[str, Any]) -> list[Table]:
    cluster = report["cluster"]
    title = f"simulation: {cluster['nodes']} nodes, {cluster['gpus']} GPUs, placement {cluster['placement']}"
    summary = Table(title=title)
    summary.add_column("measure")
    summary.add_column("value", justify="right")
    rows = [
        ("jobs (completed)", f"{report['jobs']} ({report['completed']})"),
        ("never run (cannot fit)", str(len(report["never_run"]))),
        ("GPU utilisation", f"{report['utilization']:.1%}"),
        ("queueing delay p50 / p99", _pair(report["queue_delay_p50"], report["queue_delay_p99"])),
        ("completion time p50 / p99", _pair(report["completion_time_p50"], report["completion_time_p99"])),
        ("makespan", _hours(report["makespan"])),
        ("preemptions", str(report["preemptions"])),
        ("most GPUs in use", f"{report['max_gpus_in_use']} of {report['capacity_gpus']}"),
        ("fairness (Jain, over tenants' slowdown)", f"{report['fairness']:.3f}"),
        ("scheduling cycles", str(report["scheduling_cycles"])),
        ("simulated jobs per wall second", f"{report['jobs_per_wall_second']:.0f}"),
    ]
    for measure, value in rows:
        summary.add_row(measure, value)
    tenants = Table(title="per tenant")
    for column in ("tenant", "jobs", "completed", "GPU hours", "delay p50", "delay p99", "slowdown"):
        tenants.add_column(column, justify="left" if column == "tenant" else "right")
    for name, figures in report["tenants"].items():
        tenants.add_row(
            name,
            str(figures["jobs"]),
            str(figures["completed"]),
            f"{figures['gpu_hours']:.1f}",
            _hours(figures["queue_delay_p50"]),
            _hours(figures["queue_delay_p99"]),
            f"{figures['mean_slowdown']:.2f}",
        )
    return [summary, tenants]
