"""The dashboard's other pages and controls in a real browser, on one platform shared by the module:
an admin's view of every tenant's jobs, the job list's filters (in place, still live), cancelling
with a confirmation and a refusal shown as the API words it, why a job waits, where its learners
run and the reasons in its timeline, the cluster's cordoned and draining nodes with the queue and
the tenants' quotas, a cordon shown while the cluster page is open, the way to a job by keyboard
alone, and a live update that leaves the keyboard's focus where it was.

Four nodes (8 GPUs) and no preemption, so nothing moves but what a test moves; ``acme`` may hold at
most 2 GPUs (1 guaranteed, 1 borrowed), so a second job of acme's waits for its quota, not for a
free GPU, whatever the other tests left running. After each test every live job is cancelled."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Dialog, Page, expect

from ffdl.adapters.tenants import TenantRegistry
from ffdl.cli.serve import api_server
from ffdl.wiring.config import NodeConfig, SchedulerConfig, TenantQuotaConfig
from ffdl.wiring.platform import Platform
from tests.browser.conftest import chromium, screenshot
from tests.browser.test_dashboard import BRIEF, WAIT_MS, WATCH_STATES, console_errors, sign_in, states_seen
from tests.e2e.test_api import bearer
from tests.harness import TERMINAL, Api, fast_settings, manifest
from tests.services import wait_until_async

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

NODES = [
    NodeConfig(name="node-a", gpus=4),
    NodeConfig(name="node-b", gpus=2),
    NodeConfig(name="node-c", gpus=1),
    NodeConfig(name="node-d", gpus=1),
]
ACME_QUOTA = TenantQuotaConfig(guaranteed_gpus=1, borrowing_limit_gpus=1, weight=2.0)
LONG = ["--steps", "600", "--delay", "0.05"]
QUICK = ["--steps", "6", "--delay", "0.05"]
#: The tenants' table: what each holds (GPUs, and the GPU-equivalents quotas count), its quota
#: (guaranteed, borrowing limit), what it borrows, and its fair share.
SHARE_HEADINGS = [
    "Tenant",
    "GPUs held",
    "Counts as",
    "Queued jobs",
    "Guaranteed",
    "Borrowing limit",
    "Borrowed",
    "Weight",
    "Fair share",
]
ACTIONABLE = "a[href], button:not([disabled]), input, select, textarea, [tabindex]:not([tabindex='-1'])"


@dataclass(frozen=True, slots=True)
class Site:
    """The running platform: its address, an API client acting as the admin, and the tokens."""

    base: str
    api: Api
    acme: str
    globex: str
    admin: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Site]:
    settings = fast_settings(
        tmp_path_factory.mktemp("dashboard") / "ffdl",
        nodes=NODES,
        tenant_quotas={"acme": ACME_QUOTA},
        scheduler=SchedulerConfig(preemption=False),
    )
    registry = TenantRegistry(settings.tenants_path)
    acme, globex, admin = registry.add("acme"), registry.add("globex"), registry.add("sre", admin=True)
    async with Platform(settings) as platform:
        server = api_server(platform, settings.api, open_api=True)
        serving = asyncio.create_task(server.serve())
        async with httpx.AsyncClient(base_url=settings.api, timeout=30, headers=bearer(admin)) as client:
            api = Api(client, server.config.app)

            async def up() -> bool:
                try:
                    return (await client.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until_async(up, 10, what="the API up")
            yield Site(settings.api, api, acme, globex, admin)
        server.should_exit = True
        await serving


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One Chromium for the module (each test opens its own context: its own session storage)."""
    async with chromium() as launched:
        yield launched


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def nothing_left_running(site: Site) -> AsyncIterator[None]:
    """Each test starts on an idle cluster: every job a test left live is cancelled, its GPUs freed."""
    yield
    jobs = (await site.api.http.get("/v1/jobs", params={"limit": 500})).json()["jobs"]
    live = [job["job_id"] for job in jobs if job["state"] not in TERMINAL]
    for job_id in live:
        await site.api.http.delete(f"/v1/jobs/{job_id}")
    for job_id in live:
        await site.api.wait(job_id, *TERMINAL, released=True)  # or it ended on its own meanwhile


