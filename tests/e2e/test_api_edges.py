"""The HTTP API's edges against a hostile client, on the real platform and a real server: every
cursor and position a client sends back is bounded, the job list's live stream shows a tenant only
its own jobs, the server closes connections that never finish their headers, every response carries
the browser's security headers, no page loads code from elsewhere, readiness details are an
admin's, and a tenant's jobs stay under its priority ceiling.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ffdl.adapters.tenants import TenantRegistry
from ffdl.api.dependencies import MAX_OFFSET
from ffdl.api.routes import dashboard
from ffdl.api.routes import jobs as job_routes
from ffdl.projections.store import KeptLogChanged
from ffdl.wiring.config import SchedulerConfig, Settings
from tests.harness import Api, fast_settings, manifest

pytestmark = pytest.mark.e2e

HUGE = str(10**23)
QUICK = ["--steps", "2"]


@pytest.fixture
async def settings(tmp_path: Path) -> Settings:
    return fast_settings(
        tmp_path / "ffdl",
        api_header_timeout_s=1.0,
        api_max_connections=64,
        scheduler=SchedulerConfig(preemption=False),
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def refused(response: httpx.Response, status: int, field: str) -> None:
    assert response.status_code == status, response.text
    fields = [problem["field"] for problem in response.json()["detail"]]
    assert field in fields, fields


async def first_event(
    api: Api, path: str, headers: dict[str, str] | dict[bytes, bytes] | None = None
) -> httpx.Response:
    """The response of a stream, read up to its first event (a refused one whole)."""
    async with api.http.stream("GET", path, headers=headers) as response:
        if response.status_code == 200:
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    break
        else:
            await response.aread()
        return response


async def test_every_cursor_and_position_out_of_range_is_a_4xx_naming_it(api: Api) -> None:
    job_id = await api.submit(manifest("cursors", learners=1, args=QUICK))
    await api.wait(job_id, "COMPLETED", released=True)
    for value in (HUGE, str(MAX_OFFSET + 1), "-1", "1e9", "\u00b2"):
        for path in ("/v1/jobs:follow", f"/v1/jobs/{job_id}/events?follow=true"):
            response = await first_event(api, path, {b"Last-Event-ID": value.encode("latin-1")})
            refused(response, 422, "Last-Event-ID")
        refused(await first_event(api, f"/v1/jobs:follow?after={value}"), 422, "after")
        refused(
            await api.http.get(f"/v1/jobs/{job_id}/events", params={"after_seq": value}), 422, "after_seq"
        )
        for field, maximum in (("rank", 1023), ("attempt", 10**6), ("tail", 10**5)):
            big = value if value != str(MAX_OFFSET + 1) else str(maximum + 1)
            logs = await api.http.get(f"/v1/jobs/{job_id}/logs", params={field: big})
            refused(logs, 422, field)
        refused(await api.http.get("/v1/jobs", params={"limit": value}), 422, "limit")
        for path in (
            "/v1/jobs",
            f"/v1/jobs/{job_id}",
            f"/v1/jobs/{job_id}/why",
            "/v1/nodes",
            "/v1/nodes/node-a",
        ):
            for after in (f"0:{value}", f"{value}:0"):
                refused(await api.http.get(path, params={"after": after}), 422, "after")
    for at in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", f"{HUGE}-01-01"):
        response = await api.http.get("/v1/timemachine", params={"at": at})
        assert response.status_code in (200, 422), response.text
        if response.status_code == 422:
            refused(response, 422, "at")
    for at in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        listed = await api.http.get("/v1/jobs", params={"submitted_since": at, "submitted_until": at})
        assert listed.status_code in (200, 422), listed.text
    cursor = await api.http.get("/v1/jobs", params={"cursor": f"{HUGE}|{HUGE}", "limit": 1})
    assert cursor.status_code == 200 and cursor.json()["jobs"] == []
    # in range, a cursor still works: the follow from the beginning shows the job
    events = await first_event(api, f"/v1/jobs/{job_id}/events?follow=true", {"Last-Event-ID": "0"})
    assert events.status_code == 200


async def follow_once(api: Api, token: str, after: int = 0) -> list[dict[str, object]]:
    """What ``token``'s tenant is shown by ``/v1/jobs:follow`` from ``after`` until its first
    keep-alive (all that has happened so far): each ``jobs`` event's data."""
    shown: list[dict[str, object]] = []
    async with api.http.stream("GET", f"/v1/jobs:follow?after={after}", headers=bearer(token)) as stream:
        assert stream.status_code == 200
        async for line in stream.aiter_lines():
            if line.startswith("data:") and line != "data: {}":
                shown.append(json.loads(line.removeprefix("data:")))
            if line.startswith(": keep-alive"):
                break
    return shown


