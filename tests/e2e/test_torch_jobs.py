"""Real PyTorch (2.13, CPU, gloo) jobs through the whole platform, the script knowing nothing of ffdl.

The learner is ``ffdl.examples.torch_ddp.train``, written as a torchrun user writes it: it saves
``ckpt_step_N.pt`` into ``$CHECKPOINT_DIR`` and resumes from the newest there, checkpoints on
SIGTERM, and only rank 0 prints. Every run of torch costs seconds (its import, the process group),
so the tests are few and each checks several things.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ffdl.wiring.config import Settings
from tests.harness import Api, fast_settings

pytest.importorskip("torch", reason="the test extra (torch==2.13.0) is not installed")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TRAIN_MODULE = "ffdl.examples.torch_ddp.train"
TRAIN = f"{sys.executable} -m {TRAIN_MODULE}"
LOSS = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.MULTILINE)


@pytest.fixture
async def settings(tmp_path: Path) -> Settings:
    """The tests' fast settings with a longer heartbeat lease: a machine busy importing torch in
    four processes may hold an agent up for longer than the tests' usual one second."""
    return fast_settings(tmp_path / "ffdl", heartbeat_ttl_s=3.0, monitor_grace_s=6.0)


@pytest.fixture(autouse=True)
def torchrun_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``torchrun`` as the learners find it on their PATH: this interpreter's (the test's venv need
    not be on PATH), in a directory every learner's sandbox holds. A sandbox holds the platform's
    interpreter and import path, read-only, where an installed torch's ``torchrun`` lies beside it;
    the shim's directory joins the import path before the platform starts, to be held the same way."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "torchrun"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.syspath_prepend(str(bin_dir))


def torch_manifest(name: str, command: str, **extra: Any) -> str:
    spec = {"name": name, "learners": 2, "gpus": 0, "command": command, "framework": "pytorch", **extra}
    return yaml.safe_dump(spec)


def log_of(settings: Settings, job_id: str, attempt: int, rank: int) -> str:
    path = settings.work_dir / job_id / "logs" / f"attempt-{attempt}" / f"learner-{rank}.log"
    return path.read_text() if path.exists() else ""


def checkpoint_dir(settings: Settings, job_id: str) -> Path:
    return settings.work_dir / job_id / "checkpoints"


def python_of(learner_pid: int) -> int:
    """The training process a learner runs: the one process under the pid its heartbeat names (its
    sandbox's bwrap, or its shell unsandboxed) with the training module as an argument of its own
    (the shell that runs it has the module only inside its ``-c`` script)."""
    found = [pid for pid in descendants(learner_pid) if TRAIN_MODULE in arguments(pid)]
    assert len(found) == 1, found
    return found[0]


def descendants(pid: int) -> list[int]:
    children = [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]
    return [pid for child in children for pid in (child, *descendants(child))]


