"""``ffdl simulate --html FILE``: a self-contained page of a simulation (inline SVG, no script, no
fetch): the figures of every policy run, the JCT distribution and the utilisation over time of
each, each tenant's median slowdown under each, and for ffdl's policy the queueing delay per
tenant and the GPU map over time. Every figure is in units people read (hours, days, percent),
and every label is laid out from its own length, so none is clipped.

Drawn on the server as SVG so the file opens anywhere, offline, and prints."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from ffdl.core.allocator import Node
from ffdl.core.simulation import SimulationResult, percentile

WIDTH, HEIGHT, PAD = 900, 220, 40
#: Columns of the GPU map over time.
COLUMNS = 120
#: Points of a utilisation curve (the usage is averaged over each slice of time).
CURVE_POINTS = 400
#: One colour per policy, in the order they are run.
POLICY_COLOURS = ("#1f5fbf", "#b3261e", "#7a7a7a", "#2e7d32", "#8e44ad", "#e08a00")
CHAR_W = 6.6  # the width of a character at the page's 11 px, a little generous


def human_duration(seconds: float) -> str:
    """A duration as people read it: 45 s, 12 min, 3.4 h, 2.1 d."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 4 * 86_400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


def _percent(value: float) -> str:
    return f"{value:.1%}"


def _percent_unless(absent: str) -> Callable[[float | None], str]:
    """A share that may not exist, shown as ``absent`` then: a dash where no backlog ever waited,
    n/a where every job arrives at one instant (no span to measure over: :func:`shown_load`)."""
    return lambda value: absent if value is None else _percent(value)


def shown_load(load: float | None) -> str:
    """The offered load as the table's title and the page say it, with why there is none where
    every job arrives at one instant (:func:`ffdl.core.simulation.offered_load`)."""
    if load is None:
        return "n/a (every job arrives at one instant: no span to spread the work over)"
    return f"{load:.2f}"


#: The rows of the comparison (the table and the page): the figure, its label, how it is shown.
ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("completed", "jobs completed", str),
    ("never_run", "never run (cannot fit or over quota)", lambda jobs: str(len(jobs))),
    ("jct_mean_s", "JCT mean", human_duration),
    ("jct_p50_s", "JCT p50", human_duration),
    ("jct_p99_s", "JCT p99", human_duration),
    ("queue_delay_p50_s", "queueing delay p50", human_duration),
    ("queue_delay_p99_s", "queueing delay p99", human_duration),
    ("utilization", "GPU utilisation", _percent),
    ("utilization_while_arriving", "GPU utilisation while jobs arrive", _percent_unless("n/a")),
    ("utilization_backlogged", "GPU utilisation while a backlog waits", _percent_unless("-")),
    ("makespan_s", "makespan", human_duration),
    ("preemptions", "preemptions", str),
    ("max_preemptions_per_job", "most preemptions of one job", str),
    ("lost_gpu_hours", "GPU-hours lost to preemption", lambda value: f"{value:,.1f}"),
    ("fairness", "fairness (Jain, tenants' slowdown)", lambda value: f"{value:.3f}"),
    ("tenant_slowdown_spread", "worst tenant's median slowdown / median's", lambda value: f"{value:.2f}x"),
    ("jobs_per_wall_second", "simulated jobs per wall second", lambda value: f"{value:,.0f}"),
)


def _label_width(labels: Sequence[str]) -> float:
    """Room for the longest of ``labels``, right-aligned before a chart, so none is clipped."""
    return max((len(label) for label in labels), default=0) * CHAR_W + 12


def _colour(name: str) -> str:
    """The dashboard's colour for a tenant (same hash), so the two read alike."""
    value = 0
    for char in name:
        value = (value * 31 + ord(char)) & 0xFFFFFFFF
    return f"hsl({value % 360} 60% 42%)"


def _left_out(report: dict[str, Any]) -> str:
    """The sentence on what the trace's reader left out, if it left anything out."""
    left_out = report.get("left_out") or {}
    if not left_out:
        return ""
    said = ", ".join(f"{count} {escape(reason)}" for reason, count in left_out.items())
    return f" Left out of the trace: {said}."


