"""A checkpoint is believed only inside its job's checkpoint place, and no attempt resumes from another.

The rule (``core/places.py``) is lexical on the URI as written; what it accepts must name, read as
a learner reads it (``FFDL_RESUME_FROM``: the URI less ``file://``), a path strictly inside the
place, without any normalising step that could take it elsewhere.
"""

from __future__ import annotations

import posixpath
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ffdl.adapters.bus import open_bus
from ffdl.adapters.launchers.environment import resume_path
from ffdl.core.authorization import Principal
from ffdl.core.decider import decide, resume_point
from ffdl.core.job import Job, evolve
from ffdl.core.places import CheckpointPlaces, checkpoint_problem
from ffdl.core.reconcile import ActionKind, next_action
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import command_from_json
from ffdl.events.envelope import Command, EventData
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, LossReason, Placement
from ffdl.handlers.context import ReactionContext
from ffdl.handlers.launching import launch
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.ports import LaunchRequest, LearnerHandle
from tests.job_history import folded_job, running_job

NOW = datetime(2026, 1, 1, tzinfo=UTC)
E = TypeVar("E", bound=EventData)
PLACES = CheckpointPlaces("/learners/{job_id}/checkpoints")
PLACE = "/learners/job-1/checkpoints"

#: URIs made of the pieces path tricks are made of.
_PIECES = st.sampled_from(
    [
        "/",
        "//",
        ".",
        "..",
        "%2e",
        "%2f",
        "\\",
        "job-1",
        "job-10",
        "checkpoints",
        "checkpoints-evil",
        "learners",
        "step.pt",
        "file:",
        "file://",
        "FILE://",
        "localhost",
        "s3:",
        "@",
        "\x00",
        "\n",
        " ",
        "~",
    ]
)
HOSTILE_URIS = st.one_of(
    st.lists(_PIECES, max_size=12).map("".join),
    st.tuples(
        st.sampled_from(["file://", "", "file://localhost", "FILE://"]),
        st.just(PLACE),
        st.lists(_PIECES, max_size=8).map("".join),
    ).map("".join),
    st.text(max_size=60),
    # well-formed paths inside the place, often accepted: the property's own path runs on them
    st.tuples(
        st.sampled_from(["file://", ""]),
        st.just(PLACE + "/"),
        st.lists(
            st.from_regex(r"[A-Za-z0-9_-]{1,12}(\.[a-z]{1,3})?", fullmatch=True), min_size=1, max_size=4
        ).map("/".join),
    ).map("".join),
)


@given(HOSTILE_URIS)
@example(f"file://{PLACE}/attempt-1/step-1.pt")  # accepted: what follows runs every time
def test_what_is_accepted_is_read_by_the_learner_as_a_path_strictly_inside_the_place(uri: str) -> None:
    if checkpoint_problem(uri, PLACE) is not None:
        return
    checkpoint = Checkpoint(rank=0, attempt=1, step=1, uri=uri)
    path = resume_path(checkpoint, PLACE)
    assert path.startswith(PLACE + "/")
    assert posixpath.normpath(path).startswith(PLACE + "/")
    assert ".." not in path.split("/") and "%" not in path and "\\" not in path and path.isprintable()


@pytest.mark.parametrize(
    "uri",
    [
        f"file://{PLACE}/step-5.pt",
        f"{PLACE}/step-5.pt",
        f"file://{PLACE}/attempt-2/rank-0/",
    ],
)
def test_a_checkpoint_inside_the_place_is_believed(uri: str) -> None:
    assert PLACES.problem("job-1", uri) is None


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("file:///tmp/evil-ckpt.pt", "does not lie in the job's checkpoint place"),
        (f"file://{PLACE}/../../job-2/checkpoints/x.pt", "'..'"),
        (f"file://{PLACE}/./x.pt", "'.'"),
        (f"file://{PLACE}//x.pt", "empty"),
        (f"file://{PLACE}/%2e%2e/x.pt", "percent-encoding"),
        (f"file://{PLACE}/a\\..\\x.pt", "backslash"),
        (f"file://attacker{PLACE}/x.pt", "without a host"),
        (f"file://localhost{PLACE}/x.pt", "without a host"),
        (f"file://{PLACE}-evil/x.pt", "does not lie"),
        ("file:///learners/job-10/checkpoints/x.pt", "does not lie"),
        (f"file://{PLACE}", "does not lie"),
        (f"file://{PLACE}/", "does not lie"),
        (f"FILE://{PLACE}/x.pt", "does not lie"),
        (f"s3://bucket{PLACE}/x.pt", "does not lie"),
        (f"file:{PLACE}/x.pt", "not an absolute path"),
        ("learners/job-1/checkpoints/x.pt", "not an absolute path"),
        (f"file://{PLACE}/x\n.pt", "unprintable"),
    ],
)
def test_a_checkpoint_anywhere_else_is_refused_with_the_reason(uri: str, why: str) -> None:
    problem = PLACES.problem("job-1", uri)
    assert problem is not None and why in problem


@pytest.mark.parametrize("job_id", ["..", ".", "a/b", "a%2fb", "", "x\n"])
def test_a_job_id_that_names_no_directory_has_no_place(job_id: str) -> None:
    assert PLACES.place(job_id) is None
    assert PLACES.problem(job_id, f"file:///learners/{job_id}/checkpoints/x") is not None


