"""Dashboard benchmark: first paint of the jobs page with 100,000 jobs, and live updates per second.

    python -m bench.dashboard_bench [--jobs 100000] [--paints 5] [--rates 50,100,200,400] [--seconds 10]

Needs Chromium (``/usr/bin/chromium``, the distribution's package; ``make services`` installs it)
and Playwright for Python (the ``dev`` extra), which drives it headless.

1. Projects ``--jobs`` jobs into the projection file of a fresh data directory, as
   ``bench/api_bench.py`` does (copies of event histories the real decider made, 5 tenants, half
   queued and half scheduled), and creates one admin tenant whose token the page signs in with.
2. Starts ``ffdl up --roles api,projector`` in a process of its own: the API serving the page and
   the projector folding what the benchmark publishes on the (embedded) log meanwhile.
3. **First paint**: ``--paints`` times, a fresh browser context (no cache, the token already in the
   tab's session storage) opens ``/``; the page records ``performance.now()`` (milliseconds since
   the navigation started) when the first job row enters the table, and Playwright waits for that
   row to be visible. One uncounted paint first: the browser's first page also starts its
   renderer. Reports each paint, the median and the worst (target: under 1 s).
4. **Live updates**: with the jobs page open, the benchmark publishes job transitions on the log
   at each of ``--rates`` (transitions per second, for ``--seconds``): new jobs, each submitted,
   queued, scheduled and launching (four transitions in five events, the decider's), one
   transition every 1/rate seconds. The page's table follows
   ``/v1/jobs:follow``; a MutationObserver notes when each (job, state) first shows in a row. A job
   whose last transition the page showed is *kept up with*; the lag of a transition is the time it
   showed minus the time it was published (the same clock: one machine). The page may skip an
   intermediate state when its batch already carries the next one; skipped states are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, Page, async_playwright

from bench.api_bench import build_projection, emit, percentile, running_platform, template_events
from ffdl.adapters.bus import open_bus
from ffdl.adapters.tenants import TenantRegistry
from ffdl.core.job import Job, evolve
from ffdl.events.envelope import Event
from ffdl.handlers.messaging import Topics, event_records
from ffdl.wiring.config import Settings
from ffdl.wiring.logging import configure_logging

CHROMIUM = "/usr/bin/chromium"
FIRST_PAINT_TARGET_MS = 1000.0
#: How long after the last publication the page may take to show it before it counts as not kept up.
SETTLE_S = 5.0

#: Installed before the page's own scripts: the moment the first job row appears, and when each
#: (job, state) first shows in the table, in epoch milliseconds (comparable with the publisher's).
OBSERVE = """
window.__firstRow = null; window.__shown = {};
new MutationObserver(() => {
  const rows = document.querySelectorAll("#jobs-body tr[data-job]");
  if (rows.length && window.__firstRow === null) window.__firstRow = performance.now();
  const now = performance.timeOrigin + performance.now();
  for (const row of rows) {
    const key = row.dataset.job + " " + row.dataset.state;
    if (!(key in window.__shown)) window.__shown[key] = now;
  }
}).observe(document, { childList: true, subtree: true });
"""


async def open_jobs_page(browser: Browser, api: str, token: str) -> tuple[Page, float, float]:
    """A fresh context on the jobs page; returns it, the page's first-row time (ms since navigation)
    and the wall time from ``goto`` to the row visible as Playwright saw it."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    await context.add_init_script(f"sessionStorage.setItem('ffdl.token', {json.dumps(token)});")
    await context.add_init_script(OBSERVE)
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    started = time.perf_counter()
    await page.goto(f"{api}/#/jobs")
    await page.wait_for_selector("#jobs-body tr[data-job]", state="visible")
    wall_ms = (time.perf_counter() - started) * 1000
    first_row_ms = float(await page.evaluate("window.__firstRow"))
    if errors:
        raise RuntimeError(f"the page failed: {errors}")
    return page, first_row_ms, wall_ms


async def first_paints(browser: Browser, api: str, token: str, times: int) -> dict[str, Any]:
    paints, walls = [], []
    page, _, _ = await open_jobs_page(browser, api, token)  # not counted: the browser's first page
    await page.context.close()
    for _ in range(times):
        page, first_row_ms, wall_ms = await open_jobs_page(browser, api, token)
        paints.append(round(first_row_ms, 1))
        walls.append(round(wall_ms, 1))
        await page.context.close()
    return {
        "first_row_ms": paints,
        "goto_to_visible_ms": walls,
        "median_ms": round(statistics.median(paints), 1),
        "worst_ms": max(paints),
        "target_ms": FIRST_PAINT_TARGET_MS,
        "met": max(paints) < FIRST_PAINT_TARGET_MS,
    }


