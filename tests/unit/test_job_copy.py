"""The records ``evolve`` copies are indistinguishable from ones ``dataclasses.replace`` would build.

``evolve`` copies ``Job`` and ``Learner`` with a field copier instead of ``dataclasses.replace``
(which was most of what replaying a log cost per event). These tests pin that the copies still equal
records built through the constructor, print and hash the same, stay frozen, and that the copier
refuses what ``replace`` would refuse.
"""

from __future__ import annotations

import uuid
from dataclasses import FrozenInstanceError, dataclass, field, fields, replace
from typing import Any

import pytest

from ffdl.core.aggregate import seen
from ffdl.core.job import Job, _copy_job, _field_copier, evolve
from ffdl.events.envelope import Event
from ffdl.tools.log_files import read_log
from tests.golden.record import GOLDEN_DIR

GOLDEN = sorted(path.name.removesuffix(".events.jsonl") for path in GOLDEN_DIR.glob("*.events.jsonl"))


def _folded(name: str) -> list[Job]:
    """Every state each job of the golden log ``name`` passes through, in log order."""
    jobs: dict[str, Job] = {}
    states = []
    for logged in read_log(GOLDEN_DIR / f"{name}.events.jsonl"):
        event = logged.event
        if not isinstance(event, Event):
            continue  # a node's event: no job to fold
        jobs[event.job_id] = evolve(jobs.get(event.job_id), event)
        states.append(jobs[event.job_id])
    return states


def _rebuilt(record: Any) -> Any:
    """``record`` built again through its class's constructor."""
    return type(record)(**{f.name: getattr(record, f.name) for f in fields(record)})


@pytest.mark.parametrize("name", GOLDEN)
def test_every_folded_job_equals_the_one_its_constructor_builds(name: str) -> None:
    states = _folded(name)
    assert states
    for job in states:
        rebuilt = _rebuilt(job)
        assert job == rebuilt
        assert repr(job) == repr(rebuilt)
        for learner in job.learners:
            assert learner == _rebuilt(learner)
            assert hash(learner) == hash(_rebuilt(learner))


def test_folded_jobs_and_learners_stay_frozen() -> None:
    job = _folded("happy_path")[-1]
    with pytest.raises(FrozenInstanceError):
        job.seq = 0  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        job.learners[0].step = 0  # type: ignore[misc]


def test_copying_any_field_matches_replace() -> None:
    states = _folded("restart_after_kill")
    first, last = states[0], states[-1]
    for job_field in fields(Job):
        change = {job_field.name: getattr(last, job_field.name)}
        copied = _copy_job(first, **change)
        assert copied == replace(first, **change)
        assert type(copied) is Job
    assert _copy_job(first) == first


def test_copying_an_unknown_field_fails() -> None:
    job = _folded("cancel")[-1]
    with pytest.raises(TypeError, match="no_such_field"):
        _copy_job(job, no_such_field=1)


def test_the_copier_refuses_a_class_whose_constructor_does_more_than_set_slots() -> None:
    @dataclass(frozen=True, slots=True)
    class Validated:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    @dataclass(frozen=True, slots=True)
    class Derived:
        value: int
        doubled: int = field(init=False, default=0)

    @dataclass(frozen=True)
    class Unslotted:
        value: int

    for cls in (Validated, Derived, Unslotted):
        with pytest.raises(TypeError, match="replace"):
            _field_copier(cls)


def test_a_redelivered_command_is_seen_by_value_not_identity() -> None:
    job = _folded("happy_path")[-1]
    remembered = job.recent_commands[0]
    assert seen(job, uuid.UUID(int=remembered))
    assert not seen(job, uuid.uuid4())
