"""The dashboard in a real browser: sign-in, tenancy, a job watched live through halt, resume and
completion, its loss curve, the cluster's GPU map, and the time machine at moments of the run."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, expect

from ffdl.adapters.tenants import TenantRegistry
from ffdl.wiring.config import Settings
from tests.browser.conftest import screenshot
from tests.e2e.test_api import bearer, submit_as
from tests.harness import Api
from tests.services import wait_until_async

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

LONG = ["--steps", "600", "--delay", "0.05"]
STEADY = ["--steps", "70", "--delay", "0.1", "--checkpoint-every", "10"]
#: About a second in RUNNING, long enough for the live list to show it there.
BRIEF = ["--steps", "20", "--delay", "0.05"]
WAIT_MS = 60_000


def console_errors(page: Page) -> list[str]:
    errors: list[str] = []

    def seen(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("console", seen)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


async def sign_in(page: Page, base: str, token: str) -> None:
    await page.goto(f"{base}/")
    await page.locator("#token").fill(token)
    await page.keyboard.press("Enter")  # the form submits by keyboard
    await expect(page.locator("#jobs")).to_be_visible()


PHONE = {"width": 390, "height": 844}


async def fits_a_phone(page: Page, name: str) -> None:
    """At a phone's width the page scrolls only down: nothing sticks out sideways (a wide table
    scrolls inside its own box), and its screenshot is saved as NAME."""
    size = page.viewport_size
    await page.set_viewport_size(PHONE)
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    await screenshot(page, name)
    assert overflow <= 0, f"{name}: {overflow}px wider than a phone"
    if size is not None:
        await page.set_viewport_size(size)


async def states_seen(page: Page, job_id: str) -> list[str]:
    seen: list[str] = await page.evaluate("(id) => window.__seen[id] || []", job_id)
    return seen


WATCH_STATES = """() => {
    window.__seen = {};
    const note = (row) => { const s = (window.__seen[row.dataset.job] ||= []);
        if (s.at(-1) !== row.dataset.state) s.push(row.dataset.state); };
    new MutationObserver(() => document.querySelectorAll("#jobs-body tr[data-job]").forEach(note))
        .observe(document.getElementById("main"), { childList: true, subtree: true });
}"""


def instant(job: dict[str, Any], state: str) -> datetime:
    return datetime.fromisoformat(next(e["at"] for e in job["history"] if e["state"] == state))


async def test_a_tenant_watches_its_job_and_the_cluster(
    api: Api, settings: Settings, browser: Browser
) -> None:
    registry = TenantRegistry(settings.tenants_path)
    acme, globex = registry.add("acme"), registry.add("globex")
    theirs = (await submit_as(api, globex, "globex-job", LONG))["job_id"]
    base = settings.api
    page = await (await browser.new_context(viewport={"width": 1280, "height": 800})).new_page()
    errors = console_errors(page)

    await sign_in(page, base, acme)
    assert await page.evaluate("sessionStorage.getItem('ffdl.token')") == acme
    assert acme not in page.url
    await expect(page.locator(f'tr[data-job="{theirs}"]')).to_have_count(0)
    await expect(page.locator("#live")).to_contain_text("Live", timeout=WAIT_MS)  # following from now
    await page.evaluate(WATCH_STATES)

    # acme's first job fills the node beside globex's, so the next one waits in the queue, where the
    # page must show it, until the first is cancelled (the list shows each job as it is when it
    # looks: a job that went through the queue in a millisecond would show up scheduled)
    blocker = (await submit_as(api, acme, "blocker", LONG, gpus=3))["job_id"]
    await expect(page.locator(f'tr[data-job="{blocker}"]')).to_have_attribute(
        "data-state", "RUNNING", timeout=WAIT_MS
    )
    waiter = (await submit_as(api, acme, "waiter", BRIEF))["job_id"]
    row = page.locator(f'tr[data-job="{waiter}"]')
    await expect(row).to_have_attribute("data-state", "QUEUED", timeout=WAIT_MS)
    assert (await api.http.delete(f"/v1/jobs/{blocker}", headers=bearer(acme))).status_code in (200, 202)
    await expect(row).to_have_attribute("data-state", "COMPLETED", timeout=WAIT_MS)
    seen = await states_seen(page, waiter)
    assert seen[-1] == "COMPLETED" and seen.index("QUEUED") < seen.index("RUNNING"), seen

    job_id = (await submit_as(api, acme, "steady", STEADY))["job_id"]
    await expect(page.locator(f'tr[data-job="{job_id}"]')).to_have_attribute(
        "data-state", "RUNNING", timeout=WAIT_MS
    )
    await screenshot(page, "jobs")
    await fits_a_phone(page, "jobs-phone")

    await page.locator(f'a[href="#/jobs/{job_id}"]').click()
    curves = page.locator("#curves")
    await expect(curves).not_to_have_attribute("data-points", re.compile(r"^[0-2]$"), timeout=WAIT_MS)
    before = int(await curves.get_attribute("data-points") or 0)
    await expect(curves).not_to_have_attribute("data-points", str(before), timeout=WAIT_MS)

    page.once("dialog", lambda dialog: dialog.accept())
    await page.get_by_role("button", name=f"Halt {job_id}").click()
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "HALTED", timeout=WAIT_MS)
    page.once("dialog", lambda dialog: dialog.accept())
    await page.get_by_role("button", name=f"Resume {job_id}").click()
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "RUNNING", timeout=WAIT_MS)
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "COMPLETED", timeout=WAIT_MS)
    for state in ("QUEUED", "RUNNING", "HALTED", "COMPLETED"):
        await expect(page.locator(f'#gantt [data-state="{state}"]').first).to_be_visible()
    await expect(page.locator("#curves canvas")).to_be_visible()
    await expect(page.locator("#log")).to_contain_text("done at step")
    await screenshot(page, "job")
    await fits_a_phone(page, "job-phone")

    await page.goto(f"{base}/#/cluster")
    await expect(page.locator('.gpu[data-holder="other"]')).to_have_count(1)
    await expect(page.locator("#utilisation canvas")).to_be_visible()
    await screenshot(page, "cluster")
    await fits_a_phone(page, "cluster-phone")

    async def job_now() -> dict[str, Any]:
        return dict((await api.http.get(f"/v1/jobs/{job_id}", headers=bearer(acme))).json())

    async def released() -> bool:
        return (await job_now())["placement"] is None

    await wait_until_async(released, 30, what="the GPUs released")
    job = await job_now()
    running = instant(job, "RUNNING") + timedelta(milliseconds=500)
    await page.goto(f"{base}/?at={quote(running.isoformat())}")
    await expect(page.locator(f'.gpu[data-holder="{job_id}"]')).to_have_count(1)
    await expect(page.locator(f'#tm-jobs tr[data-job="{job_id}"]')).to_have_attribute("data-state", "RUNNING")
    await expect(page.locator('.gpu[data-holder="other"]')).to_have_count(1)
    await screenshot(page, "timemachine")
    await fits_a_phone(page, "timemachine-phone")
    later = datetime.fromisoformat(job["updated_at"]) + timedelta(milliseconds=10)  # after the release
    await page.locator("#tm-at").fill(later.isoformat())
    await page.locator("#tm-at").press("Enter")
    await expect(page.locator(f'#tm-jobs tr[data-job="{job_id}"]')).to_have_attribute(
        "data-state", "COMPLETED"
    )
    await expect(page.locator(f'.gpu[data-holder="{job_id}"]')).to_have_count(0)
    await page.locator("#tm-prev").click()
    await expect(page.locator("#tm-where")).to_contain_text("after")

    assert errors == [], errors
    await page.goto(f"{base}/#/jobs/{theirs}")
    await expect(page.get_by_role("alert")).to_contain_text("404")
    assert all("404" in error for error in errors), errors