async def publish_at(
    settings: Settings, rate: float, seconds: float, run: str
) -> tuple[dict[tuple[str, str], float], str]:
    """Publish ``rate`` transitions a second for about ``seconds`` (whole jobs: submitted, queued,
    scheduled, launching); returns when each (job, state) was published, in epoch milliseconds, and
    the jobs' last state."""
    transitions: list[tuple[str, list[Event]]] = []
    job: Job | None = None
    for event in template_events(1):
        job = evolve(job, event)
        if transitions and transitions[-1][0] == str(job.state):
            transitions[-1][1].append(event)
        else:
            transitions.append((str(job.state), [event]))
    bus = open_bus(settings.bus_url, settings.partitions)
    await bus.start()
    topic = Topics.with_prefix(settings.topic_prefix).events
    published: dict[tuple[str, str], float] = {}
    started = time.perf_counter()
    try:
        for index in range(len(transitions) * max(1, round(rate * seconds / len(transitions)))):
            job_id = f"live-{run}-{index // len(transitions):06d}"
            state, events = transitions[index % len(transitions)]
            copies = [
                event.model_copy(update={"job_id": job_id, "tenant": "tenant-0", "event_id": uuid.uuid4()})
                for event in events
            ]
            await bus.publish(topic, event_records(copies, "bench"))
            published[(job_id, state)] = time.time() * 1000
            await asyncio.sleep(max(0.0, started + (index + 1) / rate - time.perf_counter()))
    finally:
        await bus.close()
    return published, transitions[-1][0]


async def live_updates(
    browser: Browser, settings: Settings, token: str, rate: float, seconds: float
) -> dict[str, Any]:
    page, _, _ = await open_jobs_page(browser, settings.api, token)
    await page.wait_for_selector("#live:has-text('Live')")
    started = time.perf_counter()
    published, final = await publish_at(settings, rate, seconds, f"{int(rate)}")
    elapsed = time.perf_counter() - started
    last = {job: at for (job, state), at in published.items() if state == final}
    deadline = time.perf_counter() + SETTLE_S
    shown: dict[str, float] = {}
    while time.perf_counter() < deadline:
        shown = await page.evaluate("window.__shown")
        if all(f"{job} {final}" in shown for job in last):
            break
        await asyncio.sleep(0.2)
    await page.context.close()
    lags = [
        shown[f"{job} {state}"] - at for (job, state), at in published.items() if f"{job} {state}" in shown
    ]
    kept = sum(f"{job} {final}" in shown for job in last)
    return {
        "rate_asked_per_s": rate,
        "rate_published_per_s": round(len(published) / elapsed, 1),
        "transitions": len(published),
        "jobs": len(last),
        "jobs_kept_up_with": kept,
        "transitions_shown": len(lags),
        "transitions_skipped": len(published) - len(lags),
        "lag_p50_ms": round(percentile(lags, 0.5), 1),
        "lag_p99_ms": round(percentile(lags, 0.99), 1),
        "lag_max_ms": round(max(lags, default=float("nan")), 1),
    }


async def measure(args: argparse.Namespace, data_dir: Path) -> None:
    started = time.perf_counter()
    build_projection(data_dir / "projections.sqlite", args.jobs)
    token = TenantRegistry(data_dir / "tenants.json").add("bench", admin=True)
    emit("setup", {"jobs": args.jobs, "projected_s": round(time.perf_counter() - started, 1)})
    emit("machine", {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]})
    api = f"http://127.0.0.1:{19000 + os.getpid() % 1000}"
    settings = Settings(data_dir=data_dir, api=api)
    env = {**os.environ, "FFDL_DATA_DIR": str(data_dir), "FFDL_API": api, "FFDL_LOG_LEVEL": "warning"}
    with running_platform(env, "api,projector"):
        async with async_playwright() as driver:
            browser = await driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            emit("first_paint", await first_paints(browser, api, token, args.paints))
            for rate in (float(r) for r in args.rates.split(",")):
                emit("live_updates", await live_updates(browser, settings, token, rate, args.seconds))
            await browser.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--paints", type=int, default=5, help="first paints, each a fresh context")
    parser.add_argument("--rates", default="50,100,200,400", help="transitions per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=10, help="of publishing at each rate")
    args = parser.parse_args()
    configure_logging(level="warning")
    with tempfile.TemporaryDirectory(prefix="ffdl-dashboard-bench-") as data_dir:
        asyncio.run(measure(args, Path(data_dir)))


if __name__ == "__main__":
    main()
