"""A write the owner dead-letters is answered through the API with the owner's refusal, on the
embedded log and on Kafka (tansu).

The owner refuses some commands by dead-lettering them instead of recording a ``CommandRejected``
event (one that would create a job it may not create, docs/security.md "What the owner does with a
refusal"). The API checks what it can before it sends, but the owner has the last word: an operator
who lowers a tenant's priority ceiling while the tenant's submission is on its way makes the owner
refuse a submission the API let through. Before, the API saw the owners commit past the command and
no event caused by it, and answered 200 ``changed: false`` with no job: success, for a refusal.

Where an operator lets bodies be larger than the default (``FFDL_MAX_REQUEST_BYTES``), a tenant can
send a manifest whose command, written as the log writes JSON (every character beyond ASCII escaped,
an emoji as 12 bytes), is over the log's record limit, or fits while the event it decides does not.
The first was a 500 (the log refused the API's append); the second was dead-lettered by the owner
as a head without the command's headers, and answered 200 ``changed: false``. Both are 413 now.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from ffdl.adapters.tenants import OPEN, TenantRegistry
from ffdl.api.app import create_app
from ffdl.core.kinds import JOBS
from ffdl.events import job_commands as cmd
from ffdl.events.codec import command_headers, command_to_json
from ffdl.events.model import JobSpec
from ffdl.handlers.messaging import PRINCIPAL_HEADER
from ffdl.handlers.ports import MAX_RECORD_BYTES, OutgoingRecord, record_size
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import bus_under_test, fast_settings, manifest
from tests.services import wait_until_async

pytestmark = pytest.mark.integration


@pytest.fixture(params=["embedded", "kafka"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return fast_settings(tmp_path / "ffdl", max_request_bytes=512 * 1024, **bus_under_test(request))


@asynccontextmanager
async def serving(
    settings: Settings, roles: frozenset[str] = frozenset({"api", "projector"}), *, open_api: bool = False
) -> AsyncIterator[tuple[Platform, httpx.AsyncClient]]:
    """The API and its projection (by default with no owner deciding), in process; a request that
    fails is its 500."""
    async with Platform(settings, roles) as platform:
        app = create_app(platform, open_api=open_api)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://ffdl", timeout=60) as http:
            yield platform, http


async def on_the_log(platform: Platform) -> bool:
    return any((await platform.bus.end_offsets(platform.topics.commands)).values())


async def test_a_submission_the_owner_dead_letters_is_answered_with_its_refusal(settings: Settings) -> None:
    registry = TenantRegistry(settings.tenants_path)
    token = registry.add("acme", max_priority=100)
    async with serving(settings) as (platform, http):
        answer = asyncio.create_task(
            http.post(
                "/v1/jobs",
                content=manifest("urgent", learners=1, priority=50),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"},
            )
        )
        # the API let it through (50 is under the ceiling of 100) and sent it: the operator lowers
        # the ceiling before any owner decides it
        await wait_until_async(lambda: on_the_log(platform), 30, what="the submission on the log")
        registry.set_max_priority("acme", 10)
        async with Platform(settings, frozenset({"workers"})):
            response = await asyncio.wait_for(answer, 60)
        jobs = (await http.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})).json()["jobs"]
    assert jobs == []  # nothing was submitted
    assert response.status_code == 403, response.text
    [problem] = response.json()["detail"]
    assert "above the ceiling of tenant 'acme'" in problem["message"], problem


#: About 1 MB of JSON on the log from about 360 KB of manifest: 256 labels of 256 emoji (12 bytes
#: each escaped), and 64,000 bytes of emoji in the env.
LABELS = {f"k{i:03d}" + "x" * 59: "\U0001f600" * 256 for i in range(256)}
ENV = {f"E{i:02d}": "\U0001f600" * 1000 for i in range(16)}


def submission_size(platform: Platform, spec: JobSpec) -> int:
    """What the open API's ``SubmitJob`` of ``spec`` weighs on the log (as ``CommandSender`` sends it)."""
    to = JOBS.address(f"{spec.name}-0123abcd", OPEN.tenant)
    command = platform.sender.make(to, cmd.SubmitJob(spec=spec))
    principal = (PRINCIPAL_HEADER, str(OPEN.on_the_log()).encode())
    headers = (*command_headers(command, platform.sender.producer), principal)
    return record_size(OutgoingRecord(command.key, command_to_json(command), headers))


def sized(platform: Platform, size: int) -> JobSpec:
    """A spec whose submission weighs ``size`` bytes (within the few a timestamp's microseconds take)."""
    spec = JobSpec(name="big", command="true ", labels=LABELS, env=ENV)
    emoji, pad = divmod(size - submission_size(platform, spec), 12)
    assert 0 <= emoji <= 8000, emoji
    padded = spec.model_copy(update={"command": "true " + "\U0001f600" * emoji + "a" * pad})
    assert abs(submission_size(platform, padded) - size) <= 8
    return padded


async def submit(http: httpx.AsyncClient, spec: JobSpec) -> httpx.Response:
    body = json.dumps(spec.model_dump(mode="json", exclude_defaults=True), ensure_ascii=False).encode()
    return await http.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})


async def test_a_submission_the_log_cannot_hold_is_413_naming_the_body(settings: Settings) -> None:
    async with serving(settings, open_api=True) as (platform, http):
        response = await submit(http, sized(platform, MAX_RECORD_BYTES + 100))
    assert response.status_code == 413, response.text
    [problem] = response.json()["detail"]
    assert problem["field"] == "(body)"
    assert str(MAX_RECORD_BYTES) in problem["message"], problem


async def test_a_submission_whose_event_the_log_cannot_hold_is_413_with_the_owners_reason(
    settings: Settings,
) -> None:
    """The event the owner decides is about 100 bytes larger than the command (its ids and times):
    a command just under the limit decides one over it, which the owner dead-letters, parked as a
    head since the command and the reason do not fit one record."""
    roles = frozenset({"api", "projector", "workers"})
    async with serving(settings, roles, open_api=True) as (platform, http):
        response = await submit(http, sized(platform, MAX_RECORD_BYTES - 40))
        jobs = (await http.get("/v1/jobs")).json()["jobs"]
        topic = platform.topics.deadletter
        [parked] = [r for p in range(settings.partitions) async for r in platform.bus.read(topic, p)]
    assert jobs == []
    assert "ffdl_dlq_truncated_from" in dict(parked.headers)  # a head, which keeps the command's id
    assert response.status_code == 413, response.text
    [problem] = response.json()["detail"]
    assert problem["field"] == "(body)"
    assert "SubmitJob decided an event of" in problem["message"], problem
