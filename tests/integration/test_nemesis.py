"""Two minutes of the nemesis (bench/nemesis.py) with a fixed seed: the checker finds nothing.

Real tansu, etcd and mosquitto; three workers, two scheduler candidates and two API replicas as
processes; local learners; a workload of submissions, halts, resumes, cancels, cordons and drains;
faults of every kind one after another. A failure names the seed and the command that replays it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.nemesis import run_nemesis

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(900)]

SEED = 20261204
MINUTES = 2.0


async def test_two_minutes_of_faults_lose_nothing_and_break_no_invariant(tmp_path: Path) -> None:
    run = await run_nemesis(MINUTES, SEED, tmp_path)
    found = run.as_json()
    assert run.ok, f"the nemesis found {found['violations']} and lost {found['lost_jobs']}; {found['replay']}"
    assert found["fault_kinds"] >= 5, found["faults"]
    assert found["jobs_submitted"] >= 10, found["writes"]
    assert found["projection_matches_rebuild"] is True
    assert found["durations"]["settled"] is True