def arguments(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def tails(settings: Settings, job: dict[str, Any]) -> str:
    """What went wrong, for a failed assertion: the job's reasons and its learners' last lines."""
    lines = [str(entry["reason"]) for entry in job["history"]]
    for attempt in range(1, job["attempt"] + 1):
        for rank in range(len(job["learners"])):
            tail = log_of(settings, job["job_id"], attempt, rank).splitlines()[-3:]
            lines.append(f"attempt {attempt} rank {rank}: {tail}")
    return "\n".join(lines)


def gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "zombie" in status.read_text()


async def test_a_plain_script_on_two_learners_completes_quiet_rank_alive_checkpoints_recorded_and_pruned(
    api: Api, settings: Settings
) -> None:
    # rank 1 is silent for the whole training (24 s), longer than the timeout; the timeout leaves
    # room for torch's import, silent too, on a loaded machine
    args = "--steps 48 --checkpoint-every 12 --log-every 4 --step-delay 0.5"
    job_id = await api.submit(
        torch_manifest("plain", f"{TRAIN} {args}", keep_checkpoints=2, progress_timeout_s=20, max_restarts=0)
    )
    job = await api.wait(job_id, "COMPLETED", released=True, timeout_s=180)

    assert job["restarts"] == 0
    assert log_of(settings, job_id, 1, 1).strip() == "rank 1: starting from step 0 (gloo on cpu)"
    assert job["latest_checkpoint"]["step"] == 48
    assert job["latest_checkpoint"]["uri"].endswith("/ckpt_step_48.pt")
    assert job["latest_checkpoint"]["checksum"].startswith("sha256:")
    assert job["latest_checkpoint"]["size_bytes"] > 0
    kept = sorted(path.name for path in checkpoint_dir(settings, job_id).iterdir())
    assert kept == ["ckpt_step_36.pt", "ckpt_step_48.pt"]  # keep_checkpoints: 2 of 12, 24, 36, 48


async def test_kill_9_of_a_rank_restarts_the_gang_from_the_discovered_checkpoint_and_the_loss_goes_on(
    api: Api, settings: Settings
) -> None:
    args = "--steps 60 --checkpoint-every 20 --log-every 10 --step-delay 0.1"
    job_id = await api.submit(torch_manifest("killed", f"{TRAIN} {args}", progress_timeout_s=60))
    running = await api.wait_for(
        job_id,
        lambda j: j["state"] == "RUNNING" and (j["latest_checkpoint"] or {}).get("step", 0) >= 20,
        "a checkpoint recorded",
        timeout_s=120,
    )
    assert running["attempt"] == 1, running["history"]
    os.kill(python_of(running["learners"][1]["pid"]), signal.SIGKILL)
    job = await api.wait(job_id, "COMPLETED", released=True, timeout_s=180)

    assert (job["restarts"], job["attempt"]) == (1, 2), tails(settings, job)
    launched = [entry["reason"] for entry in job["history"] if entry["state"] == "LAUNCHING"][-1]
    said = re.search(r"from the checkpoint of step (\d+)", launched)
    assert said is not None, launched
    resumed = int(said.group(1))
    assert resumed >= 20
    second = log_of(settings, job_id, 2, 0)
    assert f"rank 0: resumed from step {resumed}" in second  # what the platform said is what ran
    before = {int(step): float(loss) for step, loss in LOSS.findall(log_of(settings, job_id, 1, 0))}
    after = {int(step): float(loss) for step, loss in LOSS.findall(second)}
    assert min(after) == resumed + 10  # no step done twice from scratch
    assert after[min(after)] < before[10]  # the loss goes on from where it was, not from the start


async def test_a_gang_stuck_behind_a_stopped_rank_is_hung_within_the_timeout(
    api: Api, settings: Settings
) -> None:
    args = "--steps 100000 --log-every 5 --step-delay 0.05"
    job_id = await api.submit(
        torch_manifest("stopped", f"{TRAIN} {args}", progress_timeout_s=20, max_restarts=0)
    )
    await api.wait_for(
        job_id,
        lambda j: j["state"] == "FAILED" or "step 10 " in log_of(settings, job_id, 1, 0),
        "step 10",
        timeout_s=120,
    )
    running = await api.job(job_id)
    assert running["state"] == "RUNNING", tails(settings, running)
    stopped = python_of(running["learners"][1]["pid"])
    os.kill(stopped, signal.SIGSTOP)
    started = asyncio.get_running_loop().time()
    job = await api.wait(job_id, "FAILED", released=True, timeout_s=60)

    assert job["failure_code"] == "C201"
    assert "the gang made no progress for 20s" in job["reason"]
    # found within the timeout, plus the monitor's tick and the stop's grace
    took = asyncio.get_running_loop().time() - started
    assert took < 20 + settings.stop_grace_s + 5, (took, tails(settings, job))
    assert gone(stopped)  # the stopped rank was killed


async def test_torchrun_runs_two_workers_on_each_of_two_learners(api: Api, settings: Settings) -> None:
    job_id = await api.submit(
        torch_manifest(
            "torchrun",
            "-m ffdl.examples.torch_ddp.train --steps 10 --checkpoint-every 10 --log-every 5",
            launcher="torchrun",
            nproc_per_node=2,
            cpus=2,
        )
    )
    job = await api.wait(job_id, "COMPLETED", released=True, timeout_s=240)

    second_learner = log_of(settings, job_id, 1, 1)
    assert "rank 2: starting from step 0" in second_learner
    assert "rank 3: starting from step 0" in second_learner
    assert job["latest_checkpoint"]["step"] == 10


async def test_halt_checkpoints_on_sigterm_and_resume_starts_from_that_checkpoint(
    api: Api, settings: Settings
) -> None:
    args = "--steps 100000 --checkpoint-every 100000 --log-every 5 --step-delay 0.05"
    job_id = await api.submit(torch_manifest("halted", f"{TRAIN} {args}", stop_grace_s=30))
    await api.wait_for(
        job_id, lambda j: "step 10 " in log_of(settings, job_id, 1, 0), "step 10", timeout_s=120
    )
    response = await api.http.post(f"/v1/jobs/{job_id}:halt")
    assert response.status_code == 202, response.text
    halted = await api.wait(job_id, "HALTED", released=True, timeout_s=60)

    step = halted["latest_checkpoint"]["step"]
    assert step >= 10
    assert f"stopped at step {step}: checkpoint saved" in log_of(settings, job_id, 1, 0)
    response = await api.http.post(f"/v1/jobs/{job_id}:resume")
    assert response.status_code == 202, response.text
    await api.wait_for(
        job_id,
        lambda j: f"resumed from step {step}" in log_of(settings, job_id, 2, 0),
        "the resume",
        timeout_s=120,
    )
    response = await api.http.delete(f"/v1/jobs/{job_id}")
    assert response.status_code == 202, response.text
    await api.wait(job_id, "CANCELLED", released=True, timeout_s=60)
