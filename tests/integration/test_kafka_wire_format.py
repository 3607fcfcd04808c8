"""The wire format of docs/events.md is what the platform reads and writes, and outsiders can use it.

The doc's examples are rendered here from the real models (:func:`render_examples`), one per command
and event type, so they cannot drift: a test fails when the doc differs from the rendering (rewrite
it with ``.venv/bin/python -m tests.integration.test_kafka_wire_format``), another decodes every
example the doc shows, and every reason the codec gives for bad input maps to a class of the
dead-letter metric. Then the doc's own producer program, which uses confluent-kafka (librdkafka, a
client we did not write), submits a job to a platform on a real broker, and the job completes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ffdl.adapters.api.metrics import reason_class
from ffdl.adapters.config import KafkaConfig, Settings
from ffdl.events import commands as cmd
from ffdl.events import types as ev
from ffdl.events.codec import (
    DecodeError,
    cloudevent_headers,
    command_from_json,
    command_headers,
    command_to_json,
    event_from_json,
    event_to_json,
)
from ffdl.events.commands import COMMAND_TYPES
from ffdl.events.envelope import Command, CommandData, Event, EventData, derived_id
from ffdl.events.model import (
    Checkpoint,
    ErrorCode,
    JobSpec,
    LearnerPlacement,
    LossReason,
    Placement,
    ResultSummary,
    WaitReason,
)
from ffdl.events.types import EVENT_TYPES
from tests.harness import Api, fast_settings
from tests.services import TansuBroker, wait_until_async

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"
BEGIN, END = "<!-- BEGIN GENERATED: examples -->", "<!-- END GENERATED: examples -->"

JOB_ID = "resnet50-3f9a1c2e"
TENANT = "vision"
AT = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
_IDS = uuid.UUID("0f5d4f6e-8a43-4c8e-9d0e-3b6c1f2a7e90")

SPEC = JobSpec(
    name="resnet50",
    command="python train.py --epochs 90",
    learners=2,
    gpus=4,
    gpu_type="a100",
    image="pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
    framework="pytorch",
    framework_version="2.3",
    data_dir="s3://datasets/imagenet",
    result_dir="s3://results/resnet50",
    labels={"team": "vision"},
    progress_timeout_s=600,
)
PLACEMENT = Placement(
    learners=(
        LearnerPlacement(rank=0, node="gpu-node-1", gpus=(0, 1, 2, 3), gpu_type="a100"),
        LearnerPlacement(rank=1, node="gpu-node-1", gpus=(4, 5, 6, 7), gpu_type="a100"),
    )
)
CHECKPOINT = Checkpoint(
    rank=0,
    attempt=1,
    step=12000,
    uri="s3://results/resnet50/checkpoints/step-12000",
    size_bytes=102_760_448,
    checksum="sha256:9f2c4e1d",
)
RESULT = ResultSummary(
    result_dir="s3://results/resnet50", files=12, size_bytes=412_000_000, metrics={"top1": 0.761}
)

#: Command type -> (who sends it and when, an example payload).
COMMAND_EXAMPLES: dict[str, tuple[str, CommandData]] = {
    "SubmitJob": (
        "A user or service asks for a new job (the API sends it for POST /v1/jobs).",
        cmd.SubmitJob(spec=SPEC),
    ),
    "AdmitJob": ("Admission: the job can run on this cluster and may queue.", cmd.AdmitJob()),
    "RejectJob": (
        "Admission: the job can never run here.",
        cmd.RejectJob(code=ErrorCode.UNSCHEDULABLE, reason="2 learner(s) x 16 GPU(s) can never fit"),
    ),
    "AllocateGpus": (
        "The scheduler reserves the whole gang's GPUs (with its fencing token).",
        cmd.AllocateGpus(placement=PLACEMENT, reason="placed 2 learner(s) x 4 GPU(s) on 1 node(s) (pack)"),
    ),
    "RecordWaitReason": (
        "The scheduler says why a queued job does not start yet (with its fencing token).",
        cmd.RecordWaitReason(
            code=WaitReason.CAPACITY, detail="8 GPUs needed, 4 free", waiting_for=("bert-large-0c1d2e3f",)
        ),
    ),
    "BeginLaunch": ("The launcher starts an attempt once GPUs are reserved.", cmd.BeginLaunch(attempt=1)),
    "ReportLearnerStarted": (
        "The monitor saw a learner's first heartbeat.",
        cmd.ReportLearnerStarted(rank=0, attempt=1, pid=4242, host="gpu-node-1"),
    ),
    "ReportProgress": (
        "The monitor (or a learner's telemetry) reports a learner's step and metrics.",
        cmd.ReportProgress(rank=0, attempt=1, step=12000, metrics={"loss": 1.234, "top1": 0.52}),
    ),
    "ReportCheckpoint": ("A learner wrote a checkpoint.", cmd.ReportCheckpoint(checkpoint=CHECKPOINT)),
    "ReportLearnerExited": (
        "A learner's process exited with this code.",
        cmd.ReportLearnerExited(rank=1, attempt=1, exit_code=0),
    ),
    "ReportLearnerLost": (
        "The monitor lost a learner that reported no exit.",
        cmd.ReportLearnerLost(
            rank=1, attempt=1, reason=LossReason.HUNG, detail="no progress for 600s (step 12000)"
        ),
    ),
    "HaltJob": (
        "A user halts a job with a checkpoint (``requeue``: the scheduler preempts it).",
        cmd.HaltJob(reason="maintenance on gpu-node-1"),
    ),
    "ResumeJob": ("A user resumes a halted job from its last checkpoint.", cmd.ResumeJob()),
    "CancelJob": ("A user cancels a job.", cmd.CancelJob(reason="wrong learning rate")),
    "FinishStoring": (
        "The platform recorded the results of a job whose learners all exited 0.",
        cmd.FinishStoring(result=RESULT),
    ),
    "ReleaseGpus": ("The finaliser stopped what was left of an ended or halted job.", cmd.ReleaseGpus()),
    "DeleteJob": ("A user removes an ended job from the listings.", cmd.DeleteJob()),
}

#: Event type -> (what it records, an example payload).
EVENT_EXAMPLES: dict[str, tuple[str, EventData]] = {
    "JobSubmitted": (
        "A job exists: its spec, and who submitted it.",
        ev.JobSubmitted(spec=SPEC, submitted_by="api@ffdl-0"),
    ),
    "JobAccepted": ("Admission accepted the job.", ev.JobAccepted()),
    "JobRejected": (
        "Admission refused the job.",
        ev.JobRejected(code=ErrorCode.UNSCHEDULABLE, reason="2 learner(s) x 16 GPU(s) can never fit"),
    ),
    "JobQueued": ("The job waits for GPUs.", ev.JobQueued(reason="waiting for GPUs")),
    "JobWaiting": (
        "Why the queued job does not start yet (only when the reason changes).",
        ev.JobWaiting(
            code=WaitReason.CAPACITY, detail="8 GPUs needed, 4 free", waiting_for=("bert-large-0c1d2e3f",)
        ),
    ),
    "GpusAllocated": (
        "The gang's GPUs are reserved.",
        ev.GpusAllocated(placement=PLACEMENT, reason="placed 2 learner(s) x 4 GPU(s) on 1 node(s) (pack)"),
    ),
    "JobLaunching": ("An attempt's learners are being started.", ev.JobLaunching(attempt=1)),
    "LearnerStarted": ("A learner is up.", ev.LearnerStarted(rank=0, attempt=1, pid=4242, host="gpu-node-1")),
    "JobRunning": ("Every learner of the attempt is up.", ev.JobRunning(attempt=1)),
    "LearnerProgressed": (
        "A learner's step and metrics.",
        ev.LearnerProgressed(rank=0, attempt=1, step=12000, metrics={"loss": 1.234, "top1": 0.52}),
    ),
    "CheckpointRecorded": (
        "A checkpoint the platform recorded.",
        ev.CheckpointRecorded(checkpoint=CHECKPOINT),
    ),
    "LearnerExited": ("A learner exited.", ev.LearnerExited(rank=1, attempt=1, exit_code=0)),
    "LearnerLost": (
        "A learner is gone without an exit (lease expired, hung, vanished).",
        ev.LearnerLost(rank=1, attempt=1, reason=LossReason.HUNG, detail="no progress for 600s (step 12000)"),
    ),
    "JobRestarting": (
        "The gang restarts as a new attempt after a backoff, from a checkpoint.",
        ev.JobRestarting(attempt=2, reason="learner 1 hung", backoff_s=2.0, resume_from=CHECKPOINT),
    ),
    "HaltRequested": (
        "A halt was asked for.",
        ev.HaltRequested(reason="maintenance on gpu-node-1", requested_by="api@ffdl-0"),
    ),
    "JobHalted": (
        "Every learner stopped; the job can resume from the checkpoint.",
        ev.JobHalted(checkpoint=CHECKPOINT),
    ),
    "ResumeRequested": ("A resume was asked for.", ev.ResumeRequested(requested_by="api@ffdl-0")),
    "CancelRequested": (
        "A cancel was asked for.",
        ev.CancelRequested(reason="wrong learning rate", requested_by="api@ffdl-0"),
    ),
    "JobCancelled": ("The job ended, cancelled.", ev.JobCancelled(reason="wrong learning rate")),
    "JobStoring": ("Every learner exited 0; results are being recorded.", ev.JobStoring(attempt=1)),
    "JobCompleted": ("The job ended well; what it left.", ev.JobCompleted(result=RESULT)),
    "JobDeleted": (
        "An ended job left the listings (its history stays).",
        ev.JobDeleted(requested_by="api@ffdl-0"),
    ),
    "JobFailed": (
        "The job ended in failure, with whose fault it was (C: the user's, P: the platform's).",
        ev.JobFailed(code=ErrorCode.LEARNER_FAILED, reason="learner 0 exited with code 1 after 3 restarts"),
    ),
    "GpusReleased": ("The gang's GPUs are free again.", ev.GpusReleased(placement=PLACEMENT)),
    "CommandRejected": (
        "A command that was illegal in the job's state (the job's owner moved on).",
        ev.CommandRejected(
            command_id=str(derived_id(_IDS, "ResumeJob", 0)),
            command_type="ResumeJob",
            reason="only a HALTED job can be resumed; this one is RUNNING",
        ),
    ),
}


#: Who sends each kind of command (the rest come from the API, on a user's request).
_SENDERS = {
    "AdmitJob": "reactor",
    "RejectJob": "reactor",
    "BeginLaunch": "reactor",
    "FinishStoring": "reactor",
    "ReleaseGpus": "reactor",
    "AllocateGpus": "scheduler",
    "RecordWaitReason": "scheduler",
    "ReportLearnerStarted": "monitor",
    "ReportProgress": "monitor",
    "ReportCheckpoint": "monitor",
    "ReportLearnerExited": "monitor",
    "ReportLearnerLost": "monitor",
}
SCHEDULER_TOKEN = 3


def example_command(data: CommandData) -> Command:
    sender = _SENDERS.get(data.type_name(), "api")
    return Command(
        command_id=derived_id(_IDS, data.type_name(), 0),
        job_id=JOB_ID,
        tenant=TENANT,
        issued_at=AT,
        producer=f"{sender}@ffdl-0",
        correlation_id=derived_id(_IDS, "SubmitJob", 0),
        fencing_token=SCHEDULER_TOKEN if sender == "scheduler" else None,
        data=data,
    )


def example_event(data: EventData, seq: int) -> Event:
    cause = derived_id(_IDS, data.type_name(), 1)
    return Event(
        event_id=derived_id(cause, "owner@ffdl-0", 0),
        job_id=JOB_ID,
        tenant=TENANT,
        seq=seq,
        occurred_at=AT + timedelta(seconds=seq),
        causation_id=cause,
        correlation_id=derived_id(_IDS, "SubmitJob", 0),
        producer="owner@ffdl-0",
        fencing_token=SCHEDULER_TOKEN if data.type_name() in ("GpusAllocated", "JobWaiting") else None,
        data=data,
    )


def _json_block(value: bytes) -> str:
    """``value`` pretty-printed, ``type`` and ``schema_version`` first and ``data`` last, for reading."""
    raw = json.loads(value)
    first, last = ("type", "schema_version"), ("data",)
    ordered = {key: raw[key] for key in (*first, *sorted(set(raw) - {*first, *last}), *last)}
    return "```json\n" + json.dumps(ordered, indent=2, ensure_ascii=False) + "\n```\n"


def _heading(name: str, version: int) -> str:
    return f"### {name} · v{version}\n"


def _headers_table(headers: list[tuple[str, bytes]]) -> str:
    rows = "".join(f"| `{name}` | `{value.decode()}` |\n" for name, value in headers)
    return "| header | value |\n|---|---|\n" + rows


def render_examples() -> str:
    """The generated part of docs/events.md: every command and event type, an example of each."""
    parts = [BEGIN, "\n\n## Commands (topic `ffdl.commands`)\n\n"]
    submit = example_command(COMMAND_EXAMPLES["SubmitJob"][1])
    parts.append("Headers of the `SubmitJob` example (CloudEvents Kafka binding, binary mode):\n\n")
    parts.append(_headers_table(command_headers(submit, "api@ffdl-0")))
    for name, (what, command_data) in COMMAND_EXAMPLES.items():
        parts.append("\n" + _heading(name, command_data.VERSION) + "\n" + what + "\n\n")
        parts.append(_json_block(command_to_json(example_command(command_data))))
    parts.append("\n## Events (topic `ffdl.events`)\n\n")
    submitted = example_event(EVENT_EXAMPLES["JobSubmitted"][1], 1)
    parts.append("Headers of the `JobSubmitted` example:\n\n")
    parts.append(_headers_table(cloudevent_headers(submitted, "owner@ffdl-0")))
    for seq, (name, (what, event_data)) in enumerate(EVENT_EXAMPLES.items(), start=1):
        parts.append("\n" + _heading(name, event_data.VERSION) + "\n" + what + "\n\n")
        parts.append(_json_block(event_to_json(example_event(event_data, seq))))
    parts.append("\n" + END)
    return "".join(parts)


def generated_part(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def doc_examples(text: str) -> Iterator[tuple[str, str, int, str]]:
    """(section, type, version, JSON) of every example in the doc's generated part."""
    section = ""
    for match in re.finditer(
        r"^## (Commands|Events)|^### (\w+) · v(\d+)\n\n.*?\n\n```json\n(.*?)\n```", text, re.M | re.S
    ):
        if match.group(1):
            section = match.group(1)
        else:
            yield section, match.group(2), int(match.group(3)), match.group(4)


