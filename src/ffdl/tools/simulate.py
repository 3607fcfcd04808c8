"""``ffdl simulate``: a trace through the scheduler's planning step on a cluster of N x G GPUs,
beside the baseline policies asked for (``--compare``).

The simulations themselves are pure (:mod:`ffdl.core.simulation`, :mod:`ffdl.core.baselines`);
this module builds the cluster, applies the configured tenant quotas and scheduler settings, times
each run, and renders the report as tables or one JSON object.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from ffdl.core.allocator import Node, PlacementPolicy
from ffdl.core.baselines import BASELINES, simulate_baseline
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.simulation import SimulationResult, TraceJob, offered_load, simulate, summarize
from ffdl.tools.simulate_report import ROWS, render_report, shown_load
from ffdl.tools.terminal import shown

PLACEMENTS: dict[str, PlacementPolicy] = {"pack": "pack", "spread": "spread"}


def homogeneous_cluster(nodes: int, gpus_per_node: int, gpu_type: str = "simulated") -> list[Node]:
    width = len(str(max(nodes - 1, 0)))
    return [Node(f"node-{index:0{width}d}", gpus_per_node, gpu_type) for index in range(nodes)]


POLICIES = ("ffdl", *BASELINES)


def run_simulation(
    trace: list[TraceJob],
    nodes: list[Node],
    policy: SchedulerPolicy,
    placement: PlacementPolicy | None = None,
    html: Path | None = None,
    compare: Sequence[str] = (),
    left_out: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``{"offered_load": x, "cluster": ..., "jobs": n, "left_out": {...}, "never_run": [...],
    "policies": {"ffdl": {...}, ...}}``: ffdl's planner and each baseline of ``compare`` over the
    same trace and cluster, each policy's figures those of :func:`ffdl.core.simulation.summarize`
    with its wall time, the jobs that can never run under it among them (the baselines know no
    quotas, so theirs may be fewer); the top-level ``never_run`` is ffdl's, the configured cluster
    and quotas' verdict; ``left_out``, the jobs the trace's reader left out, by reason
    (:class:`~ffdl.tools.trace_formats.LoadedTrace`); with ``html``, also written there as a
    self-contained page with pictures."""
    capacity = sum(node.gpus for node in nodes if node.schedulable)
    load = offered_load(trace, capacity)
    results: dict[str, SimulationResult] = {}
    policies: dict[str, dict[str, Any]] = {}
    for name in ("ffdl", *compare):
        started = time.perf_counter()
        if name == "ffdl":
            result = simulate(trace, nodes, policy, placement=placement, record=html is not None)
        else:
            result = simulate_baseline(name, trace, nodes, placement=placement)
        wall_s = time.perf_counter() - started
        figures = summarize(result, load)
        figures["wall_s"] = wall_s
        figures["jobs_per_wall_second"] = len(trace) / wall_s if wall_s > 0 else 0.0
        results[name] = result
        policies[name] = figures
    report = {
        "offered_load": load,
        "cluster": {"nodes": len(nodes), "gpus": capacity, "placement": placement or "per job (pack)"},
        "jobs": len(trace),
        "left_out": dict(left_out or {}),
        "never_run": policies["ffdl"]["never_run"],
        "policies": policies,
    }
    if html is not None:
        html.write_text(render_report(report, results, nodes))
    return report


def parse_service_queues(text: str) -> tuple[float, ...] | None:
    """``--service-queues``: GPU-hour thresholds, comma-separated, rising, in GPU-seconds; ``off``
    for none; empty for the configuration's (None)."""
    if not text.strip():
        return None
    if text.strip() == "off":
        return ()
    try:
        hours = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"--service-queues takes rising GPU-hours such as 1,16, or off, not {text!r}"
        ) from None
    if any(h <= 0 or not math.isfinite(h) for h in hours) or hours != sorted(set(hours)):
        raise ValueError(f"--service-queues takes rising GPU-hours such as 1,16, or off, not {text!r}")
    return tuple(h * 3600 for h in hours)


def parse_compare(text: str) -> list[str]:
    """The baselines named in ``--compare`` (comma-separated), in the order given, each once."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BASELINES]
    if unknown:
        raise ValueError(f"--compare takes {','.join(BASELINES)}, not {','.join(unknown)}")
    return list(dict.fromkeys(names))


def report_tables(report: dict[str, Any]) -> list[Table]:
    cluster = report["cluster"]
    title = (
        f"simulation: {report['jobs']} jobs on {cluster['nodes']} nodes, {cluster['gpus']} GPUs, "
        f"placement {cluster['placement']}; offered load {shown_load(report['offered_load'])}"
    )
    policies = report["policies"]
    summary = Table(title=title)
    summary.add_column("measure")
    for name in policies:
        summary.add_column(name, justify="right")
    for key, label, show in ROWS:
        summary.add_row(label, *(show(figures[key]) for figures in policies.values()))
    tenants = Table(title="median slowdown per tenant")
    tenants.add_column("tenant")
    tenants.add_column("jobs", justify="right")
    for name in policies:
        tenants.add_column(name, justify="right")
    ffdl = policies["ffdl"]["tenants"]
    for tenant, figures in ffdl.items():
        tenants.add_row(
            shown(tenant),
            str(figures["jobs"]),
            *(f"{policy['tenants'][tenant]['slowdown_p50']:.2f}" for policy in policies.values()),
        )
    return [summary, tenants]
