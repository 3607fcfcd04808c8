"""The local inventory's GPUs: what nvidia-smi lists, else simulated ones (which are no CUDA devices)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ffdl.adapters import gpus
from ffdl.adapters.gpus import SIMULATED_GPUS, detect_local_node


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
