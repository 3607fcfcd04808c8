"""The nemesis' workload asks only for what the platform can give: every manifest it draws is one
the API accepts, a gang that fits the nemesis' nodes, and some fail on purpose."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.nemesis import job_manifest, replay_command
from bench.nemesis_stack import NODES
from ffdl.api.manifest import parse_manifest


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32))
def test_every_drawn_manifest_is_accepted_and_its_gang_fits_the_nodes(seed: int) -> None:
    spec = parse_manifest(job_manifest(random.Random(seed), "nem-1"))

    assert spec.name == "nem-1"
    assert spec.learners * spec.gpus <= sum(node.gpus for node in NODES)
    assert spec.learners <= len(NODES), "a spread gang needs a node per learner"
    assert "counting.py" in spec.command


def test_some_learners_fail_on_purpose_once_or_for_good() -> None:
    commands = [parse_manifest(job_manifest(random.Random(seed), "j")).command for seed in range(300)]
    failing = [command for command in commands if "--fail-at" in command]

    assert 0 < len(failing) < len(commands) / 2
    assert any("--once" in command for command in failing)
    assert any("--once" not in command for command in failing)


def test_the_replay_command_names_the_seed_and_the_minutes() -> None:
    assert replay_command(20261204, 2.0) == "python -m bench.nemesis --minutes 2 --seed 20261204"
