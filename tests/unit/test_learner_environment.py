"""The learner's two environments (the agent's, built by the platform; the command's, with the job's env)
and the local launcher's isolation helpers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ffdl.adapters.launchers.environment import (
    HEARTBEATS_PASSWORD_VARIABLE,
    JOB_ENV_PREFIX,
    RUN_AS_VARIABLE,
    LearnerSite,
    RefusedEnvironment,
    command_environment,
    inherited_environment,
    learner_environment,
)
from ffdl.adapters.launchers.isolation import (
    LearnerUser,
    learner_user,
    prepare_learners_root,
    protect_data_dir,
)
from ffdl.events.model import LEARNER_CONTRACT_VARIABLES, JobSpec, LearnerPlacement, Placement
from ffdl.handlers.ports import LaunchRequest
from ffdl.learner.agent import AgentConfig

PLATFORM = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONPATH": "/opt/ffdl/src",
    "FFDL_TOKEN": "ffdl_admin",
    "FFDL_KAFKA__SASL_PASSWORD": "secret",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "HOME": "/root",
    "SSH_AUTH_SOCK": "/tmp/agent.sock",
}
SITE = LearnerSite(
    master_addr="127.0.0.1",
    master_port=29500,
    checkpoint_dir="/learners/job/checkpoints",
    default_result_dir="/learners/job/results",
    heartbeats_url="embedded:///data/heartbeats.sqlite",
    heartbeat_ttl_s=5.0,
    files={"FFDL_LOG_FILE": "/learners/job/logs/l.log", "FFDL_REPORT_SOCKET": "/run/ffdl/report.sock"},
    base={**inherited_environment(PLATFORM), "HOME": "/learners/job/work"},
    worker_addresses=["127.0.0.1:29500"],
)


def request(env: dict[str, str]) -> LaunchRequest:
    # model_construct: a spec as an older version may have put it on the log, unchecked
    spec = JobSpec(name="job", command="train", framework="tensorflow")
    spec = JobSpec.model_construct(**{**spec.model_dump(), "env": env})
    placement = Placement(learners=(LearnerPlacement(rank=0, node="node-a", gpus=(1,)),))
    return LaunchRequest("job-1", "acme", 1, spec, placement, None, env={"FFDL_HEARTBEATS": "embedded:///x"})


def test_a_learner_keeps_only_the_allow_listed_part_of_the_platforms_environment() -> None:
    assert inherited_environment(PLATFORM) == {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/opt/ffdl/src",
    }


def test_the_agent_gets_the_jobs_env_only_wrapped_and_the_command_gets_it_unwrapped() -> None:
    agent = learner_environment(request({"OMP_NUM_THREADS": "4", "PATH": "/opt/conda/bin"}), *placed(), SITE)
    assert agent["PATH"] == "/usr/bin:/bin"  # the agent runs with what the platform chose
    assert agent["OMP_NUM_THREADS"] == "1"  # the platform's default, from the learner's one CPU
    assert agent[f"{JOB_ENV_PREFIX}OMP_NUM_THREADS"] == "4"
    assert not {"FFDL_TOKEN", "FFDL_KAFKA__SASL_PASSWORD", "AWS_SECRET_ACCESS_KEY"} & set(agent)
    assert set(agent) >= LEARNER_CONTRACT_VARIABLES

    command = command_environment(
        {**agent, RUN_AS_VARIABLE: "65534:65534", HEARTBEATS_PASSWORD_VARIABLE: "pw"}
    )
    assert command["OMP_NUM_THREADS"] == "4"
    assert command["PATH"] == "/opt/conda/bin"  # the job's env overrides the base...
    assert {name: command[name] for name in LEARNER_CONTRACT_VARIABLES} == {
        name: agent[name]
        for name in LEARNER_CONTRACT_VARIABLES  # ...never the contract
    }
    assert not any(name.startswith(JOB_ENV_PREFIX) for name in command)
    assert RUN_AS_VARIABLE not in command and HEARTBEATS_PASSWORD_VARIABLE not in command


def placed() -> tuple[LearnerPlacement, tuple[int, ...]]:
    learner = LearnerPlacement(rank=0, node="node-a", gpus=(1,))
    return learner, learner.gpus


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "FFDL_HEARTBEATS", "RANK"])
def test_a_job_from_an_older_version_with_a_refused_env_is_refused_at_launch_and_by_the_agent(
    name: str,
) -> None:
    with pytest.raises(RefusedEnvironment, match=name):
        learner_environment(request({name: "/tmp/evil"}), *placed(), SITE)
    agent = learner_environment(request({}), *placed(), SITE)
    with pytest.raises(RefusedEnvironment, match=name):
        command_environment({**agent, f"{JOB_ENV_PREFIX}{name}": "/tmp/evil"})
    with pytest.raises(ValueError, match=name):
        AgentConfig.from_environ({**agent, f"{JOB_ENV_PREFIX}{name}": "/tmp/evil"})


@pytest.mark.parametrize("value", [":/etc/shadow", "/etc/shadow", "../../../etc/shadow"])
def test_a_job_from_an_older_version_whose_tz_names_a_file_is_refused_at_launch_and_by_the_agent(
    value: str,
) -> None:
    """The agent hands the command's environment to the root-side shell, nsenter and bwrap."""
    with pytest.raises(RefusedEnvironment, match=r"env\.TZ"):
        learner_environment(request({"TZ": value}), *placed(), SITE)
    agent = learner_environment(request({"TZ": "Europe/Berlin"}), *placed(), SITE)
    assert command_environment(agent)["TZ"] == "Europe/Berlin"
    with pytest.raises(RefusedEnvironment, match=r"env\.TZ"):
        command_environment({**agent, f"{JOB_ENV_PREFIX}TZ": value})


def test_the_agent_reads_whom_to_run_the_command_as() -> None:
    agent = learner_environment(request({}), *placed(), SITE)
    assert AgentConfig.from_environ(agent).run_as is None
    assert AgentConfig.from_environ({**agent, RUN_AS_VARIABLE: "65534:65533"}).run_as == (65534, 65533)
    with pytest.raises(ValueError, match=RUN_AS_VARIABLE):
        AgentConfig.from_environ({**agent, RUN_AS_VARIABLE: "nobody"})


def test_the_data_dir_becomes_the_platforms_alone(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    protect_data_dir(data_dir)
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only root switches users")


def test_without_root_learners_run_as_the_platforms_own_user() -> None:
    if os.geteuid() == 0:
        assert learner_user("root") is None
        assert learner_user("nobody") == LearnerUser("nobody", 65534, 65534)
        assert learner_user("4242:4243") == LearnerUser("4242", 4242, 4243)
    else:
        assert learner_user("nobody") is None


@root_only
def test_a_learners_root_a_learner_could_swap_or_not_reach_is_refused(tmp_path: Path) -> None:
    nobody = LearnerUser("nobody", 65534, 65534)
    open_parent = tmp_path / "shared"
    open_parent.mkdir()
    open_parent.chmod(0o777)  # writable by all, not sticky: a learner could rename the root away
    tmp_path.chmod(0o755)
    with pytest.raises(ValueError, match="writable by others"):
        prepare_learners_root(open_parent / "learners", nobody)
    closed_parent = tmp_path / "closed"
    closed_parent.mkdir(mode=0o700)
    with pytest.raises(ValueError, match="cannot reach it"):
        prepare_learners_root(closed_parent / "learners", nobody)
