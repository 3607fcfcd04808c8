"""``ffdl demo`` tells the truth: the step it prints at the kill is the learner's own last report
(the restart resumes from a checkpoint at or before it), its progress rows count against their
total (never ``0/None``), and at the end it says its dashboard is closed and how to keep looking."""

from __future__ import annotations

import json
import re
import shutil
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
        # the step printed is the last one the killed learner reported, not the platform's older record
        reports = settings.job_dir(job_id) / "logs" / "attempt-1" / "learner-1.reports.jsonl"  # type: ignore[operator]
        last = [json.loads(line) for line in reports.read_text().splitlines() if '"progress"' in line][-1]
        assert int(killed.group(1)) == last["step"]
        assert re.search(r"platform: LAUNCHING: attempt 2 from the checkpoint of step \d+", printed), printed
        assert "/None" not in printed and "60/60" in printed
        assert "is closed now" in printed and "ffdl demo --linger" in printed
        assert f"FFDL_DATA_DIR={data_dir} ffdl up --open" in printed
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(settings.work_dir, ignore_errors=True)


def test_a_learner_s_step_is_its_last_progress_report(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", learners_dir=tmp_path / "learners")
    job_dir = settings.job_dir("job-1")
    assert job_dir is not None
    reports = job_dir / "logs" / "attempt-2" / "learner-1.reports.jsonl"
    assert demo.reported_step(settings, "job-1", 2, 1) is None  # nothing reported yet
    reports.parent.mkdir(parents=True)
    reports.write_text(
        '{"type":"progress","step":7,"metrics":{}}\n'
        '{"type":"checkpoint","step":7,"path":"/c"}\n'
        '{"type":"progress","step":9,"metrics":{}}\n'
        '{"type":"progr'  # a line still being written
    )
    assert demo.reported_step(settings, "job-1", 2, 1) == 9


def test_a_kept_demo_says_how_to_serve_and_replay_its_log(tmp_path: Path) -> None:
    lines = "\n".join(demo.keep_looking("http://127.0.0.1:5000", tmp_path, "digits-demo-1", keep=True))
    assert f"FFDL_DATA_DIR={tmp_path} ffdl up --open" in lines
    assert f"FFDL_DATA_DIR={tmp_path} ffdl replay --job digits-demo-1" in lines
    assert "http://127.0.0.1:5000/ is closed now" in lines