async def submit(
    site: Site, token: str, name: str, args: list[str], *, learners: int = 1, gpus: int = 1, **extra: Any
) -> str:
    response = await site.api.http.post(
        "/v1/jobs",
        content=manifest(name, learners=learners, gpus=gpus, args=args, **extra),
        headers={"Content-Type": "application/yaml", **bearer(token)},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["job_id"])


async def new_page(browser: Browser) -> Page:
    """A page in a fresh context whose clock reads UTC, as the API's times do."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800}, timezone_id="UTC")
    return await context.new_page()


async def quota_bound(site: Site) -> tuple[str, str]:
    """acme's 2-GPU job running (all its quota) and a 1-GPU one that waits for that quota."""
    holder = await submit(site, site.acme, "holder", LONG, learners=2)
    await site.api.wait(holder, "RUNNING")
    waiter = await submit(site, site.acme, "waiter", QUICK)
    await site.api.wait_for(waiter, lambda job: job["waiting"] is not None, "the scheduler says why it waits")
    return holder, waiter


async def test_an_admin_sees_every_tenants_jobs_and_a_tenant_only_its_own(
    site: Site, browser: Browser
) -> None:
    mine = await submit(site, site.acme, "acme-job", QUICK)
    theirs = await submit(site, site.globex, "globex-job", QUICK)
    page = await new_page(browser)
    errors = console_errors(page)

    await sign_in(page, site.base, site.admin)
    await expect(page.locator("#who")).to_have_text("sre (admin)")
    await expect(page.locator("#jobs th")).to_contain_text(["Job", "State", "Tenant"])
    for job_id, tenant in ((mine, "acme"), (theirs, "globex")):
        await expect(page.locator(f'tr[data-job="{job_id}"] td').nth(2)).to_have_text(tenant)
    await screenshot(page, "jobs-admin")

    await page.get_by_label("Tenant", exact=True).fill("globex")
    await page.get_by_label("Tenant", exact=True).press("Enter")
    await expect(page.locator(f'tr[data-job="{mine}"]')).to_have_count(0)
    await expect(page.locator(f'tr[data-job="{theirs}"]')).to_be_visible()
    assert "tenant=globex" in page.url

    tenant = await new_page(browser)
    tenant_errors = console_errors(tenant)
    await sign_in(tenant, site.base, site.acme)
    await expect(tenant.locator(f'tr[data-job="{mine}"]')).to_be_visible()
    await expect(tenant.locator(f'tr[data-job="{theirs}"]')).to_have_count(0)
    await expect(tenant.locator("#jobs th", has_text="Tenant")).to_have_count(0)
    await expect(tenant.get_by_label("Tenant", exact=True)).to_have_count(0)
    assert errors == [] and tenant_errors == [], (errors, tenant_errors)


