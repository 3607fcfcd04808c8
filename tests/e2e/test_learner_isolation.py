"""A hostile learner on the local launcher, with the embedded defaults, cannot reach what the platform trusts.

It runs as the default learner user (``nobody`` where the platform runs as root, as CI does) from
the default learners' root, and tries to read the platform's credentials from its environment and
through ``/proc``, to write ``tenants.json``, the log, the heartbeat store, and the files the launcher
and the agent keep about it; it reports each try, and each must fail, while what a learner may do
(its checkpoints, its reports) still works and the job completes.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from ffdl.wiring.config import Settings
from tests.harness import Api, fast_settings

pytestmark = pytest.mark.e2e

HOSTILE = (Path(__file__).parents[1] / "learners" / "hostile.sh").read_text()
PLANTED = {"FFDL_TOKEN": "ffdl_planted-admin-token", "FFDL_KAFKA__SASL_PASSWORD": "planted-sasl-password"}
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only a platform running as root can switch users")


@pytest.fixture
async def settings(tmp_path: Path) -> AsyncIterator[Settings]:
    """The defaults for learners: their root under the system temp directory, the default user."""
    settings = fast_settings(tmp_path / "ffdl", learners_dir=None, learner_user=Settings().learner_user)
    yield settings
    shutil.rmtree(settings.work_dir, ignore_errors=True)


async def run_hostile_learner(
    api: Api, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """Run the hostile learner to its end with credentials planted in the platform's environment;
    what it tried and what came of it, and its other lines."""
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    spec = {
        "name": "hostile",
        "command": HOSTILE,
        "env": {
            "TARGET_DATA_DIR": str(settings.data_dir.resolve()),
            "TARGET_PLATFORM_PID": str(os.getpid()),
            "LEARNER_PYTHON": sys.executable,
            "FROM_MANIFEST": "present",
        },
    }
    job_id = await api.submit(yaml.safe_dump(spec))
    job = await api.wait(job_id, "COMPLETED", released=True)
    assert job["learners"][0]["step"] == 1  # its report reached the platform
    log = (settings.work_dir / job_id / "logs" / "attempt-1" / "learner-0.log").read_text()
    lines = dict(line.split(": ", 1) for line in log.splitlines() if ": " in line)
    assert lines.pop("tried env FFDL_TOKEN") == "refused"
    assert lines.pop("tried env FFDL_KAFKA__SASL_PASSWORD") == "refused"
    assert lines["job env"] == "present"
    assert lines["wrapped env"] == "0"
    assert lines["own checkpoint"] == lines["own report"] == "written"
    assert log.rstrip().endswith("done")
    return lines


async def test_a_learner_gets_none_of_the_platforms_environment(
    api: Api, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    await run_hostile_learner(api, settings, monkeypatch)


@as_root
async def test_a_learner_cannot_reach_the_platforms_files_or_processes(
    api: Api, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {path.name: path.read_bytes() for path in settings.data_dir.iterdir() if path.suffix == ".json"}

    lines = await run_hostile_learner(api, settings, monkeypatch)

    tried = {
        name.removeprefix("tried "): outcome for name, outcome in lines.items() if name.startswith("tried ")
    }
    assert tried == {
        "the agent's environment": "refused",
        "the platform's environment": "refused",
        "read tenants.json": "refused",
        "write tenants.json": "refused",
        "create a file in the data dir": "refused",
        "write the log": "refused",
        "write the heartbeat keys": "refused",
        "forge a pidfile": "refused",
        "write the agent's log of it": "refused",
    }
    assert lines["uid"] != "0"
    assert not (settings.data_dir / "planted").exists()
    assert {
        path.name: path.read_bytes() for path in settings.data_dir.iterdir() if path.suffix == ".json"
    } == before
    assert settings.data_dir.stat().st_mode & 0o777 == 0o700


async def test_a_job_that_sets_a_loader_variable_is_refused_naming_the_field(api: Api) -> None:
    spec = {"name": "preload", "command": "true", "env": {"LD_PRELOAD": "/tmp/evil.so", "FFDL_TOKEN": "x"}}
    response = await api.http.post(
        "/v1/jobs", content=yaml.safe_dump(spec), headers={"Content-Type": "application/yaml"}
    )
    assert response.status_code == 422
    fields = {problem["field"] for problem in response.json()["detail"]}
    assert fields == {"env.LD_PRELOAD", "env.FFDL_TOKEN"}


# ------------------------------------------------------------------ unsandboxed, as the learner user

#: What an unsandboxed learner tells of itself (POSIX sh: it runs no Python, which may lie under a
#: directory the learner user cannot enter): who it is, what it may do, which cgroups hold it, whether
#: it could move itself out of its cgroup (a move that works is said, not undone), and its env.
UNSANDBOXED = r"""
grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status | tr -s '\t ' ' '
echo "in its cgroup: $(grep -c "/ffdl/$FFDL_JOB_ID-a1-r0\$" /proc/self/cgroup)"
for procs in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/*/ffdl/cgroup.procs; do
    [ -e "$procs" ] || continue
    if (echo $$ > "$procs") 2>/dev/null; then echo "left its cgroup: $procs"; fi
done
echo "job env: ${FROM_MANIFEST:-missing}"
echo done
"""


@as_root
class TestUnsandboxed:
    """The sandbox off (the operator's choice), a root platform: the command runs as the learner
    user, in the learner's cgroup, with no capability and ``no_new_privs``."""

    @pytest.fixture
    async def settings(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Settings]:
        """Learners run as ``nobody`` in a learners' root it can reach. The launcher refuses a Python
        the learner user cannot reach (under ``/root`` here): the learner here runs none."""
        if not os.access("/sys/fs/cgroup/memory", os.W_OK) and not os.access("/sys/fs/cgroup", os.W_OK):
            pytest.skip("no writable cgroup on this host")
        monkeypatch.setattr("ffdl.adapters.launchers.local.check_interpreter_reachable", lambda *_: None)
        learners = Path(tempfile.mkdtemp(prefix="ffdl-unsandboxed-"))
        os.chmod(learners, 0o711)
        try:
            yield fast_settings(
                tmp_path / "ffdl", learners_dir=learners, learner_user="nobody", sandbox="off"
            )
        finally:
            shutil.rmtree(learners, ignore_errors=True)

    async def test_the_learner_runs_as_the_learner_user_in_its_cgroup_and_cannot_leave_it(
        self, api: Api, settings: Settings
    ) -> None:
        """Before, the shell that joins the cgroup already ran as the learner user: it could not write
        ``cgroup.procs`` and every learner exited with status 125."""
        nobody = pwd.getpwnam("nobody")
        spec = {
            "name": "unsandboxed",
            "command": UNSANDBOXED,
            "max_restarts": 0,
            "env": {"FROM_MANIFEST": "present"},
        }
        job_id = await api.submit(yaml.safe_dump(spec))

        job = await api.wait(job_id, "COMPLETED", "FAILED", released=True)

        log = (settings.work_dir / job_id / "logs" / "attempt-1" / "learner-0.log").read_text()
        assert job["state"] == "COMPLETED", log
        lines = dict(line.split(": ", 1) for line in log.splitlines() if ": " in line)
        assert lines["Uid"] == " ".join([str(nobody.pw_uid)] * 4)
        assert lines["Gid"] == " ".join([str(nobody.pw_gid)] * 4)
        assert lines.get("Groups", "").strip() == ""
        for capabilities in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(lines[capabilities], 16) == 0, capabilities
        assert lines["NoNewPrivs"] == "1"
        assert int(lines["in its cgroup"]) >= 1
        assert not any(name == "left its cgroup" for name in lines), log
        assert lines["job env"] == "present"
        assert log.rstrip().endswith("done")
        assert (
            glob.glob(f"/sys/fs/cgroup/*/ffdl/{job_id}-*") + glob.glob(f"/sys/fs/cgroup/ffdl/{job_id}-*")
            == []
        )