def _curve(usage: Sequence[tuple[float, int]], start: float, end: float) -> list[tuple[float, float]]:
    """GPUs in use over time, averaged over each of :data:`CURVE_POINTS` slices from start to end."""
    span = max(end - start, 1e-9)
    width = span / CURVE_POINTS
    area = [0.0] * CURVE_POINTS
    for (at, used), (until, _) in itertools.pairwise([*usage, (end, 0)]):
        low, high = max(at, start), min(until, end)
        while low < high:
            index = min(int((low - start) / width), CURVE_POINTS - 1)
            edge = min(high, start + (index + 1) * width)
            if edge <= low:  # rounding at a slice's edge
                edge = high
            area[index] += used * (edge - low)
            low = edge
    return [(start + (index + 0.5) * width, total / width) for index, total in enumerate(area)]


def _utilisation_svg(results: dict[str, SimulationResult], start: float, end: float) -> str:
    span = max(end - start, 1e-9)
    capacity = max(next(iter(results.values())).capacity_gpus, 1)
    lines = []
    for colour, (name, result) in zip(POLICY_COLOURS, results.items(), strict=False):
        points = " ".join(
            f"{PAD + (at - start) / span * (WIDTH - 2 * PAD):.1f},"
            f"{HEIGHT - PAD - used / capacity * (HEIGHT - 2 * PAD):.1f}"
            for at, used in _curve(result.usage, start, end)
        )
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}">'
            f"<title>{escape(name)}</title></polyline>"
        )
    axes = (
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>'
        f'<text x="{PAD - 6}" y="{PAD + 4}" text-anchor="end">100%</text>'
        f'<text x="{PAD - 6}" y="{HEIGHT - PAD}" text-anchor="end">0</text>'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle">time since the first submission '
        f"(0 to {human_duration(span)}; {capacity} GPUs = 100%)</text>"
    )
    return _svg(WIDTH, HEIGHT, axes + "".join(lines), "GPUs in use over time")


def _jct_cdf_svg(results: dict[str, SimulationResult]) -> str:
    """Each policy's distribution of job completion time, on a logarithmic time axis."""
    completions = {
        name: sorted(o.end - o.job.submit_time for o in result.outcomes if o.end is not None)
        for name, result in results.items()
    }
    every = [value for values in completions.values() for value in values]
    low = max(min(every, default=1.0), 1.0)
    high = max(max(every, default=10.0), low * 10)
    left, right = PAD + 10, WIDTH - PAD

    def x(value: float) -> float:
        return left + math.log10(max(value, low) / low) / math.log10(high / low) * (right - left)

    lines = []
    for colour, (name, values) in zip(POLICY_COLOURS, completions.items(), strict=False):
        step = max(1, len(values) // 300)
        chosen = [*values[::step], values[-1]] if values else []
        points = " ".join(
            f"{x(value):.1f},{HEIGHT - PAD - (index * step + 1) / len(values) * (HEIGHT - 2 * PAD):.1f}"
            for index, value in enumerate(chosen[:-1])
        )
        if values:
            points += f" {x(values[-1]):.1f},{PAD:.1f}"
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}">'
            f"<title>{escape(name)}</title></polyline>"
        )
    ticks = []
    for seconds in (60, 600, 3600, 6 * 3600, 86_400, 7 * 86_400, 30 * 86_400):
        if low <= seconds <= high:
            ticks.append(
                f'<line x1="{x(seconds):.1f}" y1="{HEIGHT - PAD}" x2="{x(seconds):.1f}" y2="{PAD}" '
                f'stroke="#ddd"/><text x="{x(seconds):.1f}" y="{HEIGHT - PAD + 14}" '
                f'text-anchor="middle">{human_duration(seconds)}</text>'
            )
    axes = (
        f'<line x1="{left}" y1="{HEIGHT - PAD}" x2="{right}" y2="{HEIGHT - PAD}" stroke="#888"/>'
        f'<text x="{left - 6}" y="{PAD + 4}" text-anchor="end">100%</text>'
        f'<text x="{left - 6}" y="{HEIGHT - PAD}" text-anchor="end">0</text>'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 6}" text-anchor="middle">job completion time '
        "(submission to end, logarithmic)</text>"
    )
    return _svg(WIDTH, HEIGHT, "".join(ticks) + axes + "".join(lines), "Job completion time CDF per policy")


