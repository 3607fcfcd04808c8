"""A real headless Chromium (the distribution's package, never a downloaded browser) driven by
Playwright, against the platform the suite starts; each test collects the page's console errors.

Nothing here skips: without Chromium (``make services`` installs it) or Playwright (the ``dev``
extra) the browser tests fail and say what is missing, so a run never passes without them."""

from __future__ import annotations

import base64
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright import async_api as playwright_api

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[playwright_api.Browser]:
    """The distribution's Chromium, driven by Playwright (no browser download)."""
    if not Path(CHROMIUM).exists():  # noqa: ASYNC240 - one stat before the browser starts
        pytest.fail("chromium is not installed: `make services` installs it (apt-get install chromium)")
    async with playwright_api.async_playwright() as driver:
        launched = await driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        await launched.close()


@pytest.fixture
async def browser() -> AsyncIterator[playwright_api.Browser]:
    async with chromium() as launched:
        yield launched


async def screenshot(page: playwright_api.Page, name: str, path: Path | None = None) -> Path:
    """Save the page as artifacts/screenshots/NAME.png and check it is not blank: the spread of its
    pixels' brightness (measured in a canvas of a scratch page) must be well above a flat page's."""
    target = path or SCREENSHOTS / f"{name}.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    png = await page.screenshot(path=target, full_page=True)
    scratch = await page.context.new_page()
    try:
        spread = await scratch.evaluate(
            """async (data) => {
                const img = new Image(); img.src = data; await img.decode();
                const c = new OffscreenCanvas(img.width, img.height); const g = c.getContext("2d");
                g.drawImage(img, 0, 0); const px = g.getImageData(0, 0, img.width, img.height).data;
                let n = 0, sum = 0, sq = 0;
                for (let i = 0; i < px.length; i += 16) {
                    const v = (px[i] + px[i + 1] + px[i + 2]) / 3; n++; sum += v; sq += v * v;
                }
                return Math.sqrt(sq / n - (sum / n) ** 2);
            }""",
            "data:image/png;base64," + base64.b64encode(png).decode(),
        )
    finally:
        await scratch.close()
    assert spread > 10, f"screenshot {name} looks blank (brightness spread {spread:.1f})"
    return target