# --------------------------------------------------------------------------- the doc


def test_the_doc_shows_an_example_of_every_command_and_event_type() -> None:
    assert sorted(COMMAND_EXAMPLES) == sorted(COMMAND_TYPES), "add an example for each new command type"
    assert sorted(EVENT_EXAMPLES) == sorted(EVENT_TYPES), "add an example for each new event type"
    shown = {(section, name) for section, name, _, _ in doc_examples(generated_part(DOC.read_text()))}
    assert shown == {("Commands", n) for n in COMMAND_TYPES} | {("Events", n) for n in EVENT_TYPES}


def test_the_doc_examples_are_what_the_models_write_now() -> None:
    assert generated_part(DOC.read_text()) == render_examples(), (
        "docs/events.md is stale: run .venv/bin/python -m tests.integration.test_kafka_wire_format"
    )


def test_every_example_in_the_doc_decodes_to_its_type_and_version() -> None:
    examples = list(doc_examples(generated_part(DOC.read_text())))
    assert examples
    for section, name, version, text in examples:
        decoded = command_from_json(text) if section == "Commands" else event_from_json(text)
        assert (decoded.type, decoded.schema_version) == (name, version)
        encode = command_to_json if isinstance(decoded, Command) else event_to_json
        assert json.loads(encode(decoded)) == json.loads(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "label"),
    [
        (lambda raw: b"\xff not JSON", "undecodable"),
        (lambda raw: b"[1, 2]", "undecodable"),
        (lambda raw: _with(raw, type=None), "undecodable"),
        (lambda raw: _with(raw, data=[]), "undecodable"),
        (lambda raw: _with(raw, schema_version="1"), "undecodable"),
        (lambda raw: _with(raw, type="LaunchRockets"), "unknown_type"),
        (lambda raw: _with(raw, schema_version=99), "schema_version"),
        (lambda raw: _with(raw, schema_version=0), "schema_version"),
        (lambda raw: _with(raw, data={"spec": {"name": "Not A DNS Name", "command": "true"}}), "invalid"),
        (lambda raw: _with(raw, job_id=""), "invalid"),
    ],
)
def test_every_reason_the_codec_gives_for_bad_input_has_a_dead_letter_class(change: Any, label: str) -> None:
    submit = command_to_json(example_command(COMMAND_EXAMPLES["SubmitJob"][1]))
    with pytest.raises(DecodeError) as refused:
        command_from_json(change(submit))
    assert reason_class(refused.value.reason) == label


