"""The status API as its consumers use it: tenancy, read-your-writes, follow, limits, metrics."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from ffdl.adapters.tenants import TenantRegistry
from ffdl.api.openapi import render
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import Api, manifest
from tests.services import wait_until_async

pytestmark = pytest.mark.e2e

QUICK = ["--steps", "8", "--delay", "0.02"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def submit_as(
    api: Api, token: str, name: str, args: list[str] = QUICK, *, gpus: int = 1
) -> dict[str, Any]:
    response = await api.http.post(
        "/v1/jobs",
        content=manifest(name, learners=1, gpus=gpus, args=args),
        headers={"Content-Type": "application/yaml", **bearer(token)},
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_every_request_needs_a_token_once_a_tenant_exists(api: Api, settings: Settings) -> None:
    token = TenantRegistry(settings.tenants_path).add("acme")
    assert (await api.http.get("/v1/jobs")).status_code == 401
    assert (await api.http.get("/v1/jobs", headers=bearer("ffdl_wrong"))).status_code == 401
    assert (await api.http.get("/v1/jobs", headers={"Authorization": token})).status_code == 401
    assert (await api.http.get("/v1/jobs", headers=bearer(token))).status_code == 200
    assert (await api.http.get("/healthz")).status_code == 200


async def test_tokens_are_stored_hashed(settings: Settings) -> None:
    token = TenantRegistry(settings.tenants_path).add("acme", admin=True)
    stored = settings.tenants_path.read_text()
    assert token not in stored and "token_sha256" in stored
    assert settings.tenants_path.stat().st_mode & 0o077 == 0


async def test_a_tenant_sees_and_touches_only_its_own_jobs(api: Api, settings: Settings) -> None:
    registry = TenantRegistry(settings.tenants_path)
    acme, globex, sre = registry.add("acme"), registry.add("globex"), registry.add("sre", admin=True)
    mine = await submit_as(api, acme, "acme-job", ["--steps", "400", "--delay", "0.05"])
    job_id = mine["job_id"]
    for method, path in (
        ("GET", f"/v1/jobs/{job_id}"),
        ("GET", f"/v1/jobs/{job_id}/events"),
        ("POST", f"/v1/jobs/{job_id}:halt"),
        ("POST", f"/v1/jobs/{job_id}:resume"),
        ("DELETE", f"/v1/jobs/{job_id}"),
        ("GET", f"/v1/jobs/{job_id}/logs"),
    ):
        response = await api.http.request(method, path, headers=bearer(globex))
        assert response.status_code == 404, (method, path, response.status_code)
    assert (await api.http.get("/v1/jobs", headers=bearer(globex))).json()["jobs"] == []
    assert (await api.http.get("/v1/jobs?tenant=acme", headers=bearer(globex))).json()["jobs"] == []
    own = (await api.http.get("/v1/jobs", headers=bearer(acme))).json()["jobs"]
    assert [j["job_id"] for j in own] == [job_id] and own[0]["tenant"] == "acme"
    everyone = (await api.http.get("/v1/jobs?tenant=acme", headers=bearer(sre))).json()["jobs"]
    assert [j["job_id"] for j in everyone] == [job_id]
    response = await api.http.delete(f"/v1/jobs/{job_id}", headers=bearer(sre))
    assert response.status_code == 202
    assert response.json()["state"] == "CANCELLED"


async def test_a_write_returns_the_position_its_reader_can_wait_for(api: Api) -> None:
    response = await api.http.post(
        "/v1/jobs",
        content=manifest("ryw", learners=1, args=QUICK),
        headers={"Content-Type": "application/yaml"},
    )
    body = response.json()
    partition, _, offset = body["position"].partition(":")
    assert partition.isdigit() and offset.isdigit()
    job = (await api.http.get(f"/v1/jobs/{body['job_id']}", params={"after": body["position"]})).json()
    assert job["seq"] >= 1
    listing = (await api.http.get("/v1/jobs", params={"after": body["position"]})).json()
    assert body["job_id"] in [j["job_id"] for j in listing["jobs"]]
    bad = await api.http.get("/v1/jobs", params={"after": "soon"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "after"


async def test_illegal_requests_get_409_with_the_reason(api: Api) -> None:
    job_id = await api.submit(manifest("done", learners=1, args=QUICK))
    await api.wait(job_id, "COMPLETED", released=True)
    response = await api.http.post(f"/v1/jobs/{job_id}:resume")
    assert response.status_code == 409
    assert "only a HALTED job can be resumed" in response.json()["detail"][0]["message"]


async def halt_again(api: Api, job_id: str) -> dict[str, Any]:
    """Halt a job that halts already: the owner decides it to nothing, and the API says so at once."""
    started = time.monotonic()
    response = await api.http.post(f"/v1/jobs/{job_id}:halt")
    assert time.monotonic() - started < 5  # a hang guard: the write's whole wait is 10 s
    assert response.status_code == 200, response.text
    body = dict(response.json())
    assert body["changed"] is False and body["position"] is None and "command_id" not in body
    return body


async def test_halting_a_job_again_changes_nothing_and_is_answered_at_once(api: Api) -> None:
    job_id = await api.submit(manifest("halt-twice", learners=1, args=["--steps", "400", "--delay", "0.05"]))
    await api.wait(job_id, "RUNNING")
    first = await api.http.post(f"/v1/jobs/{job_id}:halt")
    assert first.status_code == 202 and first.json()["changed"] is True, first.text
    assert (await halt_again(api, job_id))["state"] in ("HALTING", "HALTED")
    await api.wait(job_id, "HALTED", released=True)
    assert (await halt_again(api, job_id))["state"] == "HALTED"
    events = (await api.http.get(f"/v1/jobs/{job_id}/events")).json()["events"]
    assert [e["type"] for e in events].count("HaltRequested") == 1


async def test_cancel_refuses_an_ended_job_and_delete_removes_it_from_the_listings(api: Api) -> None:
    job_id = await api.submit(manifest("gone", learners=1, args=["--steps", "1000", "--delay", "0.05"]))
    await api.wait(job_id, "RUNNING")
    refused = await api.http.post(f"/v1/jobs/{job_id}:delete")
    assert refused.status_code == 409 and "cancel it first" in refused.text, refused.text
    assert (await api.http.delete(f"/v1/jobs/{job_id}")).status_code == 202
    await api.wait(job_id, "CANCELLED", released=True)
    # cancelling an ended job is refused and changes nothing: deleting is its own call
    cancelled = await api.http.delete(f"/v1/jobs/{job_id}")
    assert cancelled.status_code == 409, cancelled.text
    assert cancelled.json()["detail"] == [
        {
            "field": "state",
            "message": f"{job_id} has ended (CANCELLED): there is nothing to cancel; "
            f"`ffdl delete {job_id}` (POST /v1/jobs/{job_id}:delete) removes it from the listings",
        }
    ]
    events = (await api.http.get(f"/v1/jobs/{job_id}/events")).json()["events"]
    assert "JobDeleted" not in [e["type"] for e in events]
    assert (await api.http.post(f"/v1/jobs/{job_id}:delete")).status_code == 202
    await wait_until_async(lambda: _missing(api, job_id), 10, what="the job to leave the listings")
    assert job_id not in [j["job_id"] for j in (await api.http.get("/v1/jobs")).json()["jobs"]]


async def _missing(api: Api, job_id: str) -> bool:
    return (await api.http.get(f"/v1/jobs/{job_id}")).status_code == 404


async def test_follow_streams_every_event_with_its_seq_and_resumes_from_last_event_id(api: Api) -> None:
    job_id = await api.submit(manifest("follow", learners=1, args=QUICK))
    seen: list[int] = []
    async with api.http.stream("GET", f"/v1/jobs/{job_id}/events", params={"follow": "true"}) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        async for line in stream.aiter_lines():
            if line.startswith("id: "):
                seen.append(int(line[4:]))
    assert seen == list(range(1, len(seen) + 1))
    history = (await api.http.get(f"/v1/jobs/{job_id}/events")).json()["events"]
    assert [e["type"] for e in history][-1] in ("GpusReleased", "JobCompleted")
    assert len(seen) == len(history)
    resumed: list[int] = []
    headers = {"Last-Event-ID": str(seen[4])}
    async with api.http.stream("GET", f"/v1/jobs/{job_id}/events?follow=true", headers=headers) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("id: "):
                resumed.append(int(line[4:]))
    assert resumed == seen[5:]


async def test_a_vanished_follower_releases_its_stream(api: Api, platform: Platform) -> None:
    job_id = await api.submit(manifest("long", learners=1, args=["--steps", "1000", "--delay", "0.05"]))
    followers = _app_state(api).backend.followers
    async with api.http.stream("GET", f"/v1/jobs/{job_id}/events?follow=true") as stream:
        async for line in stream.aiter_lines():
            if line.startswith("id: 1"):
                break
        await wait_until_async(lambda: followers.open == 1, 5, what="one follower")
    await wait_until_async(lambda: followers.open == 0, 10, what="the follower's stream to close")
    await api.http.delete(f"/v1/jobs/{job_id}")


def _app_state(api: Api) -> Any:
    return api.app.state


async def test_limits_and_bad_parameters_answer_4xx_naming_the_field(api: Api) -> None:
    too_big = await api.http.post(
        "/v1/jobs", content=b"x" * (300 * 1024), headers={"Content-Type": "application/yaml"}
    )
    assert too_big.status_code == 413
    bad_limit = await api.http.get("/v1/jobs", params={"limit": 0})
    assert bad_limit.status_code == 422 and bad_limit.json()["detail"][0]["field"] == "limit"
    bad_label = await api.http.get("/v1/jobs", params={"label": "nolabel"})
    assert bad_label.status_code == 422 and bad_label.json()["detail"][0]["field"] == "label"
    bad_time = await api.http.get("/v1/jobs", params={"submitted_since": "yesterday"})
    assert bad_time.status_code == 422 and bad_time.json()["detail"][0]["field"] == "submitted_since"
    unwritable = await api.http.get("/v1/jobs", params={"submitted_until": "0001-01-01T00:00:00+05:00"})
    assert unwritable.status_code == 422, "before year 1 in UTC: no time, not a 500"
    assert unwritable.json()["detail"][0]["field"] == "submitted_until"


async def test_list_filters_and_pages_with_a_cursor(api: Api) -> None:
    ids = [
        await api.submit(
            manifest(f"page-{i}", learners=1, args=QUICK, labels={"batch": "b1" if i % 2 else "b2"})
        )
        for i in range(5)
    ]
    for job_id in ids:
        await api.wait(job_id, "COMPLETED", released=True)
    pages: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, "order": "oldest"}
        if cursor:
            params["cursor"] = cursor
        body = (await api.http.get("/v1/jobs", params=params)).json()
        pages.extend(j["job_id"] for j in body["jobs"])
        cursor = body["next_cursor"]
        if not cursor:
            break
    assert pages == ids
    labelled = (await api.http.get("/v1/jobs", params={"label": "batch=b1"})).json()["jobs"]
    assert {j["job_id"] for j in labelled} == {ids[1], ids[3]}
    completed = (await api.http.get("/v1/jobs", params={"state": "completed"})).json()["jobs"]
    assert len(completed) == 5
    # submitted since the third job, in UTC to the millisecond or at another offset: both the same
    # instant, though neither is the text the projection keeps ("...:05.123456+00:00")
    third = datetime.fromisoformat((await api.job(ids[2]))["submitted_at"])
    for since in (
        third.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        third.astimezone(timezone(timedelta(hours=2))).isoformat(),
    ):
        params = {"submitted_since": since, "order": "oldest"}
        body = (await api.http.get("/v1/jobs", params=params)).json()
        assert [j["job_id"] for j in body["jobs"]] == ids[2:], since


async def test_job_detail_shows_heartbeats_cluster_queues_metrics_and_readiness(api: Api) -> None:
    job_id = await api.submit(manifest("detail", learners=2, args=["--steps", "1000", "--delay", "0.05"]))
    running = await api.wait_for(
        job_id,
        lambda j: j["state"] == "RUNNING" and all(learner["heartbeat"]["alive"] for learner in j["learners"]),
        "heartbeats",
    )
    assert all(learner["heartbeat"]["last_progress_age_s"] < 5 for learner in running["learners"])
    assert all(learner["node"] == "node-a" and len(learner["gpus"]) == 1 for learner in running["learners"])
    cluster = (await api.http.get("/v1/cluster")).json()
    assert cluster["gpus_total"] == 4 and cluster["gpus_allocated"] == 2
    assert set(cluster["nodes"][0]["allocated"].values()) == {job_id}
    assert (await api.http.get("/v1/queues")).json()["length"] == 0
    metrics = (await api.http.get("/metrics")).text
    assert 'ffdl_jobs{state="RUNNING",tenant="default"} 1.0' in metrics
    assert 'ffdl_gpus{status="allocated"} 2.0' in metrics
    assert "ffdl_event_to_projection_seconds_bucket" in metrics and "ffdl_projection_lag_events" in metrics
    await wait_until_async(lambda: _ready(api), 10, what="readiness")
    await api.http.delete(f"/v1/jobs/{job_id}")


async def _ready(api: Api) -> bool:
    return (await api.http.get("/readyz")).status_code == 200


async def test_the_exported_openapi_document_is_current() -> None:
    from pathlib import Path

    committed = Path(__file__).parents[2] / "docs" / "openapi.json"
    assert json.loads(committed.read_text()) == json.loads(render()), (
        "the API changed: run `python -m ffdl.api.openapi` and commit docs/openapi.json"
    )


async def test_the_api_never_answers_5xx_to_generated_requests(api: Api, platform: Platform) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_dict(api.app.openapi())
    failures: list[str] = []
    calls: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith(("/events", "/logs", ":follow")):
            continue  # streaming routes: exercised by the follow tests above

        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def check(case: Any) -> None:
            response = case.call(base_url=platform.settings.api, timeout=30)
            calls.append(case.operation.path)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text}"
                )

        await asyncio.to_thread(check)
    assert failures == []
    assert len(set(calls)) >= 8, "every non-streaming route was exercised"
