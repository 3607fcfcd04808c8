"""The dashboard on a platform whose log is a real Kafka-protocol broker (tansu): the page reads only
the API, so a tenant signs in and watches its job run to COMPLETED without reloading, as on the
embedded log."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from ffdl.adapters.tenants import TenantRegistry
from ffdl.wiring.config import Settings
from tests.browser.conftest import screenshot
from tests.browser.test_dashboard import WAIT_MS, WATCH_STATES, console_errors, sign_in, states_seen
from tests.e2e.test_api import submit_as
from tests.harness import Api
from tests.integration.test_kafka_platform import kafka_settings
from tests.services import TansuBroker

pytestmark = [pytest.mark.integration, pytest.mark.browser]


@pytest.fixture
async def settings(tmp_path: Path, broker: TansuBroker) -> Settings:
    return kafka_settings(tmp_path, broker.url, launcher="local")


async def test_a_tenant_watches_its_job_complete_on_kafka(
    api: Api, settings: Settings, browser: Browser
) -> None:
    acme = TenantRegistry(settings.tenants_path).add("acme")
    page = await (await browser.new_context(viewport={"width": 1280, "height": 800})).new_page()
    errors = console_errors(page)

    await sign_in(page, settings.api, acme)
    await expect(page.locator("#live")).to_contain_text("Live", timeout=WAIT_MS)
    await page.evaluate(WATCH_STATES)
    job_id = (await submit_as(api, acme, "on-kafka", ["--steps", "30", "--delay", "0.05"]))["job_id"]

    row = page.locator(f'tr[data-job="{job_id}"]')
    await expect(row).to_have_attribute("data-state", "COMPLETED", timeout=WAIT_MS)
    seen = await states_seen(page, job_id)
    assert seen[-1] == "COMPLETED" and "RUNNING" in seen, seen
    await screenshot(page, "jobs-kafka")
    assert errors == [], errors