async def test_the_filters_narrow_the_list_in_place_and_it_stays_live(site: Site, browser: Browser) -> None:
    vision = await submit(site, site.acme, "vision", LONG, labels={"team": "vision"})
    nlp = await submit(site, site.acme, "nlp", QUICK, labels={"team": "nlp"})
    await site.api.wait(vision, "RUNNING")
    await site.api.wait(nlp, "COMPLETED")
    page = await new_page(browser)
    errors = console_errors(page)
    await sign_in(page, site.base, site.acme)
    await page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page
    await page.evaluate(WATCH_STATES)

    await page.locator("#f-state").select_option("RUNNING")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator(f'tr[data-job="{nlp}"]')).to_have_count(0)
    await expect(page.locator(f'tr[data-job="{vision}"]')).to_have_attribute("data-state", "RUNNING")
    brief = await submit(site, site.acme, "brief", BRIEF, labels={"team": "vision"})
    await expect(page.locator(f'tr[data-job="{brief}"]')).to_have_attribute(
        "data-state", "RUNNING", timeout=WAIT_MS
    )
    await expect(page.locator(f'tr[data-job="{brief}"]')).to_have_count(0, timeout=WAIT_MS)  # it ran
    assert await states_seen(page, brief) == ["RUNNING"]
    await site.api.wait(brief, "COMPLETED")
    await expect(page.locator(f'tr[data-job="{brief}"]')).to_have_count(0)

    await page.locator("#f-state").select_option("")
    await page.get_by_label("Label").fill("team=nlp")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator(f'tr[data-job="{vision}"]')).to_have_count(0)
    await expect(page.locator(f'tr[data-job="{nlp}"]')).to_be_visible()
    other = await submit(site, site.acme, "other-vision", QUICK, labels={"team": "vision"})
    late = await submit(site, site.acme, "late-nlp", QUICK, labels={"team": "nlp"})
    await expect(page.locator(f'tr[data-job="{late}"]')).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator(f'tr[data-job="{other}"]')).to_have_count(0)  # the stream keeps order
    await screenshot(page, "jobs-filtered")

    # Since the moment `late` was submitted (to the millisecond, in the page's UTC): the jobs before
    # it drop out, and a job submitted now comes in live. A picked time has only minutes, so the
    # instant goes into the address, which the form reads back.
    submitted = datetime.fromisoformat((await site.api.job(late))["submitted_at"]).astimezone(UTC)
    since = submitted.replace(tzinfo=None).isoformat(timespec="milliseconds")
    await page.evaluate("(since) => { location.hash = `#/jobs?since=${since}`; }", since)
    await expect(page.locator(f'tr[data-job="{nlp}"]')).to_have_count(0)
    await expect(page.locator(f'tr[data-job="{late}"]')).to_be_visible()
    await expect(page.get_by_label("Submitted since")).to_have_value(shortest_local(since))
    newest = await submit(site, site.acme, "newest", QUICK)
    await expect(page.locator(f'tr[data-job="{newest}"]')).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#jobs-body tr[data-job]")).to_have_count(2)  # late and newest only
    assert await page.evaluate("window.__sameDocument") is True
    assert errors == [], errors


def shortest_local(moment: str) -> str:
    """``moment`` (to the millisecond) as a datetime-local field gives its value back: the shortest
    form (no trailing zeros in the fraction, no zero seconds), as the HTML standard normalises it."""
    whole, _, millis = moment.partition(".")
    if millis.rstrip("0"):
        return f"{whole}.{millis.rstrip('0')}"
    return whole.removesuffix(":00")