def _with(value: bytes, **changes: Any) -> bytes:
    """A command's JSON with top-level fields changed (``None``: removed)."""
    raw = {**json.loads(value), **changes}
    return json.dumps({k: v for k, v in raw.items() if v is not None}).encode()


# --------------------------------------------------------------------------- an outside producer


def doc_program(text: str) -> str:
    """The Python program of the doc's "Producing commands from outside" section."""
    section = text[text.index("## Producing commands from outside") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```\n", start)]


@pytest.fixture(scope="module")
def broker() -> Iterator[TansuBroker]:
    server = TansuBroker()
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def settings(tmp_path: Path, broker: TansuBroker) -> Settings:
    return fast_settings(
        tmp_path / "ffdl",
        bus=broker.url,
        kafka=KafkaConfig(session_timeout_s=2.0, heartbeat_interval_s=0.2),
        launcher="instant",
        topic_prefix=f"test-{uuid.uuid4().hex[:10]}",
        nodes=[{"name": "node-a", "gpus": 8}],
    )


@pytest.mark.integration
async def test_a_job_submitted_by_the_docs_confluent_kafka_program_runs_to_completed(
    api: Api, settings: Settings, broker: TansuBroker
) -> None:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": broker.bootstrap,
        "FFDL_COMMANDS_TOPIC": f"{settings.topic_prefix}.commands",
    }
    run = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", doc_program(DOC.read_text())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip().splitlines()[-1]

    async def known() -> bool:
        return (await api.http.get(f"/v1/jobs/{job_id}")).status_code == 200

    await wait_until_async(known, 30, what=f"job {job_id} projected")
    job = await api.wait(job_id, "COMPLETED")
    assert job["tenant"] == "default"
    assert job["spec"]["command"] == "python train.py --epochs 90"


if __name__ == "__main__":
    current = DOC.read_text()
    DOC.write_text(current.replace(generated_part(current), render_examples()))
    print(f"rewrote the examples in {DOC}")