def _slowdown_svg(report: dict[str, Any]) -> str:
    """Each tenant's median slowdown under each policy: a bar per policy, a row per tenant."""
    policies = report["policies"]
    tenants = sorted({tenant for figures in policies.values() for tenant in figures["tenants"]})
    label_w = _label_width(tenants)
    bar = 7
    row = bar * len(policies) + 10
    largest = (
        max(
            (
                figures["tenants"][t]["slowdown_p50"]
                for figures in policies.values()
                for t in figures["tenants"]
            ),
            default=1.0,
        )
        or 1.0
    )
    scale = (WIDTH - label_w - 120) / largest
    body = []
    for index, tenant in enumerate(tenants):
        y = 6 + index * row
        body.append(
            f'<text x="{label_w - 8:.1f}" y="{y + row / 2:.1f}" text-anchor="end">{escape(tenant)}</text>'
        )
        for offset, (colour, (name, figures)) in enumerate(
            zip(POLICY_COLOURS, policies.items(), strict=False)
        ):
            value = figures["tenants"].get(tenant, {}).get("slowdown_p50", 0.0)
            top = y + offset * bar
            body.append(
                f'<rect x="{label_w:.1f}" y="{top}" width="{max(value * scale, 1):.1f}" height="{bar - 1}" '
                f'fill="{colour}"><title>{escape(tenant)} under {escape(name)}: median slowdown '
                f"{value:.2f}</title></rect>"
                f'<text x="{label_w + max(value * scale, 1) + 4:.1f}" y="{top + bar - 1}" font-size="8">'
                f"{value:.1f}</text>"
            )
    return _svg(
        WIDTH, int(6 + row * len(tenants) + 6), "".join(body), "Median slowdown per tenant and policy"
    )


def _comparison_table(report: dict[str, Any]) -> str:
    policies = report["policies"]
    head = "".join(f'<th scope="col">{_swatch(i)}{escape(name)}</th>' for i, name in enumerate(policies))
    rows = "".join(
        f'<tr><th scope="row">{escape(label)}</th>'
        + "".join(f"<td>{escape(show(figures[key]))}</td>" for figures in policies.values())
        + "</tr>"
        for key, label, show in ROWS
    )
    return f'<table class="figures"><thead><tr><th></th>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _swatch(index: int) -> str:
    colour = POLICY_COLOURS[index % len(POLICY_COLOURS)]
    return f'<span class="swatch" style="background:{colour}"></span>'


def _delay_svg(result: SimulationResult) -> str:
    delays: dict[str, list[float]] = {}
    for outcome in result.outcomes:
        if outcome.first_start is not None:
            delays.setdefault(outcome.job.tenant, []).append(outcome.first_start - outcome.job.submit_time)
    tenants = sorted(delays)
    longest = max((max(v) for v in delays.values()), default=0.0) or 1.0
    row = 28
    height = PAD + row * len(tenants) + 20
    x0 = _label_width(tenants)
    tail = len("p50 99.9 min · p99 99.9 min") * CHAR_W  # the figures after the longest bar
    scale = (WIDTH - x0 - tail - 8) / longest
    body = []
    for index, tenant in enumerate(tenants):
        values = delays[tenant]
        y = PAD / 2 + index * row
        p50, p90, p99 = (percentile(values, f) for f in (0.5, 0.9, 0.99))

        def x(value: float, x0: float = x0, scale: float = scale) -> float:
            return x0 + value * scale

        body.append(
            f'<text x="{x0 - 8}" y="{y + 16}" text-anchor="end">{escape(tenant)}</text>'
            f'<line x1="{x(0):.1f}" y1="{y + 12}" x2="{x(max(values)):.1f}" y2="{y + 12}" stroke="#999"/>'
            f'<rect x="{x(p50):.1f}" y="{y + 4}" width="{max(x(p90) - x(p50), 1):.1f}" height="16" '
            f'fill="{_colour(tenant)}" opacity="0.7"><title>{escape(tenant)}: {len(values)} jobs, p50 '
            f"{human_duration(p50)}, p90 {human_duration(p90)}, p99 {human_duration(p99)}</title></rect>"
            f'<line x1="{x(p99):.1f}" y1="{y + 2}" x2="{x(p99):.1f}" y2="{y + 22}" '
            'stroke="#b3261e" stroke-width="2"/>'
            f'<text x="{x(max(values)) + 6:.1f}" y="{y + 16}">'
            f"p50 {human_duration(p50)} · p99 {human_duration(p99)}</text>"
        )
    return _svg(WIDTH, height, "".join(body), "Queueing delay per tenant (bar: p50 to p90, red: p99)")


