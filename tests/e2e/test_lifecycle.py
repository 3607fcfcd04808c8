"""The job lifecycle end to end: real learner processes, the embedded log, the HTTP API."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ffdl.events.codec import any_command_from_json
from ffdl.events.envelope import Command
from ffdl.tools.sre import verify_log
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import Api, learner_command, manifest

pytestmark = pytest.mark.e2e


def states_of(job: dict[str, object]) -> list[str]:
    return [entry["state"] for entry in job["history"]]  # type: ignore[index,union-attr]


def learner_log(settings: Settings, job_id: str, attempt: int, rank: int) -> str:
    return (settings.work_dir / job_id / "logs" / f"attempt-{attempt}" / f"learner-{rank}.log").read_text()


async def assert_log_clean(settings: Settings) -> None:
    report = await verify_log(settings)
    assert report["violations"] == []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


async def test_happy_path_runs_every_learner_to_completion(api: Api, settings: Settings) -> None:
    job_id = await api.submit(manifest("happy", args=["--steps", "20", "--delay", "0.02"]))
    job = await api.wait(job_id, "COMPLETED", released=True)
    assert states_of(job) == [
        "SUBMITTED",
        "QUEUED",
        "SCHEDULED",
        "LAUNCHING",
        "RUNNING",
        "STORING",
        "COMPLETED",
    ]
    assert [learner["exit_code"] for learner in job["learners"]] == [0, 0]
    assert all(learner["step"] == 20 for learner in job["learners"])
    assert job["latest_checkpoint"]["step"] == 20
    assert job["result"]["metrics"]["loss"] == pytest.approx(1 / 20)
    await assert_log_clean(settings)


async def test_learner_killed_with_sigkill_restarts_from_last_checkpoint(
    api: Api, settings: Settings
) -> None:
    job_id = await api.submit(manifest("killed", args=["--steps", "60", "--delay", "0.05"]))
    running = await api.wait_for(
        job_id,
        lambda j: j["state"] == "RUNNING" and j["learners"][1]["step"] >= 15,
        "learner 1 passing step 15",
    )
    os.kill(running["learners"][1]["pid"], signal.SIGKILL)
    job = await api.wait(job_id, "COMPLETED", released=True)
    assert job["restarts"] == 1 and job["attempt"] == 2
    assert "RESTARTING" in states_of(job)
    restarted = next(e for e in job["history"] if e["state"] == "RESTARTING")
    assert "exited with code -9" in restarted["reason"]
    resumed = learner_log(settings, job_id, 2, 0)
    assert "resumed from step" in resumed and "resumed from step 0" not in resumed
    await assert_log_clean(settings)


async def test_learner_that_stops_progressing_is_detected_as_hung_and_restarted(
    api: Api, settings: Settings
) -> None:
    text = manifest(
        "hung", args=["--steps", "30", "--delay", "0.02", "--hang-at", "10"], progress_timeout_s=2
    )
    job_id = await api.submit(text)
    job = await api.wait(job_id, "COMPLETED", released=True, timeout_s=90)
    restarted = next(e for e in job["history"] if e["state"] == "RESTARTING")
    assert "lost (hung)" in restarted["reason"]
    assert "resumed from step 10" in learner_log(settings, job_id, 2, 0)
    await assert_log_clean(settings)


async def test_halt_keeps_a_checkpoint_and_resume_continues_from_it(api: Api, settings: Settings) -> None:
    job_id = await api.submit(manifest("halted", args=["--steps", "80", "--delay", "0.05"]))
    await api.wait_for(
        job_id, lambda j: j["state"] == "RUNNING" and j["learners"][0]["step"] >= 12, "step 12"
    )
    response = await api.http.post(f"/v1/jobs/{job_id}:halt")
    assert response.status_code == 202, response.text
    halted = await api.wait(job_id, "HALTED", released=True)
    checkpoint = halted["latest_checkpoint"]["step"]
    assert checkpoint >= 12
    assert "halted at step" in learner_log(settings, job_id, 1, 0)
    response = await api.http.post(f"/v1/jobs/{job_id}:resume")
    assert response.status_code == 202, response.text
    job = await api.wait(job_id, "COMPLETED", released=True)
    assert states_of(job).count("RUNNING") == 2
    assert f"resumed from step {checkpoint}" in learner_log(settings, job_id, 2, 0)
    assert job["restarts"] == 0
    await assert_log_clean(settings)


async def test_cancel_stops_the_learners_and_frees_the_gpus(api: Api, settings: Settings) -> None:
    job_id = await api.submit(manifest("cancelled", args=["--steps", "1000", "--delay", "0.05"]))
    running = await api.wait(job_id, "RUNNING")
    pids = [learner["pid"] for learner in running["learners"]]
    response = await api.http.delete(f"/v1/jobs/{job_id}")
    assert response.status_code == 202, response.text
    job = await api.wait(job_id, "CANCELLED", released=True)
    assert job["state"] == "CANCELLED"
    assert not any(pid_alive(pid) for pid in pids)
    cluster = (await api.http.get("/v1/cluster")).json()
    assert cluster["gpus_allocated"] == 0
    await assert_log_clean(settings)


async def test_a_job_that_does_not_fit_waits_for_the_gpus_of_the_first(api: Api, settings: Settings) -> None:
    first = await api.submit(manifest("first", learners=2, gpus=2, args=["--steps", "30", "--delay", "0.05"]))
    await api.wait(first, "RUNNING")
    second = await api.submit(
        manifest("second", learners=1, gpus=1, args=["--steps", "5", "--delay", "0.01"])
    )
    waiting = await api.wait(second, "QUEUED")
    queues = (await api.http.get("/v1/queues")).json()
    assert [entry["job_id"] for entry in queues["queues"]["default"]] == [second]
    first_done = await api.wait(first, "COMPLETED", released=True)
    second_done = await api.wait(second, "COMPLETED", released=True)
    scheduled_at = next(e["at"] for e in second_done["history"] if e["state"] == "SCHEDULED")
    assert scheduled_at >= first_done["history"][-1]["at"]
    assert waiting["placement"] is None
    await assert_log_clean(settings)


async def test_exceeding_max_restarts_fails_the_job_with_the_reason(api: Api, settings: Settings) -> None:
    text = manifest(
        "crashy", learners=1, args=["--steps", "30", "--delay", "0.01", "--fail-at", "3"], max_restarts=1
    )
    job_id = await api.submit(text)
    job = await api.wait(job_id, "FAILED", released=True)
    assert job["failure_code"] == "C200", job["reason"]
    assert "learner 0 exited with code 3" in job["reason"] and "gave up after 1 restarts" in job["reason"]
    assert job["restarts"] == 1
    await assert_log_clean(settings)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("name: bad\nlearners: 0\ncommand: 'true'\n", "learners"),
        ("name: bad\nlearners: 1\n", "command"),
        ("name: Not_A_Name!\ncommand: 'true'\n", "name"),
        ("name: ok\ncommand: 'true'\ngpus: many\n", "gpus"),
        (
            "name: ffdl-style\nlearners: 1\nmemory: lots\nframework:\n  name: tf\n  command: 'true'\n",
            "memory",
        ),
        ("[1, 2, 3]\n", "(body)"),
    ],
)
async def test_bad_manifests_get_a_4xx_naming_the_field_and_record_nothing(
    api: Api, platform: Platform, body: str, field: str
) -> None:
    response = await api.http.post("/v1/jobs", content=body, headers={"Content-Type": "application/yaml"})
    assert response.status_code == 422
    assert field in [problem["field"] for problem in response.json()["detail"]]
    assert (await api.http.get("/v1/jobs")).json()["jobs"] == []
    topic = platform.topics.commands
    sent = [
        any_command_from_json(record.value)
        for partition in await platform.bus.end_offsets(topic)
        async for record in platform.bus.read(topic, partition)
    ]
    assert [c for c in sent if isinstance(c, Command)] == [], "only the scheduler's node observations"


async def test_an_ffdl_manifest_runs_as_is(api: Api) -> None:
    command = learner_command("--steps", "3", "--delay", "0.01")
    ffdl_manifest = (
        "name: FfDL_Tutorial\nversion: '1.0'\ndescription: from FfDL\n"
        "learners: 1\ngpus: 1\ncpus: 1\nmemory: 1Gb\n"
        "data_stores:\n  - id: store\n    type: mount_cos\n    training_data: {container: train-data}\n"
        "    training_results: {container: ffdl-results}\n"
        f"framework:\n  name: tensorflow\n  version: '1.5'\n  command: {command}\n"
    )
    job_id = await api.submit(ffdl_manifest)
    job = await api.wait(job_id, "COMPLETED", released=True)
    assert job["spec"]["name"] == "ffdl-tutorial" and job["spec"]["memory_mb"] == 1024
    assert job["spec"]["framework"] == "tensorflow" and job["spec"]["data_dir"] == "train-data"
