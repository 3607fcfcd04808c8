"""``ffdl demo`` tells the truth: the step it prints at the kill is the learner's own last report
(the restart resumes from a checkpoint at or before it), its progress rows count against their
total (never ``0/None``), and at the end it says its dashboard is closed and how to keep looking."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ffdl.cli import demo
from ffdl.wiring.config import Settings

pytestmark = pytest.mark.e2e


async def test_the_demo_prints_the_real_step_at_the_kill_and_how_to_keep_looking(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the demo logs to a file it closes at the end; the suite's logging must outlive it
    monkeypatch.setattr(demo, "configure_logging", lambda *args: None)
    assert await demo.run_demo(chaos=True, steps=60, keep=True, linger_s=0) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    data_dir = Path(re.search(r"platform data in (\S+)", printed).group(1))  # type: ignore[union-attr]
    settings = Settings(data_dir=data_dir)
    try:
        job_id = re.search(r"submitted (digits-demo-[0-9a-f]+)", printed).group(1)  # type: ignore[union-attr]
        killed = re.search(r"killed learner 1 \(pid \d+\) at step (\d+) with SIGKILL", printed)
        assert killed, printed
        # the step printed is the last one the killed learner reported: the one its agent published
        # in its final beat, which the platform records as attempt 1's last progress of learner 1
        exported = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "ffdl.cli", "export", "--job", job_id, "--type", "LearnerProgressed"],
            env={**os.environ, "FFDL_DATA_DIR": str(data_dir)},
            capture_output=True,
            text=True,
            check=True,
        )
        events = [json.loads(line) for line in exported.stdout.splitlines()]
        progressed = [
            event["data"]["step"]
            for event in events
            if event["type"] == "LearnerProgressed"
            and event["data"]["rank"] == 1
            and event["data"]["attempt"] == 1
        ]
        assert int(killed.group(1)) == progressed[-1]
        assert re.search(r"platform: LAUNCHING: attempt 2 from the checkpoint of step \d+", printed), printed
        assert "/None" not in printed and "60/60" in printed
        assert "is closed now" in printed and "ffdl demo --linger" in printed
        assert f"FFDL_DATA_DIR={data_dir} ffdl up --open" in printed
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(settings.work_dir, ignore_errors=True)


def test_a_learner_s_step_is_the_one_its_agent_logged_at_its_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo, "EXIT_LINE_WAIT_S", 0.0)
    settings = Settings(data_dir=tmp_path / "data", learners_dir=tmp_path / "learners")
    job_dir = settings.job_dir("job-1")
    assert job_dir is not None
    agent_log = job_dir / "logs" / "attempt-2" / "agent-1.log"
    assert demo.reported_step(settings, "job-1", 2, 1) is None  # no log yet
    agent_log.parent.mkdir(parents=True)
    agent_log.write_text(
        "2026-12-04T10:00:00Z [info     ] learner started   pid=12 command='python train.py --step=3'\n"
        "2026-12-04T10:00:09Z [info     ] checkpoint reported step=7 uri=file:///c/7.pt\n"
    )
    assert demo.reported_step(settings, "job-1", 2, 1) is None  # still running
    with agent_log.open("a") as log:
        log.write("2026-12-04T10:00:10Z [info     ] learner exited   exit_code=-9 step=9\n")
    assert demo.reported_step(settings, "job-1", 2, 1) == 9


def test_a_kept_demo_says_how_to_serve_and_replay_its_log(tmp_path: Path) -> None:
    lines = "\n".join(demo.keep_looking("http://127.0.0.1:5000", tmp_path, "digits-demo-1", keep=True))
    assert f"FFDL_DATA_DIR={tmp_path} ffdl up --open" in lines
    assert f"FFDL_DATA_DIR={tmp_path} ffdl replay --job digits-demo-1" in lines
    assert "http://127.0.0.1:5000/ is closed now" in lines
