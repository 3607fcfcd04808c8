"""Text that is not Unicode through the in-process API: a lone UTF-16 surrogate (JSON's ``\\ud800``
without its pair, YAML's ``"\\uD800"``) anywhere in a manifest is a 422 naming the field, and a job
whose labels an older platform took with one is read back, never a 500.

Before, such an env value made the submission a 500, a label value was accepted and then made every
read of its job a 500 (for its tenant and for admins), and a label key was refused in a 422 that
could not be encoded: a 500 again.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import httpx
import pytest

from ffdl.adapters.tenants import TenantRegistry
from ffdl.api.app import create_app
from ffdl.events import job_events as ev
from ffdl.events.codec import event_to_json
from ffdl.events.model import JobSpec
from ffdl.handlers.ports import OutgoingRecord
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.job_history import folded_job
from tests.services import wait_until_async

pytestmark = pytest.mark.e2e

#: Labels as an older platform took them: lone surrogates in the values (the only text of a manifest
#: it let through with one).
OLD_LABELS = {"team": "\ud800", "owner": "a\udfffb"}


@pytest.fixture
def tokens(settings: Settings) -> dict[str, str]:
    registry = TenantRegistry(settings.tenants_path)
    return {"acme": registry.add("acme"), "root": registry.add("root", admin=True)}


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The API of a platform that projects the log, in process; a request that fails is its 500."""
    async with Platform(settings, frozenset({"api", "projector"})) as platform:
        transport = httpx.ASGITransport(app=create_app(platform), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://ffdl", timeout=30) as http:
            yield http


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def shown(response: httpx.Response) -> object:
    """The body as a strict client reads it: UTF-8, JSON; and holding no surrogate once parsed."""
    body = json.loads(response.content.decode("utf-8"))
    json.dumps(body, ensure_ascii=False).encode()
    return body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (rb'{"name":"j","command":"true","env":{"A":"\udfff"}}', "env.A"),
        (rb'{"name":"j","command":"true","env":{"A\udfff":"x"}}', "env.A\\udfff"),
        (rb'{"name":"j","command":"true","labels":{"team":"\ud800"}}', "labels.team"),
        (rb'{"name":"j","command":"true","labels":{"\ud800":"v"}}', "labels.\\ud800"),
        (rb'{"name":"j","command":"run \ud800"}', "command"),
        (rb'{"name":"j\ud800","command":"true"}', "name"),
        (rb'{"name":"j","command":"true","image":"\udc80"}', "image"),
        (rb'{"name":"j","command":"true","data_dir":"d/\ud800"}', "data_dir"),
        (b'name: j\ncommand: "true"\nlabels: {team: "\\uD800"}\n', "labels.team"),
        (b'name: j\nframework: {name: tf, command: "run \\uDFFF"}\n', "command"),
        (b'name: j\nframework: {name: tf, command: "true"}\ndescription: "\\uD800"\n', "labels.description"),
    ],
)
async def test_a_manifest_with_a_lone_surrogate_is_a_422_naming_the_field(
    settings: Settings, tokens: dict[str, str], body: bytes, field: str
) -> None:
    async with serving(settings) as http:
        response = await http.post("/v1/jobs", content=body, headers=bearer(tokens["acme"]))
        assert response.status_code == 422, response.text
        refused = shown(response)
        assert isinstance(refused, dict)
        assert field in [problem["field"] for problem in refused["detail"]]
        listed = await http.get("/v1/jobs", headers=bearer(tokens["root"]))
        assert shown(listed) == {"jobs": [], "next_cursor": None}


@pytest.fixture
async def old_job(settings: Settings) -> str:
    """The id of a job of acme's that an older platform took with lone surrogates in its labels,
    on the log before the platform starts."""
    spec = JobSpec(name="old", command="true", labels=OLD_LABELS)
    _, (submitted,) = folded_job(
        [ev.JobSubmitted(spec=spec)], datetime(2026, 1, 1, tzinfo=UTC), job_id="old-1", tenant="acme"
    )
    seeding = Platform(settings)
    await seeding.bus.start()
    await seeding.bus.publish(seeding.topics.events, [OutgoingRecord("old-1", event_to_json(submitted))])
    await seeding.bus.close()
    await seeding.heartbeats.close()
    return "old-1"


async def test_a_job_an_older_platform_took_with_a_lone_surrogate_is_read_back(
    settings: Settings, tokens: dict[str, str], old_job: str
) -> None:
    async with serving(settings) as http:

        async def listed() -> bool:
            response = await http.get("/v1/jobs", headers=bearer(tokens["root"]))
            return response.status_code == 200 and bool(response.json()["jobs"])

        await wait_until_async(listed, 30, what="the old job projected")
        for who in ("acme", "root"):
            for path in (
                "/v1/jobs",
                f"/v1/jobs/{old_job}",
                f"/v1/jobs/{old_job}/events",
                f"/v1/jobs/{old_job}/why",
            ):
                response = await http.get(path, headers=bearer(tokens[who]))
                assert response.status_code == 200, (who, path, response.text)
                json.loads(response.content.decode("utf-8"))
            job = (await http.get(f"/v1/jobs/{old_job}", headers=bearer(tokens[who]))).json()
            assert job["spec"]["labels"] == OLD_LABELS
