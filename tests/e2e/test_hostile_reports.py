"""What a hostile learner reports cannot stall the monitor, break the read side or plant a checkpoint.

On Kubernetes the learner agent runs in the tenant's pod with the job's heartbeat login, so the
tests here write the job's heartbeat key directly, as such an agent would: 40,000 metric names, a
``NaN`` loss, checkpoints outside the job's checkpoint place. The platform runs on the embedded
defaults, with real learner processes (docs/security.md, "What a learner reports").
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ffdl.cli.main import app
from ffdl.events.codec import event_to_dict
from ffdl.events.reports import MAX_METRICS
from ffdl.handlers.heartbeat_keys import learner_key
from ffdl.handlers.ports import OutgoingRecord
from ffdl.tools.log_files import read_log
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.golden.record import GOLDEN_DIR
from tests.harness import Api, manifest
from tests.services import wait_until_async

pytestmark = pytest.mark.e2e

#: A learner that reports nothing and stays alive: whatever its key holds is what the test forged.
QUIET = "sleep 300"


def strict_loads(text: str | bytes) -> Any:
    """JSON as a browser's ``JSON.parse`` reads it: ``NaN`` and ``Infinity`` are no JSON."""

    def refuse(token: str) -> None:
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


async def forge_beat(platform: Platform, job_id: str, **fields: Any) -> None:
    """Write the job's rank-0 heartbeat as a hostile agent holding the job's heartbeat login would."""
    now = time.time()
    beat = {"attempt": 1, "pid": 4242, "host": "forged", "last_progress": now, "started_at": now, **fields}
    await platform.heartbeats.put(
        learner_key(job_id, 0), json.dumps(beat).encode()
    )  # NaN as Python writes it


async def quiet_job(api: Api, name: str) -> str:
    job_id = await api.submit(f"name: {name}\nlearners: 1\ngpus: 1\ncommand: {QUIET}\n")
    await api.wait(job_id, "RUNNING")
    return job_id


async def history(api: Api, job_id: str) -> list[dict[str, Any]]:
    response = await api.http.get(f"/v1/jobs/{job_id}/events")
    assert response.status_code == 200, response.text
    return list(strict_loads(response.content)["events"])


async def test_forty_thousand_metrics_hold_up_no_other_jobs_observations(
    api: Api, platform: Platform
) -> None:
    hostile = await quiet_job(api, "hostile")
    # ~1.3 MB of metrics: a command carrying them would be larger than the log accepts
    metrics = {f"pwned_metric_number_{index:06d}": 1.0 for index in range(40_000)}
    await forge_beat(platform, hostile, step=7, metrics=metrics)

    # another job's learners are observed as usual: started, progressing, exited, to the end
    other = await api.submit(manifest("other", learners=2, args=["--steps", "10", "--delay", "0.02"]))
    done = await api.wait(other, "COMPLETED", timeout_s=60)

    assert [learner["step"] for learner in done["learners"]] == [10, 10]
    assert (await api.job(hostile))["learners"][0]["metrics"] == {}  # the oversized beat was refused whole
    await api.http.delete(f"/v1/jobs/{hostile}")


async def test_a_report_beyond_the_bounds_is_cut_and_the_job_says_why(api: Api, platform: Platform) -> None:
    job_id = await quiet_job(api, "cut")
    metrics: dict[str, Any] = {f"m{index:04d}": float(index) for index in range(1_000)}
    metrics |= {"loss": float("nan"), "lr": float("inf"), "x" * 65: 1.0, "flag": True}
    await forge_beat(platform, job_id, step=3, metrics=metrics)

    job = await api.wait_for(job_id, lambda job: job["learners"][0]["step"] == 3, "the cut report")

    assert job["learners"][0]["metrics"] == {f"m{index:04d}": float(index) for index in range(MAX_METRICS)}
    (progressed,) = [event for event in await history(api, job_id) if event["type"] == "LearnerProgressed"]
    reasons = progressed["data"]["dropped"]
    assert "metric 'loss' is not finite (nan)" in reasons
    assert "metric 'lr' is not finite (inf)" in reasons
    assert f"{1_000 - MAX_METRICS} metrics over the limit of {MAX_METRICS} dropped" in reasons
    await api.http.delete(f"/v1/jobs/{job_id}")


