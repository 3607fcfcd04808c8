"""The dashboard reads well on a job that restarted: timeline bars show a state's whole name or none
(never a cut one), the curves' legends show values before any hover, a running job has no "Why
pending" card, a checkpoint's long file:// path fits its table, and the live list counts its
updates in words ("1 update", "3 updates")."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import Browser, Page, expect

from tests.browser.test_dashboard import WAIT_MS, console_errors
from tests.harness import Api, manifest

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

#: Fails once at step 6 (a restart), checkpoints every 3 steps, then runs long enough to be watched.
RESTARTED = ["--steps", "400", "--delay", "0.05", "--fail-at", "6", "--once", "--checkpoint-every", "3"]


async def open_page(browser: Browser, url: str) -> Page:
    page = await (await browser.new_context(viewport={"width": 1280, "height": 800})).new_page()
    await page.goto(url)
    return page


async def test_a_restarted_running_job_reads_well(api: Api, browser: Browser) -> None:
    job_id = await api.submit(manifest("polished", learners=1, args=RESTARTED))
    await api.wait_for(job_id, lambda j: j["state"] == "RUNNING" and j["attempt"] == 2, "attempt 2 running")
    await api.wait_for(job_id, lambda j: len(j["checkpoints"]) >= 2, "two checkpoints")
    page = await open_page(browser, f"{api.http.base_url}/#/jobs/{job_id}")
    errors = console_errors(page)
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "RUNNING", timeout=WAIT_MS)

    # the timeline: each bar's label is its state's whole name, or nothing (the legend names it)
    bars = page.locator("#gantt > span")
    await expect(bars.first).to_be_visible()
    labels = await bars.evaluate_all(
        "bars => bars.map(b => [b.dataset.state, b.textContent, b.scrollWidth <= b.clientWidth])"
    )
    assert all(text in ("", state) and fits for state, text, fits in labels), labels
    assert any(text == "RUNNING" for _, text, _ in labels), labels  # the long bars keep theirs
    assert any(text == "" for _, text, _ in labels), labels  # SCHEDULED lasts no time: no room

    # the curves' legends: values before any hover, never uPlot's "--"
    await expect(page.locator("#curves")).not_to_have_attribute("data-points", "0", timeout=WAIT_MS)
    values = page.locator("#curves .u-legend .u-series:not(:first-child) .u-value")
    await expect(values.first).to_be_visible()
    shown = await values.all_inner_texts()
    assert shown and all(re.fullmatch(r"-?[0-9][0-9.e+-]*", value) for value in shown), shown

    # no "Why pending" card on a running job
    await expect(page.locator("#why-card")).to_be_hidden()
    await expect(page.get_by_text("Not pending")).to_have_count(0)

    # checkpoints: the file's name shown, the whole URI in its title, the table within its card
    cells = page.locator("#ck ~ table td.uri, #ck ~ * td.uri")
    await expect(cells.first).to_be_visible()
    uri = (await api.job(job_id))["checkpoints"][0]["uri"]
    assert uri.startswith("file://") and len(uri) > 60, uri
    first = cells.first
    assert (await first.get_attribute("title")) == uri
    assert (await first.inner_text()) == "…/" + uri.rsplit("/", 1)[1]
    card = page.get_by_role("region", name="Checkpoints")
    assert await card.evaluate("c => c.scrollWidth <= c.clientWidth")
    assert errors == []


async def test_the_live_list_counts_its_updates_in_words(api: Api, browser: Browser) -> None:
    page = await open_page(browser, f"{api.http.base_url}/#/jobs")
    live = page.locator("#live")
    await expect(live).to_contain_text("Live", timeout=WAIT_MS)
    await api.submit(manifest("counted", learners=1, args=["--steps", "3", "--delay", "0.05"]))
    await expect(live).to_have_text(re.compile(r"^Live: (1 update|[0-9]+ updates)$"), timeout=WAIT_MS)
    assert "(s)" not in await live.inner_text()
