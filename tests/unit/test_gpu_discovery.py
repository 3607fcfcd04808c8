"""The local inventory's GPUs: what nvidia-smi lists, else simulated ones (which are no CUDA devices)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ffdl.adapters import gpus
from ffdl.adapters.gpus import SIMULATED_GPUS, detect_local_node
from ffdl.core.cluster import Admission
from ffdl.events.model import LEARNER_MEMORY_MIN_MB, JobSpec


def fake_nvidia_smi(directory: Path, script: str) -> None:
    program = directory / "nvidia-smi"
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(0o755)


def test_the_gpus_nvidia_smi_lists_make_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, 'printf "NVIDIA H200\\nNVIDIA H200\\n"')
    monkeypatch.setenv("PATH", str(tmp_path))
    node = detect_local_node()
    assert (node.gpus, node.gpu_type) == (2, "nvidia-h200")


@pytest.mark.parametrize("script", ["exit 9", "true"])
def test_without_a_working_nvidia_smi_the_node_has_simulated_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str
) -> None:
    fake_nvidia_smi(tmp_path, script)
    monkeypatch.setenv("PATH", str(tmp_path))
    node = detect_local_node()
    assert (node.gpus, node.gpu_type) == (SIMULATED_GPUS, "simulated")


def test_the_node_offers_the_host_s_memory_less_the_platform_s_reserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Learners are placed by their memory: a node of the default 256 GiB on a smaller host once took
    a job whose learners' agents ran the host out of memory."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemFree:         1000 kB\n")
    assert gpus.host_memory_mb(meminfo) == 24_000
    assert gpus.host_memory_mb(tmp_path / "missing") is None
    fake_nvidia_smi(tmp_path, "exit 9")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(gpus, "host_memory_mb", lambda: 24_000)
    assert detect_local_node().memory_mb == 24_000 - gpus.PLATFORM_RESERVE_MB
    monkeypatch.setattr(gpus, "host_memory_mb", lambda: 3_000)  # a small host keeps half for learners
    assert detect_local_node().memory_mb == 1_500


def test_a_manifest_of_many_small_cpu_learners_never_fits_this_hosts_node() -> None:
    """The attack: 1,024 learners of the least memory and no GPUs, each with an agent beside it. On
    the node of 256 GiB the embedded default once offered, whatever the host had, it was placed and
    its agents ran a 24 GiB host out of memory; a host's node of 24 GiB less the reserve holds 170."""
    node = replace(detect_local_node(), memory_mb=24_000 - gpus.PLATFORM_RESERVE_MB)
    many = JobSpec(
        name="many", command="true", learners=1024, gpus=0, cpus=0.01, memory_mb=LEARNER_MEMORY_MIN_MB
    )
    assert many.submission_problems() == []
    assert Admission([node]).why_never_fits(many) is not None
    fits = many.model_copy(update={"learners": node.memory_mb // LEARNER_MEMORY_MIN_MB})
    assert Admission([node]).why_never_fits(fits) is None
