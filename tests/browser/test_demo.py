"""``make demo``: the demo's job can be watched on the dashboard from its start to COMPLETED, the
learner it kills and the restart included (the demo serves the dashboard at the address it prints)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from playwright.async_api import Browser, expect

from ffdl.cli import demo
from tests.browser.conftest import SCREENSHOTS, screenshot
from tests.browser.test_dashboard import console_errors
from tests.services import free_port, wait_until_async

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


async def test_the_demo_job_is_watched_on_the_dashboard_through_its_restart_to_completed(
    browser: Browser, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    monkeypatch.setattr(demo, "_free_port", lambda: port)
    # the demo logs to a file it closes at the end; the suite's logging must outlive it
    monkeypatch.setattr(demo, "configure_logging", lambda *args: None)
    base = f"http://127.0.0.1:{port}"
    # the demo serves on for a few seconds after the job ends, as it does for a person watching
    running = asyncio.create_task(demo.run_demo(chaos=True, steps=60, keep=False, linger_s=5.0))
    job_ids: list[str] = []

    async def submitted() -> bool:
        try:
            jobs = (await client.get("/v1/jobs")).json()["jobs"]
        except httpx.TransportError:
            return False
        job_ids.extend(job["job_id"] for job in jobs)
        return bool(job_ids)

    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        await wait_until_async(submitted, 30, interval_s=0.1, what="the demo's job")
    [job_id] = job_ids
    page = await (await browser.new_context(viewport={"width": 1280, "height": 800})).new_page()
    errors = console_errors(page)
    await page.goto(f"{base}/#/jobs/{job_id}")  # the address the demo prints
    await expect(page.get_by_role("status")).to_contain_text("Open mode")
    state = page.locator("#job-state")
    await expect(state).to_have_attribute("data-state", "RUNNING", timeout=60_000)
    try:
        await expect(state).to_have_attribute("data-state", "COMPLETED", timeout=100_000)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe page's console errors: {errors}") from exc
    await expect(page.locator('#gantt [data-state="RESTARTING"]').first).to_be_visible()
    await expect(page.locator("#gantt").locator("..")).to_contain_text("1 restart(s), attempt 2")
    await expect(page.locator("#job-reason")).not_to_contain_text("exited")  # not the restart's reason
    await screenshot(page, "demo-job", SCREENSHOTS / "demo-job.png")
    assert await running == 0
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "the API runs OPEN on the loopback interface" in printed, "the open demo says so"
    assert f"watch it in the dashboard: {base}/#/jobs/{job_id}" in printed
