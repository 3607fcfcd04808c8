"""``ffdl simulate --html FILE``: a self-contained page of a simulation (inline SVG, no script, no
fetch): the utilisation curve, the queueing delay per tenant, and the GPU map over time.

Drawn on the server as SVG so the file opens anywhere, offline, and prints."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from ffdl.core.allocator import Node
from ffdl.core.simulation import SimulationResult, percentile

WIDTH, HEIGHT, PAD = 900, 220, 40
#: Columns of the GPU map over time.
COLUMNS = 120


def _colour(name: str) -> str:
    """The dashboard's colour for a tenant (same hash), so the two read alike."""
    value = 0
    for char in name:
        value = (value * 31 + ord(char)) & 0xFFFFFFFF
    return f"hsl({value % 360} 60% 42%)"


def _utilisation_svg(result: SimulationResult, start: float, end: float) -> str:
    span = max(end - start, 1e-9)
    capacity = max(result.capacity_gpus, 1)
    points = []
    for at, by_node in result.samples:
        used = sum(sum(t.values()) for t in by_node.values())
        x = PAD + (at - start) / span * (WIDTH - 2 * PAD)
        y = HEIGHT - PAD - used / capacity * (HEIGHT - 2 * PAD)
        points.append(f"{x:.1f},{y:.1f}")
    line = f'<polyline fill="none" stroke="#1f5fbf" stroke-width="1.5" points="{" ".join(points)}"/>'
    axes = (
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>'
        f'<text x="{PAD - 6}" y="{PAD + 4}" text-anchor="end">{capacity}</text>'
        f'<text x="{PAD - 6}" y="{HEIGHT - PAD}" text-anchor="end">0</text>'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle">hours since the first submission '
        f"(0 to {span / 3600:.1f})</text>"
    )
    return _svg(WIDTH, HEIGHT, axes + line, "GPUs in use over time")


def _delay_svg(result: SimulationResult) -> str:
    delays: dict[str, list[float]] = {}
    for outcome in result.outcomes:
        if outcome.first_start is not None:
            delays.setdefault(outcome.job.tenant, []).append(outcome.first_start - outcome.job.submit_time)
    tenants = sorted(delays)
    longest = max((max(v) for v in delays.values()), default=0.0) or 1.0
    row = 28
    height = PAD + row * len(tenants) + 20
    body = []
    for index, tenant in enumerate(tenants):
        values = delays[tenant]
        y = PAD / 2 + index * row
        scale = (WIDTH - 3 * PAD - 80) / longest
        p50, p90, p99 = (percentile(values, f) for f in (0.5, 0.9, 0.99))
        x0 = 80 + PAD

        def x(value: float, x0: float = x0, scale: float = scale) -> float:
            return x0 + value * scale

        body.append(
            f'<text x="{x0 - 8}" y="{y + 16}" text-anchor="end">{escape(tenant)}</text>'
            f'<line x1="{x(0):.1f}" y1="{y + 12}" x2="{x(max(values)):.1f}" y2="{y + 12}" stroke="#999"/>'
            f'<rect x="{x(p50):.1f}" y="{y + 4}" width="{max(x(p90) - x(p50), 1):.1f}" height="16" '
            f'fill="{_colour(tenant)}" opacity="0.7"><title>{escape(tenant)}: {len(values)} jobs, p50 '
            f"{p50 / 3600:.2f} h, p90 {p90 / 3600:.2f} h, p99 {p99 / 3600:.2f} h</title></rect>"
            f'<line x1="{x(p99):.1f}" y1="{y + 2}" x2="{x(p99):.1f}" y2="{y + 22}" '
            'stroke="#b3261e" stroke-width="2"/>'
            f'<text x="{x(max(values)) + 6:.1f}" y="{y + 16}">'
            f"p50 {p50 / 3600:.2f} h · p99 {p99 / 3600:.2f} h</text>"
        )
    return _svg(WIDTH, height, "".join(body), "Queueing delay per tenant (bar: p50 to p90, red: p99)")


def _gpu_map_svg(result: SimulationResult, nodes: Sequence[Node], start: float, end: float) -> str:
    """Nodes (rows) by time (columns): each cell coloured by the tenant holding most of the node's GPUs
    then, as opaque as the node is full."""
    span = max(end - start, 1e-9)
    cell_w = (WIDTH - PAD - 110) / COLUMNS
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
                f'<rect x="{110 + column * cell_w:.1f}" y="{row * cell_h:.1f}" width="{cell_w + 0.3:.1f}" '
                f'height="{cell_h - 1:.1f}" fill="{_colour(tenant)}" opacity="{0.25 + 0.75 * fill:.2f}"/>'
            )
    labels = "".join(
        f'<text x="104" y="{row * cell_h + cell_h - 2:.1f}" text-anchor="end" font-size="{min(11, cell_h)}">'
        f"{escape(node.name)}</text>"
        for row, node in enumerate(nodes)
    )
    return _svg(WIDTH, int(len(nodes) * cell_h) + 4, labels + "".join(cells), "GPU map over time")


def _svg(width: int, height: int, body: str, label: str) -> str:
    return (
        f'<svg role="img" aria-label="{escape(label)}" viewBox="0 0 {width} {height}" width="100%" '
        f'font-size="11" font-family="system-ui, sans-serif">{body}</svg>'
    )


def render_report(report: dict[str, Any], result: SimulationResult, nodes: Sequence[Node]) -> str:
    """The page: headline figures, then the three pictures, each with a heading."""
    start = result.first_submit
    end = max(result.last_end, start + 1)
    tenants = sorted({o.job.tenant for o in result.outcomes})
    legend = " ".join(
        f'<span><span style="display:inline-block;width:10px;height:10px;background:{_colour(t)}"></span> '
        f"{escape(t)}</span>"
        for t in tenants
    )
    figures = "".join(
        f"<tr><th>{escape(str(key))}</th><td>{escape(str(value))}</td></tr>"
        for key, value in report.items()
        if not isinstance(value, dict | list)
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ffdl simulation report</title>
<style>body{{font:14px/1.45 system-ui,sans-serif;margin:16px auto;max-width:960px;padding:0 12px;
color:#1b1f24}}
th{{text-align:left;padding-right:12px;color:#5c6670;font-weight:500}}section{{margin:18px 0}}</style></head>
<body><h1>Simulation report</h1>
<p>{len(result.outcomes)} jobs on {len(nodes)} nodes ({result.capacity_gpus} GPUs);
{result.preemptions} preemptions.</p>
<table>{figures}</table>
<section><h2>Utilisation</h2>{_utilisation_svg(result, start, end)}</section>
<section><h2>Queueing delay per tenant</h2>{_delay_svg(result)}</section>
<section><h2>GPU map over time</h2><p>{legend}</p>{_gpu_map_svg(result, nodes, start, end)}</section>
</body></html>
"""
