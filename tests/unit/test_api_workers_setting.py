"""How many processes serve the API: as configured, else one per CPU the platform may use, a
container's CPU limit included, and never more than the default's cap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ffdl.wiring.config import MAX_DEFAULT_API_WORKERS, Settings, usable_cpus


def cgroup(tmp_path: Path, cpu_max: str) -> Path:
    (tmp_path / "cpu.max").write_text(cpu_max)
    return tmp_path


def test_the_configured_number_is_taken_as_is(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path, api_workers=3).api_processes == 3


def test_by_default_one_per_usable_cpu_up_to_the_cap(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).api_processes == min(usable_cpus(), MAX_DEFAULT_API_WORKERS)


@pytest.mark.parametrize(
    ("cpu_max", "expected"), [("100000 100000", 1), ("150000 100000", 2), ("50000 100000", 1)]
)
def test_a_cpu_quota_limits_the_usable_cpus(tmp_path: Path, cpu_max: str, expected: int) -> None:
    assert usable_cpus(cgroup(tmp_path, cpu_max)) == min(expected, len(os.sched_getaffinity(0)))


def test_without_a_quota_the_affinity_counts(tmp_path: Path) -> None:
    assert usable_cpus(cgroup(tmp_path, "max 100000")) == len(os.sched_getaffinity(0))
    assert usable_cpus(tmp_path / "no-cgroup") == len(os.sched_getaffinity(0))
