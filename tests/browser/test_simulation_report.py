"""``ffdl simulate --html FILE``: one file that opens anywhere, offline, with its pictures, in
units people read and with no label cut off."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.async_api import Browser, Request
from typer.testing import CliRunner

from ffdl.cli.main import app
from tests.browser.conftest import screenshot
from tests.browser.test_dashboard import console_errors

pytestmark = pytest.mark.browser

#: Anything the page could fetch: a src/href/url() or an address of another site.
EXTERNAL = re.compile(r"\bsrc\s*=|\bhref\s*=|url\(|https?://|<script|<link", re.IGNORECASE)
#: A raw figure: a number with more decimals than anyone reads (437271.2926628713).
RAW = re.compile(r"\d\.\d{4,}")
LONG_TENANT = "a-tenant-with-a-rather-long-name"
PICTURES = (
    "Job completion time CDF per policy",
    "GPUs in use over time",
    "Median slowdown per tenant and policy",
    "Queueing delay per tenant",
    "GPU map over time",
)


def simulate_html(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    page = tmp_path / "report.html"
    trace = tmp_path / "trace.jsonl"
    result = CliRunner().invoke(
        app,
        [
            *("simulate", "--generate", "80", "--out", str(trace), "--nodes", "2"),
            *("--gpus-per-node", "4", "--tenants", "3"),
        ],
    )
    assert result.exit_code == 0, result.output
    with trace.open("a") as out:  # a tenant whose name is long, with a job that waits for days
        for index in range(3):
            job = {"submit_time": 10.0 * index, "tenant": LONG_TENANT, "learners": 2}
            out.write(json.dumps(job | {"gpus_per_learner": 4, "runtime": 437271.2926628713}) + "\n")
    result = CliRunner().invoke(
        app,
        [
            *("simulate", str(trace), "--nodes", "2", "--gpus-per-node", "4"),
            *("--compare", "fifo,backfill,las,oracle", "--html", str(page), "--json"),
        ],
    )
    assert result.exit_code == 0, result.output
    return page, json.loads(result.stdout)


async def test_the_simulation_report_is_one_self_contained_page_with_its_pictures(
    tmp_path: Path, browser: Browser
) -> None:
    path, report = simulate_html(tmp_path)
    text = path.read_text()
    assert EXTERNAL.findall(text) == []
    for picture in PICTURES:
        assert f'aria-label="{picture}' in text
    trace = (tmp_path / "trace.jsonl").read_text().splitlines()
    tenants = {json.loads(line)["tenant"] for line in trace}
    assert len(tenants) == 4 and all(tenant in text for tenant in tenants)
    policies = report["policies"]
    assert isinstance(policies, dict) and set(policies) == {"ffdl", "fifo", "backfill", "las", "oracle"}
    assert all(figures["completed"] == 83 for figures in policies.values())

    page = await (await browser.new_context(viewport={"width": 1280, "height": 800})).new_page()
    errors = console_errors(page)
    requests: list[str] = []

    def fetched(request: Request) -> None:
        if request.url != path.as_uri():
            requests.append(request.url)

    page.on("request", fetched)
    await page.goto(path.as_uri())
    svgs = page.locator("svg[role=img]")
    assert await svgs.count() == len(PICTURES)
    for index in range(len(PICTURES)):
        box = await svgs.nth(index).bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 20, box
    assert await page.locator("svg polyline").count() == 2 * 5  # a JCT CDF and a curve per policy
    assert await page.locator("svg rect").count() > 10  # bars and the GPU map's cells
    shown = await page.locator("body").inner_text()
    assert RAW.findall(shown) == [], "figures are printed in human units"
    assert " d" in shown and " h" in shown  # the long jobs' times, in days and hours
    # every label lies wholly inside its picture: none is clipped at an edge
    clipped = await page.evaluate(
        """() => [...document.querySelectorAll('svg[role=img] text')].filter(t => {
            const svg = t.ownerSVGElement.getBoundingClientRect(), box = t.getBoundingClientRect();
            return box.left < svg.left - 0.5 || box.right > svg.right + 0.5;
        }).map(t => t.textContent)"""
    )
    assert clipped == []
    assert await page.get_by_text(LONG_TENANT, exact=True).count() >= 2  # slowdown and delay rows
    await screenshot(page, "simulation-report")
    assert errors == [] and requests == [], (errors, requests)
