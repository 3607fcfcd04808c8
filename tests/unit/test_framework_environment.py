"""What frameworks read from a learner's environment: torch elastic's names, torchrun's options,
TensorFlow's ``TF_CONFIG``, the CPU threads, and what simulated GPUs look like to a learner."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ffdl.adapters.launchers.environment import (
    LearnerSite,
    command_environment,
    learner_command,
    learner_environment,
    local_worker_addresses,
    threads_per_worker,
)
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.handlers.ports import LaunchRequest

SITE = LearnerSite(
    master_addr="10.0.0.1",
    master_port=29500,
    checkpoint_dir="/ckpt",
    default_result_dir="/results",
    heartbeats_url="embedded:///x",
    heartbeat_ttl_s=5.0,
    worker_addresses=["10.0.0.1:29500", "10.0.0.2:29500", "10.0.0.3:29500"],
)


def environments(attempt: int = 1, gpu_type: str | None = None, **spec: object) -> list[dict[str, str]]:
    fields: dict[str, object] = {"name": "job", "command": "train.py", "learners": 3, **spec}
    job = JobSpec.model_validate(fields)
    placement = Placement(
        learners=tuple(
            LearnerPlacement(rank=rank, node="node-a", gpus=(rank,), gpu_type=gpu_type) for rank in range(3)
        )
    )
    launch = LaunchRequest("job-7", "acme", attempt, job, placement, None)
    return [
        command_environment(learner_environment(launch, learner, learner.gpus, SITE))
        for learner in placement.learners
    ]


def test_a_plain_command_is_one_elastic_node_per_learner_with_one_worker() -> None:
    for rank, env in enumerate(environments(attempt=3, max_restarts=5)):
        assert env["RANK"] == env["GROUP_RANK"] == env["NODE_RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == env["GROUP_WORLD_SIZE"] == "3"
        assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
        assert env["ROLE_NAME"] == "default"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
        assert env["TORCHELASTIC_RUN_ID"] == "job-7"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "2"  # attempt 3 follows two restarts
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "5"
        assert env["CUDA_VISIBLE_DEVICES"] == str(rank)  # LOCAL_RANK 0 is the learner's own GPU
        assert not any(name.startswith("PET_") for name in env)


def test_torchrun_gets_the_static_rendezvous_as_its_own_options() -> None:
    for rank, env in enumerate(environments(launcher="torchrun", nproc_per_node=2, cpus=5)):
        assert env["PET_NNODES"] == "3"
        assert env["PET_NODE_RANK"] == str(rank)
        assert env["PET_NPROC_PER_NODE"] == "2"
        assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("10.0.0.1", "29500")
        assert env["PET_RDZV_BACKEND"] == "static"
        assert env["PET_MAX_RESTARTS"] == "0"  # ffdl restarts the whole gang
        assert env["WORLD_SIZE"] == "6" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["OMP_NUM_THREADS"] == "2"  # five CPUs shared by two workers


@pytest.mark.parametrize(("gpus", "nproc", "expected"), [(0, None, 1), (4, None, 4), (4, 2, 2), (0, 3, 3)])
def test_torchrun_runs_one_worker_per_gpu_unless_told(gpus: int, nproc: int | None, expected: int) -> None:
    spec = JobSpec(name="j", command="t.py", gpus=gpus, launcher="torchrun", nproc_per_node=nproc)
    assert spec.workers_per_learner == expected


def test_nproc_per_node_without_torchrun_is_refused() -> None:
    spec = JobSpec(name="j", command="t.py", nproc_per_node=2)
    assert spec.submission_problems() == [("nproc_per_node", "only with launcher: torchrun")]


@pytest.mark.parametrize(
    ("command", "launcher", "expected"),
    [
        ("python train.py", "command", "python train.py"),
        ("train.py --epochs 3", "torchrun", "torchrun train.py --epochs 3"),
        ("torchrun train.py", "torchrun", "torchrun train.py"),
        ("torchrunner.py", "torchrun", "torchrun torchrunner.py"),
    ],
)
def test_the_learners_command_runs_under_torchrun_once(command: str, launcher: str, expected: str) -> None:
    spec = JobSpec.model_validate({"name": "j", "command": command, "launcher": launcher})
    assert learner_command(spec) == expected


def test_a_job_may_not_set_torchruns_options_itself() -> None:
    spec = JobSpec(name="j", command="t.py", env={"PET_NNODES": "9", "TF_CONFIG": "{}"})
    assert {field for field, _ in spec.submission_problems()} == {"env.PET_NNODES", "env.TF_CONFIG"}


def test_a_job_may_set_its_own_thread_count() -> None:
    [env, *_] = environments(env={"OMP_NUM_THREADS": "7"})
    assert env["OMP_NUM_THREADS"] == "7"


@given(cpus=st.floats(min_value=0.01, max_value=512), workers=st.integers(min_value=1, max_value=64))
def test_threads_never_oversubscribe_the_learners_cpus_and_are_at_least_one(
    cpus: float, workers: int
) -> None:
    threads = threads_per_worker(cpus, workers)
    assert threads >= 1
    assert threads == 1 or threads * workers <= cpus


def test_tensorflow_gets_every_learner_as_a_worker_and_its_own_index() -> None:
    """TensorFlow's documented format: ``cluster`` maps a task type to its addresses, ``task`` names
    this process's type and index (tensorflow.org/guide/distributed_training, multi-worker)."""
    for rank, env in enumerate(environments(framework="TensorFlow")):
        config = json.loads(env["TF_CONFIG"])
        assert config == {
            "cluster": {"worker": list(SITE.worker_addresses)},
            "task": {"type": "worker", "index": rank},
        }
    assert "TF_CONFIG" not in environments(framework="pytorch")[0]


def test_learners_on_one_machine_listen_on_consecutive_ports() -> None:
    addresses = local_worker_addresses("127.0.0.1", 40000, 3)
    assert addresses == ["127.0.0.1:40000", "127.0.0.1:40001", "127.0.0.1:40002"]


def test_simulated_gpus_are_no_cuda_devices() -> None:
    for rank, env in enumerate(environments(gpu_type="simulated")):
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["FFDL_SIMULATED_GPUS"] == str(rank)
        assert "CUDA_DEVICE_ORDER" not in env


def test_real_gpus_are_numbered_as_nvidia_smi_numbers_them() -> None:
    for rank, env in enumerate(environments(gpu_type="nvidia-h200")):
        assert env["CUDA_VISIBLE_DEVICES"] == str(rank)
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert "FFDL_SIMULATED_GPUS" not in env


#: An interpreter with tensorflow installed (it is 1.6 GB, so not in the test extra): when set, its
#: own ``TFConfigClusterResolver`` reads the ``TF_CONFIG`` ffdl writes.
TENSORFLOW_PYTHON = os.environ.get("FFDL_TEST_TENSORFLOW_PYTHON", "")


@pytest.mark.skipif(not TENSORFLOW_PYTHON, reason="no FFDL_TEST_TENSORFLOW_PYTHON interpreter")
def test_tensorflows_own_resolver_reads_the_tf_config() -> None:
    env = environments(framework="tensorflow")[2]
    probe = (
        "from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver as R\n"
        "import json; r = R(); print(json.dumps([r.cluster_spec().as_dict(), r.task_type, r.task_id]))"
    )
    out = subprocess.run(
        [TENSORFLOW_PYTHON, "-c", probe],
        env={"TF_CONFIG": env["TF_CONFIG"], "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert json.loads(out.splitlines()[-1]) == [{"worker": list(SITE.worker_addresses)}, "worker", 2]
