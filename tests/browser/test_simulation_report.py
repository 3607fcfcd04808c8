"""``ffdl simulate --html FILE``: one file that opens anywhere, offline, with its three pictures."""

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


def simulate_html(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    page = tmp_path / "report.html"
    result = CliRunner().invoke(
        app,
        [
            *("simulate", "--generate", "80", "--out", str(tmp_path / "trace.jsonl"), "--nodes", "2"),
            *("--gpus-per-node", "4", "--tenants", "3", "--html", str(page), "--json"),
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
    for picture in ("GPUs in use over time", "Queueing delay per tenant", "GPU map over time"):
        assert f'aria-label="{picture}' in text
    trace = (tmp_path / "trace.jsonl").read_text().splitlines()
    tenants = {json.loads(line)["tenant"] for line in trace}
    assert len(tenants) == 3 and all(tenant in text for tenant in tenants)
    assert report["completed"] == 80

    page = await (await browser.new_context(viewport={"width": 1280, "height": 800})).new_page()
    errors = console_errors(page)
    requests: list[str] = []

    def fetched(request: Request) -> None:
        if request.url != path.as_uri():
            requests.append(request.url)

    page.on("request", fetched)
    await page.goto(path.as_uri())
    svgs = page.locator("svg[role=img]")
    assert await svgs.count() == 3
    for index in range(3):
        box = await svgs.nth(index).bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 20, box
    assert await page.locator("svg polyline").count() == 1  # the utilisation curve
    assert await page.locator("svg rect").count() > 10  # delay bars and the GPU map's cells
    await screenshot(page, "simulation-report")
    assert errors == [] and requests == [], (errors, requests)