async def every_read(api: Api, job_id: str) -> list[Any]:
    """The job list, the job, its events and its event stream to the end, each parsed strictly."""
    bodies = []
    for path in ("/v1/jobs", f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/events"):
        response = await api.http.get(path)
        assert response.status_code == 200, (path, response.text)
        bodies.append(strict_loads(response.content))
    async with api.http.stream("GET", f"/v1/jobs/{job_id}/events", params={"follow": "true"}) as stream:
        assert stream.status_code == 200
        bodies += [
            strict_loads(line[len("data: ") :])
            async for line in stream.aiter_lines()
            if line.startswith("data: ")
        ]
    return bodies


async def test_a_nan_loss_leaves_every_read_strict_json(api: Api, platform: Platform) -> None:
    job_id = await quiet_job(api, "diverged")
    await forge_beat(platform, job_id, step=5, metrics={"loss": float("nan"), "acc": 0.25})
    await api.wait_for(job_id, lambda job: job["learners"][0]["step"] == 5, "the diverged report")
    await api.http.delete(f"/v1/jobs/{job_id}")
    await api.wait(job_id, "CANCELLED", released=True)

    listed, job, events, *streamed = await every_read(api, job_id)

    assert job["learners"][0]["metrics"] == {"acc": 0.25}
    assert [doc["job_id"] for doc in listed["jobs"]] == [job_id]
    assert [event["seq"] for event in streamed] == [event["seq"] for event in events["events"]]


async def test_a_document_an_older_platform_stored_with_nan_is_served_with_null(
    api: Api, platform: Platform, settings: Settings
) -> None:
    job_id = await quiet_job(api, "stored")
    await forge_beat(platform, job_id, step=5, metrics={"acc": 0.25})
    await api.wait_for(job_id, lambda job: job["learners"][0]["step"] == 5, "the report")
    await api.http.delete(f"/v1/jobs/{job_id}")
    await api.wait(job_id, "CANCELLED", released=True)
    with sqlite3.connect(settings.projection_path) as db:  # as a projection of an older platform holds it
        db.execute("UPDATE jobs SET document = replace(document, '\"acc\":0.25', '\"acc\":NaN')")

    for path in ("/v1/jobs", f"/v1/jobs/{job_id}"):
        response = await api.http.get(path)
        assert response.status_code == 200, response.text
        body = strict_loads(response.content)
        document = body["jobs"][0] if "jobs" in body else body
        assert document["learners"][0]["metrics"] == {"acc": None}


@pytest.fixture
async def platform_of_an_old_log(settings: Settings) -> Platform:
    """The platform over a log an older platform wrote, where a learner reported a ``NaN`` loss (a
    ``LearnerProgressed`` of version 1 as Python's ``json`` writes it), before it starts."""
    seeding = Platform(settings)
    await seeding.bus.start()
    events = [logged.event for logged in read_log(GOLDEN_DIR / "happy_path.events.jsonl")]
    job_id = next(event.job_id for event in events if hasattr(event, "job_id"))
    records = []
    for event in events:
        if getattr(event, "job_id", None) != job_id:
            continue
        body = event_to_dict(event)
        if body["type"] == "LearnerProgressed":
            body["schema_version"], body["data"] = 1, {**body["data"], "metrics": {"loss": float("nan")}}
            body["data"].pop("dropped", None)
        records.append(OutgoingRecord(job_id, json.dumps(body).encode()))
    await seeding.bus.publish(seeding.topics.events, records)
    await seeding.bus.close()
    await seeding.heartbeats.close()
    return seeding


async def test_an_old_logs_nan_is_served_without_it(platform_of_an_old_log: Platform, api: Api) -> None:
    (job,) = strict_loads((await api.http.get("/v1/jobs")).content)["jobs"]
    assert job["state"] == "COMPLETED"

    _, _, events, *streamed = await every_read(api, job["job_id"])

    logged = [event for event in events["events"] if event["type"] == "LearnerProgressed"]
    assert logged
    for event in logged:  # upcast from version 1: the NaN dropped, with its reason
        reasons = ["metric 'loss' is not finite (nan)"]
        assert (event["data"]["metrics"], event["data"]["dropped"]) == ({}, reasons)
    assert [event["seq"] for event in streamed] == [event["seq"] for event in events["events"]]


async def refusals(api: Api, job_id: str, expected: int, timeout_s: float = 30.0) -> list[str]:
    """The reasons of the job's ``CommandRejected`` events, once there are ``expected`` of them (or the
    time is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [e["data"]["reason"] for e in await history(api, job_id) if e["type"] == "CommandRejected"]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)


def forged_checkpoints(place: Path) -> list[str]:
    """Checkpoints a hostile agent claims for the job, each outside its checkpoint place."""
    return [
        "file:///tmp/evil-ckpt.pt",
        "/tmp/evil-ckpt.pt",
        f"file://{place}/../../evil/checkpoints/step.pt",
        f"file://{place}/./../evil.pt",
        f"file://attacker.example{place}/step.pt",
        f"file://{place}-evil/step.pt",
        f"file://{place}/%2e%2e/%2e%2e/evil.pt",
        f"file://{place}//tmp/evil.pt",
        f"FILE://{place}/step.pt",
        f"file://{place}",
        f"file://{place}/",
        f"s3://bucket{place}/step.pt",
    ]


async def forge_until_refused(api: Api, platform: Platform, job_id: str, checkpoint: dict[str, Any]) -> None:
    """Forge a beat naming ``checkpoint`` until the owner has refused it. The monitor reports at most
    one checkpoint a second per learner, the latest named (docs/security.md), so a forged beat the
    agent's next beat replaces within the second is never reported: it is forged again."""
    deadline = time.monotonic() + 30.0
    while True:
        await forge_beat(platform, job_id, step=1, checkpoint=checkpoint)
        for _ in range(15):
            reasons = await refusals(api, job_id, 0)
            if any(repr(checkpoint["uri"])[:300] in reason for reason in reasons):
                return
            await asyncio.sleep(0.1)
        assert time.monotonic() < deadline, f"{checkpoint['uri']} never refused"


async def test_a_forged_checkpoint_is_refused_and_never_resumed_from(
    api: Api, platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    # checkpoints at steps 5 and 10, then quiet (alive, its beat unchanged) until it is halted
    args = ["--steps", "100000", "--delay", "0.05", "--hang-at", "10"]
    job_id = await api.submit(manifest("victim", learners=1, args=args))
    await api.wait_for(
        job_id,
        lambda job: (job["latest_checkpoint"] or {}).get("step") == 10,
        "a checkpoint of its own at step 10",
    )
    place = settings.work_dir.resolve() / job_id / "checkpoints"
    forged = forged_checkpoints(place)

    for index, uri in enumerate(forged):
        await forge_until_refused(api, platform, job_id, {"step": 10**6 + index, "uri": uri})

    reasons = await refusals(api, job_id, len(forged))
    assert len(reasons) == len(forged), reasons
    assert all(reason.startswith("checkpoint ") and " refused: " in reason for reason in reasons)
    recorded = [
        e["data"]["checkpoint"]["uri"]
        for e in await history(api, job_id)
        if e["type"] == "CheckpointRecorded"
    ]
    assert recorded and all(uri.startswith(f"file://{place}/") for uri in recorded)

    assert (await api.http.post(f"/v1/jobs/{job_id}:halt")).status_code == 202
    halted = await api.wait(job_id, "HALTED", released=True)
    assert halted["latest_checkpoint"]["uri"].startswith(f"file://{place}/")
    assert (await api.http.post(f"/v1/jobs/{job_id}:resume")).status_code == 202
    await api.wait_for(job_id, lambda job: job["attempt"] == 2 and job["state"] == "RUNNING", "attempt 2")

    (launched,) = [
        e for e in await history(api, job_id) if e["type"] == "JobLaunching" and e["data"]["attempt"] == 2
    ]
    assert launched["data"]["resume_from"]["uri"].startswith(f"file://{place}/")
    log = settings.work_dir / job_id / "logs" / "attempt-2" / "learner-0.log"
    # RUNNING says the learner's process started, not that the program got as far as its resume
    await wait_until_async(
        lambda: log.exists() and "resumed from step" in log.read_text(), 60.0, what="the learner's resume"
    )
    await api.http.delete(f"/v1/jobs/{job_id}")
    await api.wait(job_id, "CANCELLED", released=True)

    # the check before an upgrade: the log decides again as the owner decided, refusals and all
    report = await redecided(settings, tmp_path / "run.events.jsonl")
    assert report["divergences"] == 0 and report["known_changes"] == {"checkpoint-places": len(forged)}


async def redecided(settings: Settings, log: Path) -> Any:
    """``ffdl export --commands`` of the platform's log, then ``ffdl verify --redecide`` of it."""
    env = {"FFDL_DATA_DIR": str(settings.data_dir), "FFDL_PARTITIONS": str(settings.partitions)}

    def ffdl(*args: str) -> Any:
        result = CliRunner().invoke(app, [*args, "--json"], env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    await asyncio.to_thread(ffdl, "export", "--commands", "-o", str(log))
    return await asyncio.to_thread(ffdl, "verify", "--redecide", str(log))