async def test_cancel_asks_first_and_a_refusal_reads_as_the_api_words_it(
    site: Site, browser: Browser
) -> None:
    job_id = await submit(site, site.acme, "to-cancel", LONG)
    await site.api.wait(job_id, "RUNNING")
    page = await new_page(browser)
    errors = console_errors(page)
    deletes: list[str] = []
    page.on("request", lambda request: deletes.append(request.url) if request.method == "DELETE" else None)
    await sign_in(page, site.base, site.acme)
    row = page.locator(f'tr[data-job="{job_id}"]')
    await expect(row).to_have_attribute("data-state", "RUNNING")

    asked: list[str] = []

    async def say_no(dialog: Dialog) -> None:
        asked.append(dialog.message)
        await dialog.dismiss()

    page.once("dialog", say_no)
    await page.get_by_role("button", name=f"Cancel {job_id}").click()
    assert asked == [f"Cancel {job_id}?"]
    assert deletes == [] and (await site.api.job(job_id))["state"] == "RUNNING"
    await expect(row).to_have_attribute("data-state", "RUNNING")

    page.once("dialog", lambda dialog: dialog.accept())
    await page.get_by_role("button", name=f"Cancel {job_id}").click()
    await expect(row).to_have_attribute("data-state", "CANCELLED", timeout=WAIT_MS)
    await expect(page.get_by_role("button", name=f"Cancel {job_id}")).to_be_disabled()
    assert len(deletes) == 1 and deletes[0].endswith(f"/v1/jobs/{job_id}"), deletes

    # A halted job, its page open with Resume offered; while the confirmation is up, someone cancels
    # it: the page's resume is refused, and says so in the API's own words.
    _, waiter = await quota_bound(site)
    assert (await site.api.http.post(f"/v1/jobs/{waiter}:halt")).status_code in (200, 202)
    await site.api.wait(waiter, "HALTED")
    await page.goto(f"{site.base}/#/jobs/{waiter}")
    resume = page.get_by_role("button", name=f"Resume {waiter}")
    await expect(resume).to_be_enabled()
    dialogs: asyncio.Queue[Dialog] = asyncio.Queue()
    page.once("dialog", dialogs.put_nowait)
    clicking = asyncio.create_task(resume.click())
    dialog = await asyncio.wait_for(dialogs.get(), WAIT_MS / 1000)
    assert dialog.message == f"Resume {waiter}?"
    await site.api.http.delete(f"/v1/jobs/{waiter}", headers=bearer(site.acme))
    await site.api.wait(waiter, "CANCELLED")
    await dialog.accept()
    await clicking
    refused = await site.api.http.post(f"/v1/jobs/{waiter}:resume", headers=bearer(site.acme))
    assert refused.status_code == 409, refused.text
    words = refused.json()["detail"][0]["message"]
    assert "only a HALTED job can be resumed" in words
    await expect(page.get_by_role("alert")).to_have_text(f"Resume refused: {words}")
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "CANCELLED", timeout=WAIT_MS)
    await screenshot(page, "job-refused")
    assert all("409" in error for error in errors), errors  # the browser logs the refused request


async def test_the_job_page_says_why_a_job_waits_and_where_its_learners_run(
    site: Site, browser: Browser
) -> None:
    holder, waiter = await quota_bound(site)
    page = await new_page(browser)
    errors = console_errors(page)
    await sign_in(page, site.base, site.acme)

    await page.goto(f"{site.base}/#/jobs/{waiter}")
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "QUEUED")
    await expect(page.locator("#why")).to_contain_text(
        f"{waiter} waits (quota, position 1 of 1 in the queue)", timeout=WAIT_MS
    )
    await expect(page.locator("#why + p")).to_have_text(
        "Position 1 of 1; 1 within acme, which holds 2 GPU(s)."
    )
    await expect(page.locator("#log")).to_have_text("(no log until the job is launched)")
    await screenshot(page, "job-pending")

    await page.goto(f"{site.base}/#/jobs/{holder}")
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "RUNNING")
    await expect(page.locator("#why-card")).to_be_hidden()  # a running job is not pending: no card says so
    job = await site.api.job(holder)
    learners = page.get_by_role("region", name="Learners").locator("tbody tr")
    await expect(learners).to_have_count(2)
    for learner in job["learners"]:
        cells = learners.nth(learner["rank"]).locator("td")
        assert learner["node"] in {node.name for node in NODES} and len(learner["gpus"]) == 1
        await expect(cells.nth(0)).to_have_text(str(learner["rank"]))
        await expect(cells.nth(1)).to_have_text("RUNNING", timeout=WAIT_MS)
        await expect(cells.nth(2)).to_have_text(learner["node"])
        await expect(cells.nth(3)).to_have_text(", ".join(str(gpu) for gpu in learner["gpus"]))

    reasons = [(entry["state"], entry["reason"]) for entry in job["history"] if entry["reason"]]
    assert reasons, job["history"]
    for state, reason in reasons:
        bar = page.locator(f'#gantt [data-state="{state}"]').first
        await bar.hover()
        explained = re.compile(rf"^{state} from .+ for [\d.]+s: {re.escape(reason)}$")
        await expect(bar).to_have_attribute("title", explained)
        await expect(bar).to_have_attribute("aria-label", explained)  # the same, read when focused
    await screenshot(page, "job-learners")
    assert errors == [], errors