def test_a_store_prefix_confines_to_the_jobs_own_prefix() -> None:
    store = CheckpointPlaces("s3://bucket/ckpt/{job_id}")
    assert store.problem("job-1", "s3://bucket/ckpt/job-1/step-5") is None
    assert store.problem("job-1", "s3://bucket/ckpt/job-10/step-5") is not None
    assert store.problem("job-1", "s3://bucket.evil/ckpt/job-1/step-5") is not None
    assert store.problem("job-1", "file:///ckpt/job-1/step-5") is not None


def running(checkpoints: tuple[Checkpoint, ...] = ()) -> Job:
    return running_job("victim", NOW, checkpoints)[0]


def command(job: Job, data: cmd.CommandData) -> Command:
    return Command(
        command_id=uuid.uuid4(),
        issued_at=NOW,
        producer="monitor@test",
        job_id=job.job_id,
        tenant=job.tenant,
        data=data,
    )


def test_the_owner_rejects_a_forged_checkpoint_with_the_reason_on_the_job() -> None:
    job = running()
    forged = Checkpoint(rank=0, attempt=1, step=10**6, uri="file:///tmp/evil-ckpt.pt")

    (event,) = decide(job, command(job, cmd.ReportCheckpoint(checkpoint=forged)), NOW, checkpoints=PLACES)

    assert isinstance(event.data, ev.CommandRejected)
    assert event.data.reason.startswith("checkpoint 'file:///tmp/evil-ckpt.pt' refused: it does not lie")


def test_the_owner_records_a_checkpoint_inside_the_place() -> None:
    job = running()
    own = Checkpoint(rank=0, attempt=1, step=5, uri=f"file://{PLACE}/step-5.pt")

    (event,) = decide(job, command(job, cmd.ReportCheckpoint(checkpoint=own)), NOW, checkpoints=PLACES)

    assert event.data == ev.CheckpointRecorded(checkpoint=own)


def test_no_attempt_resumes_from_a_checkpoint_an_older_platform_recorded_outside_the_place() -> None:
    own = Checkpoint(rank=0, attempt=1, step=5, uri=f"file://{PLACE}/step-5.pt")
    forged = Checkpoint(rank=0, attempt=1, step=424242, uri="file:///tmp/evil-ckpt.pt")
    job = running((own, forged))
    assert job.latest_checkpoint == forged

    assert resume_point(job, PLACES) == own
    failed = cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=1)
    assert payloads(job, failed, ev.JobRestarting)[0].resume_from == own
    halting = job
    for event in decide(job, command(job, cmd.HaltJob()), NOW, checkpoints=PLACES):
        halting = evolve(halting, event)
    stopped = cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0)
    assert payloads(halting, stopped, ev.JobHalted)[0].checkpoint == own


def payloads(job: Job, data: cmd.CommandData, kind: type[E]) -> list[E]:
    """The payloads of type ``kind`` that the owner decides for ``data`` on ``job``."""
    return [
        e.data for e in decide(job, command(job, data), NOW, checkpoints=PLACES) if isinstance(e.data, kind)
    ]


class Launches:
    """A launcher that notes the launches it was asked for."""

    def __init__(self) -> None:
        self.launched: list[LaunchRequest] = []

    async def launch(self, request: LaunchRequest) -> None:
        self.launched.append(request)

    async def stop(self, job_id: str, grace_s: float) -> None:
        return None

    async def running(self) -> list[LearnerHandle]:
        return []

    async def close(self) -> None:
        return None


async def test_a_launch_an_older_platform_decided_from_a_forged_checkpoint_is_refused(tmp_path: Path) -> None:
    forged = Checkpoint(rank=0, attempt=1, step=424242, uri="file:///tmp/evil-ckpt.pt")
    spec = JobSpec(name="victim", command="true", learners=1, gpus=1)
    placement = Placement(learners=(LearnerPlacement(rank=0, node="node-a", gpus=(0,)),))
    datas: list[EventData] = [
        ev.JobSubmitted(spec=spec),
        ev.JobAccepted(),
        ev.JobQueued(),
        ev.GpusAllocated(placement=placement),
        ev.JobLaunching(attempt=1, resume_from=forged),
    ]
    job = folded_job(datas, NOW, job_id="job-1")[0]
    bus = open_bus(f"embedded://{tmp_path}", 1)
    await bus.start()
    launcher = Launches()
    ctx = ReactionContext(
        sender=CommandSender(bus, Topics(), "reactor@test", Principal.platform("reactor")),
        launcher=launcher,
        checkpoints=PLACES,
    )
    action = next_action(job, NOW)
    assert action is not None and action.kind is ActionKind.LAUNCH
    try:
        await launch(job, action, ctx)
        (sent,) = [command_from_json(record.value).data async for record in bus.read(Topics().commands, 0)]
    finally:
        await bus.close()

    assert launcher.launched == []
    assert isinstance(sent, cmd.ReportLearnerLost) and sent.reason is LossReason.VANISHED
    assert "resume point 'file:///tmp/evil-ckpt.pt' refused" in sent.detail