def _gpu_map_svg(result: SimulationResult, nodes: Sequence[Node], start: float, end: float) -> str:
    """Nodes (rows) by time (columns): each cell coloured by the tenant holding most of the node's GPUs
    then, as opaque as the node is full."""
    span = max(end - start, 1e-9)
    label_w = _label_width([node.name for node in nodes])
    cell_w = (WIDTH - PAD - label_w) / COLUMNS
    cell_h = max(4.0, min(14.0, 400 / max(len(nodes), 1)))
    cells = []
    samples = result.samples
    index = 0
    for column in range(COLUMNS):
        moment = start + (column + 0.5) / COLUMNS * span
        while index + 1 < len(samples) and samples[index + 1][0] <= moment:
            index += 1
        by_node = samples[index][1] if samples and samples[index][0] <= moment else {}
        for row, node in enumerate(nodes):
            tenants = by_node.get(node.name, {})
            if not tenants:
                continue
            tenant = max(tenants, key=lambda t: (tenants[t], t))
            fill = min(1.0, sum(tenants.values()) / max(node.gpus, 1))
            cells.append(
                f'<rect x="{label_w + column * cell_w:.1f}" y="{row * cell_h:.1f}" '
                f'width="{cell_w + 0.3:.1f}" '
                f'height="{cell_h - 1:.1f}" fill="{_colour(tenant)}" opacity="{0.25 + 0.75 * fill:.2f}"/>'
            )
    labels = "".join(
        f'<text x="{label_w - 6:.1f}" y="{row * cell_h + cell_h - 2:.1f}" text-anchor="end" '
        f'font-size="{min(11, cell_h)}">'
        f"{escape(node.name)}</text>"
        for row, node in enumerate(nodes)
    )
    return _svg(WIDTH, int(len(nodes) * cell_h) + 4, labels + "".join(cells), "GPU map over time")


def _svg(width: int, height: int, body: str, label: str) -> str:
    return (
        f'<svg role="img" aria-label="{escape(label)}" viewBox="0 0 {width} {height}" width="100%" '
        f'font-size="11" font-family="system-ui, sans-serif">{body}</svg>'
    )


def render_report(report: dict[str, Any], results: dict[str, SimulationResult], nodes: Sequence[Node]) -> str:
    """The page: the comparison of the policies run, their pictures, then ffdl's own (each with a
    heading); ``results`` by policy, ffdl's first, recorded (``simulate(record=True)``)."""
    ffdl = results["ffdl"]
    start = min(result.first_submit for result in results.values())
    end = max(start + 1, *(result.last_end for result in results.values()))
    tenants = sorted({o.job.tenant for o in ffdl.outcomes})
    legend = " ".join(
        f'<span><span class="swatch" style="background:{_colour(t)}"></span>{escape(t)}</span>'
        for t in tenants
    )
    policies = " ".join(f"<span>{_swatch(i)}{escape(name)}</span>" for i, name in enumerate(results))
    cluster = report["cluster"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ffdl simulation report</title>
<style>body{{font:14px/1.45 system-ui,sans-serif;margin:16px auto;max-width:960px;padding:0 12px;
color:#1b1f24}}
th{{text-align:left;padding-right:12px;color:#5c6670;font-weight:500}}td{{text-align:right;padding:0 8px}}
section{{margin:18px 0}}.swatch{{display:inline-block;width:10px;height:10px;margin-right:4px}}
.legend span{{margin-right:12px;white-space:nowrap}}</style></head>
<body><h1>Simulation report</h1>
<p>{report["jobs"]} jobs on {cluster["nodes"]} nodes ({cluster["gpus"]} GPUs), offered load
{escape(shown_load(report["offered_load"]))}.{_left_out(report)}</p>
{_comparison_table(report)}
<p class="legend">{policies}</p>
<section><h2>Job completion time</h2>{_jct_cdf_svg(results)}</section>
<section><h2>Utilisation</h2>{_utilisation_svg(results, start, end)}</section>
<section><h2>Median slowdown per tenant</h2>{_slowdown_svg(report)}</section>
<section><h2>Queueing delay per tenant (ffdl)</h2>{_delay_svg(ffdl)}</section>
<section><h2>GPU map over time (ffdl)</h2><p class="legend">{legend}</p>
{_gpu_map_svg(ffdl, nodes, ffdl.first_submit, max(ffdl.last_end, ffdl.first_submit + 1))}</section>
</body></html>
"""