async def test_the_cluster_marks_cordoned_and_draining_nodes_and_shows_quotas(
    site: Site, browser: Browser
) -> None:
    holder, waiter = await quota_bound(site)
    cordoned = await site.api.http.post("/v1/nodes/node-c:cordon", json={"reason": "fan replacement"})
    drained = await site.api.http.post("/v1/nodes/node-d:cordon", json={"reason": "kernel", "drain": True})
    assert (cordoned.json()["status"], drained.json()["status"]) == ("CORDONED", "DRAINING")
    try:
        page = await new_page(browser)
        errors = console_errors(page)
        await sign_in(page, site.base, site.admin)
        await page.get_by_role("link", name="Cluster").click()
        await expect(page.get_by_role("link", name="Cluster")).to_have_attribute("aria-current", "page")

        for name, status, reason in (
            ("node-c", "CORDONED", "fan replacement"),
            ("node-d", "DRAINING", "kernel"),
        ):
            mark = page.locator(f'.node[data-node="{name}"] .mark')
            await expect(mark).to_have_text(status)
            await expect(mark).to_have_attribute("title", reason)
        for name in ("node-a", "node-b"):
            await expect(page.locator(f'.node[data-node="{name}"] .mark')).to_have_count(0)
        await expect(page.locator(f'.gpu[data-holder="{holder}"]')).to_have_count(2)

        queue = page.get_by_role("region", name="Queue").locator("tbody tr")
        await expect(queue).to_have_count(1)
        await expect(queue.locator("td")).to_have_text(
            [
                "1",
                waiter,
                "acme",
                "0",
                "1 \N{MULTIPLICATION SIGN} 1",
                re.compile("acme may hold at most 2 GPUs"),
            ]
        )
        # acme alone wants GPUs: its fair share is all 8 present (cordoned ones count), it borrows 1
        share = page.get_by_role("region", name="Tenants: quota, borrowing, fair share")
        await expect(share.locator("th")).to_have_text(SHARE_HEADINGS)
        acme = share.locator("tbody tr", has=page.get_by_role("cell", name="acme", exact=True))
        await expect(acme.locator("td")).to_have_text(["acme", "2", "2", "1", "1", "1", "1", "2", "8"])
        await screenshot(page, "cluster-cordoned")

        assert errors == [], errors
    finally:
        for name in ("node-c", "node-d"):
            await site.api.http.post(f"/v1/nodes/{name}:uncordon", json={"reason": "done"})


async def test_the_cluster_page_shows_a_cordon_made_while_it_is_open(site: Site, browser: Browser) -> None:
    """No job moves (nothing runs), so only the node's own change can redraw the page."""
    page = await new_page(browser)
    errors = console_errors(page)
    await sign_in(page, site.base, site.admin)
    await page.get_by_role("link", name="Cluster").click()
    mark = page.locator('.node[data-node="node-b"] .mark')
    await expect(page.locator('.node[data-node="node-b"]')).to_be_visible()
    await expect(mark).to_have_count(0)
    try:
        cordoned = await site.api.http.post("/v1/nodes/node-b:cordon", json={"reason": "bios update"})
        assert cordoned.status_code == 200, cordoned.text
        await expect(mark).to_have_text("CORDONED", timeout=WAIT_MS)
        await expect(mark).to_have_attribute("title", "bios update")
    finally:
        await site.api.http.post("/v1/nodes/node-b:uncordon", json={"reason": "done"})
    await expect(mark).to_have_count(0, timeout=WAIT_MS)
    assert errors == [], errors


