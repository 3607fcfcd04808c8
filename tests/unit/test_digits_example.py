"""The digits example, run as two ranks by hand (no platform): it learns, resumes and halts cleanly."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ffdl.api.manifest import parse_manifest
from tests.report_sink import ReportSink
from tests.services import free_port, wait_until

EXAMPLE = "ffdl.examples.digits.train"
RUN_TIMEOUT_S = 120.0
MIN_ACCURACY = 0.9

Ranks = Callable[..., list[subprocess.Popen[bytes]]]


@pytest.fixture
def start_ranks(tmp_path: Path) -> Iterator[Ranks]:
    """Starts the two ranks of a run (each in its own session); kills whatever a failed test left."""
    started: list[subprocess.Popen[bytes]] = []
    sockets = Path(tempfile.mkdtemp(prefix="ffdl-reports-"))  # a socket's path must be short

    def start(run: str, *arguments: str, resume_from: Path | None = None) -> list[subprocess.Popen[bytes]]:
        port = str(free_port())
        processes = []
        for rank in range(2):
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "FFDL_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
                "FFDL_RESUME_FROM": str(resume_from or ""),
                "FFDL_REPORT_SOCKET": str(_listen(tmp_path, sockets, run, rank)),
                "RESULT_DIR": str(tmp_path / "results"),
            }
            with (tmp_path / f"{run}-rank-{rank}.log").open("wb") as output:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", EXAMPLE, *arguments],
                        env=env,
                        cwd=tmp_path,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        started.extend(processes)
        return processes

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for key in [key for key in SINKS if key[0] == tmp_path]:
        SINKS.pop(key).close()
    shutil.rmtree(sockets, ignore_errors=True)


#: What each rank of each run reported, as its agent would have got it.
SINKS: dict[tuple[Path, str, int], ReportSink] = {}


def _listen(tmp_path: Path, sockets: Path, run: str, rank: int) -> Path:
    sink = SINKS[tmp_path, run, rank] = ReportSink(sockets / f"{run}-{rank}.sock")
    return sink.path


def statuses(processes: list[subprocess.Popen[bytes]]) -> list[int]:
    """The ranks' exit statuses, once what they reported was all read."""
    codes = [process.wait(timeout=RUN_TIMEOUT_S) for process in processes]
    for sink in SINKS.values():
        sink.drain()  # each rank's one connection
    return codes


def output(tmp_path: Path, run: str, rank: int) -> str:
    return (tmp_path / f"{run}-rank-{rank}.log").read_text()


def reports(tmp_path: Path, run: str, rank: int) -> list[dict[str, Any]]:
    return SINKS[tmp_path, run, rank].reports()


def final_accuracy(text: str) -> float:
    match = re.search(r"^final test accuracy: (\d\.\d+)$", text, re.MULTILINE)
    assert match is not None, text
    return float(match[1])


def test_two_ranks_learn_the_digits_in_sync_and_resume_from_a_checkpoint(
    tmp_path: Path, start_ranks: Ranks
) -> None:
    first = start_ranks("first", "--steps", "60", "--step-delay", "0", "--checkpoint-every", "20")
    assert statuses(first) == [0, 0]

    rank_0, rank_1 = output(tmp_path, "first", 0), output(tmp_path, "first", 1)
    assert "starting from step 0" in rank_0
    assert final_accuracy(rank_0) >= MIN_ACCURACY
    steps_seen = [line for line in rank_0.splitlines() if line.startswith("step ")]
    assert len(steps_seen) == 3
    assert steps_seen == [line for line in rank_1.splitlines() if line.startswith("step ")]  # same weights
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == [
        "step-000020.npz",
        "step-000040.npz",
        "step-000060.npz",
    ]
    assert (tmp_path / "results" / "model.npz").is_file()
    rank_0_reports = reports(tmp_path, "first", 0)
    assert [r["step"] for r in rank_0_reports if r["type"] == "checkpoint"] == [20, 40, 60]
    assert [r["step"] for r in rank_0_reports if r["type"] == "progress"][:60] == list(range(1, 61))
    assert rank_0_reports[-1]["metrics"]["accuracy"] == pytest.approx(final_accuracy(rank_0), abs=1e-3)

    checkpoint = tmp_path / "checkpoints" / "step-000040.npz"
    second = start_ranks("second", "--steps", "80", "--step-delay", "0", resume_from=checkpoint)
    assert statuses(second) == [0, 0]

    for rank in range(2):
        assert "resumed from step 40" in output(tmp_path, "second", rank)
    assert final_accuracy(output(tmp_path, "second", 0)) >= MIN_ACCURACY
    resumed_steps = [r["step"] for r in reports(tmp_path, "second", 0) if r["type"] == "progress"]
    assert resumed_steps[0] == 41


def test_sigterm_halts_the_gang_with_a_checkpoint_of_the_last_step(
    tmp_path: Path, start_ranks: Ranks
) -> None:
    ranks = start_ranks("halted", "--steps", "100000", "--step-delay", "0.02", "--checkpoint-every", "100000")

    def past_step_5() -> bool:
        progress = [r for r in reports(tmp_path, "halted", 0) if r["type"] == "progress"]
        return bool(progress) and progress[-1]["step"] >= 5

    wait_until(past_step_5, RUN_TIMEOUT_S, what="rank 0 past step 5")
    os.killpg(ranks[1].pid, signal.SIGTERM)  # one rank halting stops the whole gang

    assert statuses(ranks) == [0, 0]
    halted_at = {
        re.findall(r"^halted at step (\d+)$", output(tmp_path, "halted", rank), re.MULTILINE)[0]
        for rank in (0, 1)
    }
    (step,) = map(int, halted_at)
    assert step >= 5
    assert (tmp_path / "checkpoints" / f"step-{step:06d}.npz").is_file()
    assert [r["step"] for r in reports(tmp_path, "halted", 0) if r["type"] == "checkpoint"] == [step]


def test_the_manifest_is_a_valid_job() -> None:
    manifest = Path(__file__).parents[2] / "src" / "ffdl" / "examples" / "digits" / "manifest.yaml"

    spec = parse_manifest(manifest.read_text())

    assert (spec.name, spec.learners, spec.gpus) == ("digits", 2, 0)
    assert f"-m {EXAMPLE}" in spec.command
