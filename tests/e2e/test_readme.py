"""The README works as written: its quickstart runs literally, with its own manifest, read from the
README's code blocks (so the documentation cannot rot without this test failing).

The first block of the quickstart runs the platform (in the background here, as in a terminal of
its own); the second, run by bash with ``set -e`` and ``pipefail``, is a new user's session against
it. Only the environment is the test's: a free port (``FFDL_API``), a data directory, a small node,
and learners run as the test's own user (the default learner user may not reach this Python).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ffdl.api.manifest import parse_manifest
from tests.harness import PLATFORM_USER
from tests.services import free_port, wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def blocks_under(heading: str, language: str) -> list[str]:
    """The README's fenced ``language`` blocks in the section named ``heading``."""
    text = README.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)


def test_the_readme_first_screen_is_two_commands() -> None:
    first = re.search(r"```sh\n(.*?)```", README.read_text(), re.DOTALL)
    assert first is not None
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert [command for command in commands if command] == ["make demo", "make test"]


def test_the_readme_manifest_is_accepted_as_it_is() -> None:
    (manifest,) = blocks_under("The manifest", "yaml")
    spec = parse_manifest(manifest)
    assert (spec.name, spec.learners, spec.data_dir, spec.result_dir) == (
        "digits",
        2,
        "data",
        "results/digits",
    )


@pytest.fixture
def session(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A directory as a user's checkout looks after ``make demo`` (its ``.venv``, the manifest
    saved as ``manifest.yaml``) and the environment of the platform and the user."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (manifest,) = blocks_under("The manifest", "yaml")
    (tmp_path / "manifest.yaml").write_text(manifest)
    env = {
        **os.environ,
        "FFDL_API": f"http://127.0.0.1:{free_port()}",
        "FFDL_DATA_DIR": str(tmp_path / "ffdl"),
        "FFDL_LEARNERS_DIR": str(tmp_path / "learners"),
        "FFDL_LEARNER_USER": PLATFORM_USER,
        "FFDL_NODES": '[{"name": "laptop", "gpus": 2}]',
        "FFDL_API_WORKERS": "1",
        "COLUMNS": "80",
    }
    yield tmp_path, env


def test_the_readme_quickstart_runs_literally(session: tuple[Path, dict[str, str]]) -> None:
    where, env = session
    platform_block, user_block = blocks_under("Quickstart", "sh")
    with (where / "platform.log").open("wb") as log:
        platform = subprocess.Popen(
            ["bash", "-c", platform_block],
            cwd=where,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: ready(env["FFDL_API"]), 60, interval_s=0.2, what="ffdl up to serve the API")
        user = subprocess.run(
            ["bash", "-c", f"set -eo pipefail\n{user_block}"],
            cwd=where,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
        assert user.returncode == 0, user.stdout + user.stderr
        assert "Traceback" not in user.stderr, user.stderr
        job_id = re.search(r"submitted (digits-[0-9a-f]{8})", user.stdout)
        assert job_id is not None, user.stdout
        job = httpx.get(f"{env['FFDL_API']}/v1/jobs/{job_id.group(1)}").json()
        assert job["state"] == "COMPLETED", job
        assert job["result"]["files"] >= 1, job  # the model, written to the manifest's result_dir
        assert "accuracy" in user.stdout  # the learner's log, followed to its end
    finally:
        os.killpg(platform.pid, signal.SIGINT)
        platform.wait(30)


def ready(api: str) -> bool:
    try:
        return httpx.get(f"{api}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