async def test_a_tenant_reaches_a_job_by_keyboard_alone(site: Site, browser: Browser) -> None:
    job_id = await submit(site, site.acme, "by-keyboard", LONG)
    await site.api.wait(job_id, "RUNNING")
    page = await new_page(browser)
    errors = console_errors(page)
    await page.goto(f"{site.base}/")

    await expect(page.locator("#token")).to_be_focused()  # the sign-in puts the cursor in the field
    await page.keyboard.type(site.acme)
    await page.keyboard.press("Enter")
    await expect(page.locator("#jobs")).to_be_visible()

    async def tab_to(selector: str, most: int) -> list[str]:
        """Tab until ``selector`` has the focus; every stop on the way must be actionable."""
        stops: list[str] = []
        for _ in range(most):
            await page.keyboard.press("Tab")
            stop = await page.evaluate(
                """(actionable) => { const e = document.activeElement;
                    const name = e.getAttribute("aria-label") || e.textContent.trim();
                    return { what: `${e.tagName.toLowerCase()} ${name}`, actionable: e.matches(actionable),
                             shown: e.getClientRects().length > 0 }; }""",
                ACTIONABLE,
            )
            stops.append(stop["what"])
            assert stop["actionable"] and stop["shown"], " | ".join(stops)  # the last one is the culprit
            if await page.locator(f"{selector}:focus").count():
                return stops
        raise AssertionError(f"{selector} not reached in {most} tabs: {stops}")

    stops = await tab_to(f'#jobs a[href="#/jobs/{job_id}"]', 20)
    assert "button Filter" in stops, stops  # on from where the sign-in was: the filters, then the rows
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", level=1)).to_have_text(job_id)
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "RUNNING")
    await tab_to(f'button[aria-label="Halt {job_id}"]', 20)
    await tab_to("#gantt [data-state='RUNNING']", 10)
    await expect(page.locator("#gantt [data-state='RUNNING']")).to_have_attribute(
        "aria-label", re.compile(r"^RUNNING from ")
    )
    await screenshot(page, "job-keyboard")
    assert errors == [], errors


async def test_a_live_update_leaves_the_keyboard_focus_where_it_was(site: Site, browser: Browser) -> None:
    """The list and the job page redraw what changed as it changes; whatever had the focus keeps it
    (found again by its link, or by its place when its label moved on), or a keyboard user is thrown
    back to the top of the page by every progress report."""
    job_id = await submit(site, site.acme, "focus-kept", LONG)
    await site.api.wait(job_id, "RUNNING")
    page = await new_page(browser)
    errors = console_errors(page)
    await sign_in(page, site.base, site.acme)

    link = page.locator(f'#jobs a[href="#/jobs/{job_id}"]')
    await link.focus()
    assert (await site.api.http.post(f"/v1/jobs/{job_id}:halt")).status_code in (200, 202)
    await expect(page.locator(f'#jobs tr[data-job="{job_id}"]')).to_have_attribute(
        "data-state", "HALTED", timeout=WAIT_MS
    )
    await expect(link).to_be_focused()  # the row was rebuilt, its link has the focus again

    await page.keyboard.press("Enter")
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "HALTED")
    halted = page.locator("#gantt [data-state='HALTED']")
    await halted.focus()
    label = await halted.get_attribute("aria-label")
    await asyncio.sleep(0.2)  # its label says how long it lasted: a tenth of a second longer at least
    assert (await site.api.http.post(f"/v1/jobs/{job_id}:resume")).status_code in (200, 202)
    await expect(page.locator("#job-state")).to_have_attribute("data-state", "RUNNING", timeout=WAIT_MS)
    await expect(halted).not_to_have_attribute("aria-label", label or "")  # its label moved on (how long)
    await expect(halted).to_be_focused()  # ...and it has the focus again, found by its place
    assert errors == [], errors