async def test_the_live_job_list_shows_a_tenant_only_its_own_gone_jobs(api: Api, settings: Settings) -> None:
    registry = TenantRegistry(settings.tenants_path)
    acme, globex = registry.add("acme"), registry.add("globex")
    submitted = {}
    for token in (acme, globex):
        response = await api.http.post(
            "/v1/jobs", content=manifest("gone", learners=1, args=QUICK), headers=bearer(token)
        )
        assert response.status_code == 201, response.text
        submitted[token] = response.json()["job_id"]
    sre = registry.add("sre", admin=True)
    async with httpx.AsyncClient(base_url=str(api.http.base_url), headers=bearer(sre), timeout=30) as admin:
        as_admin = Api(admin, api.app)
        for token, job_id in submitted.items():
            await as_admin.wait(job_id, "COMPLETED", released=True)
            deleted = await api.http.post(f"/v1/jobs/{job_id}:delete", headers=bearer(token))
            assert deleted.status_code in (200, 202), deleted.text
    for token, other in ((acme, globex), (globex, acme)):
        shown = await follow_once(api, token)
        text = json.dumps(shown)
        assert submitted[other] not in text, f"{other}'s job shown to another tenant"
        gone = [job_id for batch in shown for job_id in batch["gone"]]  # type: ignore[attr-defined]
        assert gone == [submitted[token]], shown
    everything = await follow_once(api, sre)
    gone_for_admin = {job_id for batch in everything for job_id in batch["gone"]}  # type: ignore[attr-defined]
    assert gone_for_admin == set(submitted.values())


