"""A hostile tenant's jobs on the embedded default (the local launcher, its sandbox, the default
learner user, the default learners' root), each attack of issue 20's learner items as a job:

* a module planted where the learner writes is never imported by the next attempt's agent (root);
* a learner sees no other process, not the platform's files, not another job's directories, logs or
  report socket, and leaves nothing in the host's /tmp nor a process behind (``setsid``);
* an endless line, a report of 40,000 metrics, NaN, a flood and a stalled connection neither stop
  its own agent from reporting nor reach the platform unbounded; a checkpoint outside the job's
  checkpoint directory (a path, a symbolic link) is refused, with the reason in the agent's log;
* a learner's logs are the platform's alone (0600 in 0700 directories) and served by the API;
* beyond ``memory_mb`` the kernel stops it (where the host has cgroups).

The platform runs as root in CI with its interpreter under ``/root`` (0700): every job here runs that
interpreter as the default learner user, which is what the sandbox makes possible.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ffdl.adapters.launchers.job_network import namespace_path
from ffdl.wiring.config import Settings
from tests.e2e.test_fail_closed import healthy
from tests.harness import Api, fast_settings, learner_command
from tests.services import free_port, wait_until

pytestmark = pytest.mark.e2e

HOSTILE = Path(__file__).parents[1] / "learners" / "hostile_tenant.py"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the default learner user applies to a root platform")


@pytest.fixture
async def settings(tmp_path: Path) -> AsyncIterator[Settings]:
    """The defaults for learners: the sandbox, their root under the system temp directory, its user."""
    defaults = Settings()
    settings = fast_settings(
        tmp_path / "ffdl",
        learners_dir=None,
        learner_user=defaults.learner_user,
        sandbox=defaults.sandbox,
        heartbeat_ttl_s=2.0,  # a loaded CI machine, not an agent held up by its learner, may take 1 s
        result_roots=[tmp_path / "results"],
    )
    (tmp_path / "results" / "shared").mkdir(parents=True)
    yield settings
    shutil.rmtree(settings.work_dir, ignore_errors=True)


def hostile(mode: str, **extra: Any) -> str:
    env = extra.pop("env", {})
    spec = {"name": f"hostile-{mode}", "command": f"{sys.executable} {HOSTILE} {mode}", "env": env, **extra}
    return yaml.safe_dump(spec)


def tries(log: str) -> dict[str, str]:
    """What the hostile learner tried, and what came of it."""
    return {
        line.removeprefix("tried ").partition(": ")[0]: line.partition(": ")[2]
        for line in log.splitlines()
        if line.startswith("tried ")
    }


def learner_log(settings: Settings, job_id: str, attempt: int = 1) -> str:
    return (settings.work_dir / job_id / "logs" / f"attempt-{attempt}" / "learner-0.log").read_text()


def agent_log(settings: Settings, job_id: str, attempt: int = 1) -> str:
    return (settings.work_dir / job_id / "logs" / f"attempt-{attempt}" / "agent-0.log").read_text()


def processes_with(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_a_module_planted_by_the_learner_is_never_imported_by_the_next_agent(
    api: Api, settings: Settings, tmp_path: Path
) -> None:
    marker = tmp_path / "imported"
    job_id = await api.submit(hostile("plant", max_restarts=1, env={"MARKER": str(marker)}))

    job = await api.wait(job_id, "COMPLETED", released=True)

    assert job["restarts"] == 1  # a second agent started where the first learner planted its modules
    assert "planted in" in learner_log(settings, job_id, 2)
    assert not marker.exists(), marker.read_text()


@as_root
async def test_a_learner_reaches_no_other_job_nor_the_platform_and_leaves_nothing_behind(
    api: Api, settings: Settings
) -> None:
    victim_id = await api.submit(
        yaml.safe_dump({"name": "victim", "command": learner_command("--steps", "2000", "--delay", "0.05")})
    )
    await api.wait_for(
        victim_id, lambda job: job["learners"] and job["learners"][0]["step"] >= 1, "victim steps"
    )
    sleep_mark, tmp_mark = str(1_000_000 + uuid.uuid4().int % 1_000_000), f"hostile-{uuid.uuid4().hex}"
    host_listener = socket.create_server(("127.0.0.1", 0))  # what another job's rendezvous port is
    abstract_name = f"ffdl-test-{uuid.uuid4().hex}"
    abstract_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_listener.bind("\0" + abstract_name)
    abstract_listener.listen()
    env = {
        "TARGET_DATA_DIR": str(settings.data_dir.resolve()),
        "VICTIM_DIR": str(settings.work_dir / victim_id),
        "SLEEP_MARK": sleep_mark,
        "TMP_MARK": tmp_mark,
        "HOST_PORT": str(host_listener.getsockname()[1]),
        "API_PORT": str(api.http.base_url.port),
        "ABSTRACT_NAME": abstract_name,
    }
    try:
        job_id = await api.submit(hostile("probe", env=env))
        await api.wait(job_id, "COMPLETED", released=True)
    finally:
        host_listener.close()
        abstract_listener.close()

    log = learner_log(settings, job_id)
    assert tries(log) == {
        "read tenants.json": "refused",
        "list the data dir": "refused",
        "list the victim's job dir": "refused",
        "write the victim's checkpoints": "refused",
        "open a host sysctl for writing": "refused",
        "read the victim's log": "refused",
        "forge the victim's reports": "refused",
        "reach a port of the host's loopback": "refused",
        "reach the platform's API": "refused",
        "connect to an abstract socket of the host": "refused",
        "see the host's sockets": "refused",
        "see other processes": "refused",
    }, log
    assert log.rstrip().endswith("done")
    assert not (settings.work_dir / victim_id / "checkpoints" / "planted").exists()
    assert not (Path("/tmp") / tmp_mark).exists()  # its /tmp was its own
    assert processes_with(f"sleep {sleep_mark}") == []  # setsid did not outlive the job
    assert not namespace_path(job_id).exists()  # its network namespace went with its learners
    victim = await api.job(victim_id)
    assert victim["learners"][0]["step"] < 424242
    assert "pwned_by_hostile" not in victim["learners"][0]["metrics"]
    await api.http.delete(f"/v1/jobs/{victim_id}")

    logs = settings.work_dir / job_id / "logs"
    for path in (logs, logs / "attempt-1"):
        assert path.stat().st_mode & 0o777 == 0o700
    for path in (logs / "attempt-1" / "learner-0.log", logs / "attempt-1" / "agent-0.log"):
        assert path.stat().st_mode & 0o777 == 0o600
    served = await api.http.get(f"/v1/jobs/{job_id}/logs")
    assert served.status_code == 200
    assert "tried read tenants.json: refused" in served.text


async def test_a_flood_of_bad_reports_neither_stalls_the_agent_nor_passes_unbounded(
    api: Api, settings: Settings
) -> None:
    job_id = await api.submit(hostile("flood"))
    neighbour_id = await api.submit(
        yaml.safe_dump({"name": "neighbour", "command": learner_command("--steps", "10")})
    )

    job = await api.wait(job_id, "COMPLETED", released=True, timeout_s=90)
    await api.wait(neighbour_id, "COMPLETED", released=True)

    (learner,) = job["learners"]
    assert learner["step"] == 7
    assert len(learner["metrics"]) <= 64 and learner["metrics"]["loss"] == 0.5
    assert (
        job["latest_checkpoint"]["uri"]
        == f"file://{settings.work_dir / job_id / 'checkpoints' / 'step-6.pt'}"
    )
    agent = agent_log(settings, job_id)
    assert "learner report dropped" in agent and "over the limit" in agent
    assert agent.count("learner checkpoint refused") == 2  # /tmp/evil-ckpt.pt, and through a link
    assert "is a symbolic link" in agent
    assert "too many bad reports" in agent


@as_root
async def test_a_learner_beyond_its_memory_is_stopped_by_the_kernel(api: Api) -> None:
    if not os.access("/sys/fs/cgroup/memory", os.W_OK) and not os.access("/sys/fs/cgroup", os.W_OK):
        pytest.skip("no writable memory cgroup on this host")
    job_id = await api.submit(hostile("memory", memory_mb=128, max_restarts=0, env={"HOG_MB": "512"}))

    job = await api.wait(job_id, "FAILED", released=True)

    assert "allocated" not in (await api.http.get(f"/v1/jobs/{job_id}/logs")).text
    assert job["learners"][0]["exit_code"] in (-9, 128 + 9)  # SIGKILL, by the out-of-memory killer
    assert glob.glob(f"/sys/fs/cgroup/*/ffdl/{job_id}-*") == []  # removed with the learner


@as_root
async def test_a_set_uid_file_a_learner_leaves_is_out_of_every_other_users_reach(
    api: Api, settings: Settings
) -> None:
    # in its sandbox the learner's uid is root outside: what it writes is root's on the host, set-uid
    # bit included, and it may open its working directory; only the learners' root (0700) keeps a
    # host user from running it as root
    job_id = await api.submit(hostile("setuid"))

    await api.wait(job_id, "COMPLETED", released=True)

    planted = settings.work_dir / job_id / "work" / "rootenv"
    assert planted.stat().st_mode & 0o4000 and planted.stat().st_uid == 0, learner_log(settings, job_id)
    assert not reaches_as_nobody(planted), "a host user reaches the learner's set-uid file"


def reaches_as_nobody(path: Path) -> bool:
    nobody = pwd.getpwnam("nobody")
    command = ["/usr/bin/test", "-e", str(path)]
    found = subprocess.run(command, check=False, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
    return found.returncode == 0


@as_root
async def test_a_result_place_a_learner_made_a_link_leads_nowhere_out_of_the_roots(
    api: Api, settings: Settings
) -> None:
    # the API checks a result place as written; a first job's learner makes one a link to the
    # host's / and a second job names it: bwrap would bind the host's / writable, as root
    shared = settings.result_roots[0] / "shared"
    linker = {"name": "linker", "command": 'ln -s / "$RESULT_DIR/escape"', "result_dir": str(shared)}
    first = await api.submit(yaml.safe_dump(linker))
    await api.wait(first, "COMPLETED", released=True)
    assert (shared / "escape").is_symlink()
    marker = f"escaped-{uuid.uuid4().hex}"
    escape = {
        "name": "escape",
        "command": f'touch "$RESULT_DIR/tmp/{marker}"',
        "result_dir": str(shared / "escape"),
        "max_restarts": 0,
    }

    second = await api.submit(yaml.safe_dump(escape))

    await api.wait(second, "FAILED", released=True)
    assert not (Path("/tmp") / marker).exists(), "the learner wrote the host's /tmp"


# --------------------------------------------------------------------------- ffdl up, as an operator runs it

START_S = 30.0


def up_environment(tmp_path: Path, api: str) -> dict[str, str]:
    """``ffdl up`` with every learner setting left at its default (no learners' root, no user)."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("FFDL_") or name in ("FFDL_LOG_LEVEL", "FFDL_LOG_FORMAT")
    }
    return {
        **inherited,
        "FFDL_DATA_DIR": str(tmp_path / "data"),
        "FFDL_API": api,
        "FFDL_NODES": '[{"name": "node-a", "gpus": 1}]',
        "FFDL_HEARTBEAT_TTL_S": "1",
    }


