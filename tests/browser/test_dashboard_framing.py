"""The dashboard in a real browser against a hostile page: it is never shown inside another page's
frame (so its halt and cancel buttons cannot be clickjacked), and it runs whole under its Content
Security Policy, which lets no script or style in but its own files."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, ConsoleMessage

from ffdl.adapters.tenants import TenantRegistry
from ffdl.wiring.config import Settings
from tests.browser.test_dashboard import console_errors, sign_in
from tests.harness import Api
from tests.services import wait_until_async

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


async def test_another_page_cannot_frame_the_dashboard(
    api: Api, settings: Settings, browser: Browser
) -> None:
    page = await (await browser.new_context()).new_page()
    refusals: list[str] = []

    def seen(message: ConsoleMessage) -> None:
        if "frame-ancestors" in message.text or "X-Frame-Options" in message.text:
            refusals.append(message.text)

    page.on("console", seen)
    await page.set_content(f'<iframe id="victim" src="{settings.api}/" width="800" height="600"></iframe>')
    await wait_until_async(lambda: bool(refusals), 10, what="the browser to refuse the frame")
    (framed,) = [frame for frame in page.frames if frame is not page.main_frame]
    assert await framed.locator("#main").count() == 0, "the dashboard rendered inside a foreign frame"


async def test_the_dashboard_runs_under_its_policy_and_the_policy_bites(
    api: Api, settings: Settings, browser: Browser
) -> None:
    token = TenantRegistry(settings.tenants_path).add("acme")
    page = await (await browser.new_context()).new_page()
    errors = console_errors(page)
    await sign_in(page, settings.api, token)
    assert errors == [], errors  # nothing of its own was refused
    injected = await page.evaluate(
        """() => new Promise((resolve) => {
            document.addEventListener("securitypolicyviolation", (e) => resolve(e.violatedDirective));
            setTimeout(() => resolve("no violation"), 2000);
            const script = document.createElement("script");
            script.textContent = "window.__injected = true";
            document.body.append(script);
        })"""
    )
    assert injected.startswith("script-src") and await page.evaluate("window.__injected") is None