async def half_open(api: Api, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``count`` connections that each sent a request line and one header, and no more."""
    url = httpx.URL(str(api.http.base_url))
    connections = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(url.host, url.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        await writer.drain()
        connections.append((reader, writer))
    return connections


async def closed_by_server(reader: asyncio.StreamReader, within_s: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), within_s) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def test_connections_that_never_finish_their_headers_are_closed(api: Api, settings: Settings) -> None:
    slow = await half_open(api, 200)
    started = time.monotonic()
    try:
        closed = await asyncio.gather(*(closed_by_server(reader, 10) for reader, _ in slow))
    finally:
        for _, writer in slow:
            writer.close()
    assert all(closed), f"{closed.count(False)} of 200 half-sent requests still open after 10 s"
    assert time.monotonic() - started < 10
    # a client that trickles a byte at a time is held to the same deadline
    url = httpx.URL(str(api.http.base_url))
    reader, writer = await asyncio.open_connection(url.host, url.port)
    started = time.monotonic()
    try:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n":
            if reader.at_eof() or writer.is_closing():
                break
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)
    except ConnectionError:
        pass
    assert await closed_by_server(reader, 5)
    writer.close()
    assert time.monotonic() - started < 5
    # and the server still answers
    assert (await api.http.get("/healthz")).status_code == 200


async def test_connections_past_the_limit_are_closed_and_the_server_serves_again(
    api: Api, settings: Settings
) -> None:
    held = await half_open(api, settings.api_max_connections)
    try:
        extra = await half_open(api, 1)
        assert await closed_by_server(extra[0][0], 0.5), "a connection past the limit was kept open"
        extra[0][1].close()
    finally:
        for _, writer in held:
            writer.close()
    for _ in range(50):
        try:
            if (await api.http.get("/healthz")).status_code == 200:
                break
        except httpx.TransportError:
            await asyncio.sleep(0.05)
    assert (await api.http.get("/healthz")).status_code == 200


SECURITY_HEADERS = ("content-security-policy", "x-frame-options", "x-content-type-options", "referrer-policy")


async def test_every_response_carries_the_security_headers(api: Api) -> None:
    for path in (
        "/",
        "/ui/app.js",
        "/ui/style.css",
        "/ui/vendor/uPlot.iife.min.js",
        "/v1/jobs",
        "/healthz",
        "/nope",
    ):
        response = await api.http.get(path)
        for name in SECURITY_HEADERS:
            assert name in response.headers, (path, name)
        csp = response.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, csp
        assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"


async def test_no_page_loads_code_from_elsewhere(api: Api) -> None:
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        response = await api.http.get(path)
        assert response.status_code == 404, (path, response.text[:200])
        assert "cdn" not in response.text.lower()
    page = await api.http.get("/")
    assert page.status_code == 200 and "https://" not in page.text and "http://" not in page.text
    assert (await api.http.get("/openapi.json")).status_code == 200, "the document itself stays"


async def test_readiness_details_are_for_admins(api: Api, settings: Settings) -> None:
    registry = TenantRegistry(settings.tenants_path)
    acme, sre = registry.add("acme"), registry.add("sre", admin=True)
    for headers in ({}, bearer(acme), bearer("not-a-token")):
        response = await api.http.get("/readyz", headers=headers)
        assert response.status_code in (200, 503)
        assert set(response.json()) == {"ready"}, response.text
    detailed = await api.http.get("/readyz", headers=bearer(sre))
    assert detailed.status_code in (200, 503) and "behind" in detailed.json()


async def test_a_tenants_priority_is_held_under_its_ceiling(api: Api, settings: Settings) -> None:
    registry = TenantRegistry(settings.tenants_path)
    acme, sre = registry.add("acme"), registry.add("sre", admin=True)
    ceiling = registry.max_priority("acme")
    assert ceiling is not None
    over = manifest("greedy", learners=1, args=QUICK, priority=ceiling + 1)
    refused(await api.http.post("/v1/jobs", content=over, headers=bearer(acme)), 403, "priority")
    at = manifest("fair", learners=1, args=QUICK, priority=ceiling)
    assert (await api.http.post("/v1/jobs", content=at, headers=bearer(acme))).status_code == 201
    registry.set_max_priority("acme", 1000)
    top = manifest("urgent", learners=1, args=QUICK, priority=1000)
    assert (await api.http.post("/v1/jobs", content=top, headers=bearer(acme))).status_code == 201
    admins = manifest("admins", learners=1, args=QUICK, priority=1000)
    assert (await api.http.post("/v1/jobs", content=admins, headers=bearer(sre))).status_code == 201


async def test_the_time_machine_folds_one_moment_at_a_time_and_the_same_moment_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each fold reads the whole log: requests take turns (a tenant asking in a loop costs the API
    one fold at a time) and the same moment of an unchanged log is folded once for all of them."""
    job_id = await api.submit(manifest("folded", learners=1, args=QUICK))
    await api.wait(job_id, "COMPLETED", released=True)
    folding = {"now": 0, "most": 0, "folds": 0}
    real = dashboard.kept_picture

    def counted(kept: Any, at_end: Any, moment: Any) -> Any:
        folding["folds"] += 1
        folding["now"] += 1
        folding["most"] = max(folding["most"], folding["now"])
        try:
            time.sleep(0.05)  # long enough for the other requests to arrive meanwhile
            return real(kept, at_end, moment)
        finally:
            folding["now"] -= 1

    monkeypatch.setattr(dashboard, "kept_picture", counted)
    at = {"at": "2999-01-01T00:00:00+00:00"}
    responses = await asyncio.gather(*(api.http.get("/v1/timemachine", params=at) for _ in range(6)))

    assert [response.status_code for response in responses] == [200] * 6
    assert {json.dumps(response.json(), sort_keys=True) for response in responses} == {
        json.dumps(responses[0].json(), sort_keys=True)
    }
    assert folding["most"] == 1, "one fold at a time"
    assert folding["folds"] < 6, "the moment folded once while the log stood still"


async def test_a_tenant_asking_the_time_machine_for_many_moments_at_once_is_refused_past_a_few(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new moment is a fold of the whole log, and folds take turns: a tenant asking for a new
    microsecond each time, many at once, queued folds that kept every other tenant waiting."""
    release = threading.Event()
    real = dashboard.kept_picture

    def held(kept: Any, at_end: Any, moment: Any) -> Any:
        release.wait(30)
        return real(kept, at_end, moment)

    monkeypatch.setattr(dashboard, "kept_picture", held)
    moments = [f"2999-01-0{day}T00:00:00+00:00" for day in range(1, dashboard.FOLDS_WAITING_PER_TENANT + 2)]
    asked = [asyncio.create_task(api.http.get("/v1/timemachine", params={"at": at})) for at in moments]
    try:
        done, waiting = await asyncio.wait(asked, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    finally:
        release.set()
    answered = await asyncio.gather(*waiting)
    assert [task.result().status_code for task in done] == [429]
    assert done.pop().result().headers["retry-after"] == "1"
    assert [response.status_code for response in answered] == [200] * dashboard.FOLDS_WAITING_PER_TENANT


async def test_the_time_machine_answers_moments_at_the_edges_of_time_without_a_500(api: Api) -> None:
    """A tenant's moment is turned into an instant to compare with the kept log's: the first and
    last instants a time can name, with the widest offsets or none, are moments before the log or
    after it, never an error of the server; a moment that is no time is a 422."""
    job_id = await api.submit(manifest("edges", learners=1, args=QUICK))
    await api.wait(job_id, "COMPLETED", released=True)
    for at in ("0001-01-01T00:00:00+14:00", "0001-01-01T00:00:00", "9999-12-31T23:59:59.999999-14:00"):
        answer = await api.http.get("/v1/timemachine", params={"at": at})
        assert answer.status_code == 200, (at, answer.text)
        picture = answer.json()
        before = at.startswith("0001")
        assert (picture["previous_event"] is None) == before and (picture["next_event"] is None) != before
        assert [job["state"] for job in picture["jobs"]] == ([] if before else ["COMPLETED"])
    refused = await api.http.get("/v1/timemachine", params={"at": "yesterday"})
    assert refused.status_code == 422


async def test_a_projection_rebuilt_while_the_time_machine_reads_it_is_a_503_to_ask_again(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The time machine checks each row it decodes is the event it read, and reads a replaced file
    afresh; one replaced again meanwhile answers 503 with Retry-After, never a picture of rows
    taken for other events."""

    def rebuilt(kept: Any, at_end: Any, moment: Any) -> Any:
        raise KeptLogChanged("row 7 of the projection's history is not the event read at 0:6")

    monkeypatch.setattr(dashboard, "kept_picture", rebuilt)
    response = await api.http.get("/v1/timemachine")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert "ask again" in response.text and "row 7" not in response.text


async def test_pages_end_at_their_bytes_and_events_and_odd_filters_are_4xx(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's documents of a megabyte each (labels, learners), 150 to a page, once held every
    other tenant's requests for seconds; a job's history a tenant grew to 30,000 events came in one
    answer of 16 MB."""
    job_ids = [await api.submit(manifest(f"paged{index}", learners=1, args=QUICK)) for index in range(3)]
    for job_id in job_ids:
        await api.wait(job_id, "COMPLETED", released=True)
    monkeypatch.setattr(job_routes, "PAGE_BYTES", 1)  # every page ends after its first document

    listed: list[str] = []
    cursor = None
    while True:
        page = (
            await api.http.get(
                "/v1/jobs", params={"order": "oldest", **({"cursor": cursor} if cursor else {})}
            )
        ).json()
        assert len(page["jobs"]) <= 1
        listed += [job["job_id"] for job in page["jobs"]]
        if (cursor := page["next_cursor"]) is None:
            break
    assert listed == job_ids

    whole = (await api.http.get(f"/v1/jobs/{job_ids[0]}/events")).json()
    assert whole["next_after_seq"] is None and len(whole["events"]) > 2
    paged: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = (
            await api.http.get(f"/v1/jobs/{job_ids[0]}/events", params={"after_seq": after, "limit": 2})
        ).json()
        paged += page["events"]
        after = page["next_after_seq"]
    assert paged == whole["events"]

    refused(await api.http.get("/v1/jobs", params={"label": "\0=1"}), 422, "label")
    assert (await api.http.get("/ui/a%00b")).status_code == 404