@as_root
def test_up_as_root_runs_a_job_whose_python_lives_under_a_closed_directory(tmp_path: Path) -> None:
    closed = [parent for parent in Path(sys.base_prefix).parents if parent.stat().st_mode & 0o005 == 0]
    if not closed:
        pytest.skip(f"this Python ({sys.base_prefix}) lies under no directory closed to others")
    api = f"http://127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "ffdl.cli", "up", "--open"],
        env=up_environment(tmp_path, api),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: healthy(api), START_S, what="the API")
        manifest = yaml.safe_dump({"name": "closed-python", "command": learner_command("--steps", "5")})
        submitted = httpx.post(
            f"{api}/v1/jobs", content=manifest, headers={"Content-Type": "application/yaml"}
        )
        job_id = submitted.json()["job_id"]

        def ended() -> bool:
            return httpx.get(f"{api}/v1/jobs/{job_id}").json()["state"] in ("COMPLETED", "FAILED")

        wait_until(ended, 60.0, what="the job to end")
        job = httpx.get(f"{api}/v1/jobs/{job_id}").json()
        assert (job["state"], job["restarts"]) == ("COMPLETED", 0), job
    finally:
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=START_S)
        shutil.rmtree(Settings(data_dir=tmp_path / "data").work_dir, ignore_errors=True)
    assert "UNCONFINED" not in errors


@as_root
def test_up_without_the_sandbox_says_so_first_and_refuses_a_python_the_learner_user_cannot_run(
    tmp_path: Path,
) -> None:
    closed = [parent for parent in Path(sys.base_prefix).parents if parent.stat().st_mode & 0o005 == 0]
    if not closed:
        pytest.skip(f"this Python ({sys.base_prefix}) lies under no directory closed to others")
    refused = subprocess.run(
        [sys.executable, "-m", "ffdl.cli", "up", "--open", "--no-sandbox"],
        env=up_environment(tmp_path, f"http://127.0.0.1:{free_port()}"),
        capture_output=True,
        text=True,
        timeout=START_S,
        check=False,
    )
    assert refused.stderr.startswith("WARNING: FFDL_SANDBOX=off")
    assert refused.returncode == 2
    message = " ".join(refused.stderr.split())
    assert "error: the learner user" in message
    assert "cannot reach this Python" in message and "sandboxed" in message
