"""The wire format of docs/events.md is what the platform reads and writes, and outsiders can use it.

The doc's examples are rendered here from the real models (:func:`render_examples`), one per command
and event type of jobs and of nodes, so they cannot drift: a test fails when the doc differs from
the rendering (rewrite it with ``.venv/bin/python -m tests.integration.test_kafka_wire_format``),
another decodes every example the doc shows the way a reader of either topic must (dispatching on
the type: a job's or a node's), every example's key and CloudEvents subject are its job id or
``node:<name>``, and every reason the codec gives for bad input maps to a class of the dead-letter
metric. Then the doc's own producer programs, which use confluent-kafka (librdkafka, a client we did
not write), run against a platform on a real broker: one submits a job on its tenant's own topic,
which completes; the other, an operator's, drains a node, which the platform records as the
operator's drain.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import (
    AnyCommand,
    AnyEvent,
    DecodeError,
    any_command_from_json,
    any_event_from_json,
    cloudevent_headers,
    command_from_json,
    command_headers,
    command_to_json,
    event_from_json,
    event_to_json,
)
from ffdl.events.envelope import (
    Command,
    CommandData,
    Event,
    EventData,
    NodeCommand,
    NodeCommandData,
    NodeEvent,
    NodeEventData,
    Payload,
)
from ffdl.events.ids import derived_id
from ffdl.events.job_commands import COMMAND_TYPES
from ffdl.events.job_events import EVENT_TYPES
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
from ffdl.events.nodes import NODE_COMMAND_TYPES, NODE_EVENT_TYPES
from ffdl.handlers.deadletters import reason_class
from ffdl.wiring.config import KafkaConfig, Settings
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
    "AdmitJob": (
        "The scheduler's admission: the job fits the inventory and may queue (with its fencing token).",
        cmd.AdmitJob(),
    ),
    "RejectJob": (
        "The scheduler's admission: the job can never fit the inventory (with its fencing token).",
        cmd.RejectJob(code=ErrorCode.UNSCHEDULABLE, reason="2 learner(s) x 16 GPU(s) can never fit"),
    ),
    "AllocateGpus": (
        "The scheduler reserves the whole gang's GPUs (with its fencing token); the owner launches the "
        "job's next attempt in the same decision.",
        cmd.AllocateGpus(placement=PLACEMENT, reason="placed 2 learner(s) x 4 GPU(s) on 1 node(s) (pack)"),
    ),
    "RecordWaitReason": (
        "The scheduler says why a queued job does not start yet (with its fencing token).",
        cmd.RecordWaitReason(
            code=WaitReason.CAPACITY, detail="8 GPUs needed, 4 free", waiting_for=("bert-large-0c1d2e3f",)
        ),
    ),
    "BeginLaunch": (
        "The reactor begins the next attempt once a restart's backoff is over (and launches a job that an "
        "owner of an older release left SCHEDULED).",
        cmd.BeginLaunch(attempt=2),
    ),
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
        "The gang's GPUs are reserved; a `JobLaunching` follows in the same decision.",
        ev.GpusAllocated(placement=PLACEMENT, reason="placed 2 learner(s) x 4 GPU(s) on 1 node(s) (pack)"),
    ),
    "JobLaunching": (
        "An attempt's learners are being started: decided with the allocation (with the scheduler's "
        "token), or after a restart on the reactor's `BeginLaunch` (as here).",
        ev.JobLaunching(attempt=2),
    ),
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


NODE = "gpu-node-1"
NODE_SPEC = nd.NodeSpec(gpus=8, gpu_type="a100", cpus=96.0, memory_mb=1_048_576)
_NODE_CORDON = "unschedulable in the Kubernetes nodes"

#: Node command type -> (who sends it and when, an example payload).
NODE_COMMAND_EXAMPLES: dict[str, tuple[str, NodeCommandData]] = {
    "ObserveNode": (
        "The scheduler leader's inventory source sees the node ready with this capacity: a new node, one "
        "back, other capacity, or the source's own cordon put or lifted (`cordoned`). Fenced.",
        nd.ObserveNode(spec=NODE_SPEC, reason="seen by the Kubernetes nodes"),
    ),
    "ReportNodeLost": (
        "The scheduler leader's inventory source has the node, but it is not ready. Fenced.",
        nd.ReportNodeLost(reason="KubeletNotReady: container runtime is down"),
    ),
    "RemoveNode": (
        "The node left the scheduler leader's inventory source. Fenced.",
        nd.RemoveNode(reason="no longer in the Kubernetes nodes"),
    ),
    "CordonNode": (
        "An operator cordons the node (`ffdl nodes cordon`, `POST /v1/nodes/{name}:cordon`); with "
        "`drain` its jobs also move elsewhere (`ffdl nodes drain`).",
        nd.CordonNode(reason="replace GPU 3", drain=True),
    ),
    "UncordonNode": (
        "An operator lifts the operator's cordon or drain (`ffdl nodes uncordon`, "
        "`POST /v1/nodes/{name}:uncordon`).",
        nd.UncordonNode(reason="GPU 3 replaced"),
    ),
}

#: Node event type -> (what it records, an example payload).
NODE_EVENT_EXAMPLES: dict[str, tuple[str, NodeEventData]] = {
    "NodeJoined": (
        "The node is in the inventory with this capacity: new, or back after it was lost or removed.",
        nd.NodeJoined(spec=NODE_SPEC, reason="seen by the Kubernetes nodes"),
    ),
    "NodeResized": (
        "The inventory reports other capacity for the node (a GPU failed, allocatable changed).",
        nd.NodeResized(spec=NODE_SPEC.model_copy(update={"gpus": 7}), reason="seen by the Kubernetes nodes"),
    ),
    "NodeCordoned": (
        "Nothing new is placed on the node; `source` says who cordoned it (`operator` or `inventory`), "
        "and with `drain` its jobs are halted with a checkpoint and requeued to resume elsewhere.",
        nd.NodeCordoned(reason="replace GPU 3", source=nd.CordonSource.OPERATOR, drain=True),
    ),
    "NodeUncordoned": (
        "The cordon (and drain) is lifted: the node takes new learners again.",
        nd.NodeUncordoned(reason="GPU 3 replaced"),
    ),
    "NodeLost": (
        "The node is unreachable or not ready: out of the inventory, its jobs resume elsewhere.",
        nd.NodeLost(reason="KubeletNotReady: container runtime is down"),
    ),
    "NodeRemoved": (
        "The node left the inventory on purpose (its cordon goes with it); its jobs resume elsewhere.",
        nd.NodeRemoved(reason="no longer in the Kubernetes nodes"),
    ),
    "NodeCommandRejected": (
        "A node command that was illegal in the node's state (here: an operator's uncordon of the "
        "inventory's own cordon, which is lifted at its source).",
        nd.NodeCommandRejected(
            command_id=str(derived_id(_IDS, "NodeCommandRejected", 1)),
            command_type="UncordonNode",
            reason=f"node {NODE} is cordoned by its inventory ({_NODE_CORDON}): lift it there",
        ),
    ),
}


#: Who sends each kind of command (the rest come from the API, on a user's or an operator's request).
_SENDERS = {
    "BeginLaunch": "reactor",
    "FinishStoring": "reactor",
    "ReleaseGpus": "reactor",
    "AdmitJob": "scheduler",
    "RejectJob": "scheduler",
    "AllocateGpus": "scheduler",
    "RecordWaitReason": "scheduler",
    "ReportLearnerStarted": "monitor",
    "ReportProgress": "monitor",
    "ReportCheckpoint": "monitor",
    "ReportLearnerExited": "monitor",
    "ReportLearnerLost": "monitor",
    "ObserveNode": "scheduler",
    "ReportNodeLost": "scheduler",
    "RemoveNode": "scheduler",
}
#: Events caused by the scheduler's commands, which carry its fencing token.
_FENCED_EVENTS = frozenset(
    {"JobAccepted", "JobQueued", "JobRejected", "JobWaiting", "GpusAllocated"}
    | {"NodeJoined", "NodeResized", "NodeLost", "NodeRemoved"}
)
SCHEDULER_TOKEN = 3
OWNER = "owner@ffdl-0"


def _sender(data: Payload) -> str:
    return f"{_SENDERS.get(data.type_name(), 'api')}@ffdl-0"


def _token(data: Payload) -> int | None:
    fenced = _SENDERS.get(data.type_name()) == "scheduler" or data.type_name() in _FENCED_EVENTS
    return SCHEDULER_TOKEN if fenced else None


def _cause(data: Payload) -> uuid.UUID:
    """The id of the command that caused an example event."""
    return derived_id(_IDS, data.type_name(), 1)


def example_command(data: CommandData) -> Command:
    return Command(
        command_id=derived_id(_IDS, data.type_name(), 0),
        job_id=JOB_ID,
        tenant=TENANT,
        issued_at=AT,
        producer=_sender(data),
        correlation_id=derived_id(_IDS, "SubmitJob", 0),
        fencing_token=_token(data),
        data=data,
    )


def example_event(data: EventData, seq: int) -> Event:
    return Event(
        event_id=derived_id(_cause(data), OWNER, 0),
        job_id=JOB_ID,
        tenant=TENANT,
        seq=seq,
        occurred_at=AT + timedelta(seconds=seq),
        causation_id=_cause(data),
        correlation_id=derived_id(_IDS, "SubmitJob", 0),
        producer=OWNER,
        fencing_token=_token(data),
        data=data,
    )


def example_node_command(data: NodeCommandData) -> NodeCommand:
    """As :meth:`CommandSender.make` makes them for a node: no tenant, no correlation id."""
    return NodeCommand(
        command_id=derived_id(_IDS, data.type_name(), 0),
        node=NODE,
        issued_at=AT,
        producer=_sender(data),
        fencing_token=_token(data),
        data=data,
    )


def example_node_event(data: NodeEventData, seq: int) -> NodeEvent:
    """As the node decider writes them: correlated with the causing command, which started the chain."""
    return NodeEvent(
        event_id=derived_id(_cause(data), OWNER, 0),
        node=NODE,
        seq=seq,
        occurred_at=AT + timedelta(seconds=seq),
        causation_id=_cause(data),
        correlation_id=_cause(data),
        producer=OWNER,
        fencing_token=_token(data),
        data=data,
    )


WireRecord = AnyCommand | AnyEvent


@dataclass(frozen=True, slots=True)
class Section:
    """One section of the generated part: a kind of record, its topic, the types it shows and how a
    reader of that topic decodes them (dispatching on the type, job or node)."""

    topic: str
    types: Mapping[str, type[Payload]]
    envelope: type[WireRecord]
    decode: Callable[[str], WireRecord]


#: The generated part's sections, in the doc's order.
SECTIONS: dict[str, Section] = {
    "Job commands": Section("ffdl.commands", COMMAND_TYPES, Command, any_command_from_json),
    "Job events": Section("ffdl.events", EVENT_TYPES, Event, any_event_from_json),
    "Node commands": Section("ffdl.commands", NODE_COMMAND_TYPES, NodeCommand, any_command_from_json),
    "Node events": Section("ffdl.events", NODE_EVENT_TYPES, NodeEvent, any_event_from_json),
}


def examples() -> dict[str, list[tuple[str, WireRecord]]]:
    """Section -> (what it is, the example record) for every type, in the doc's order."""
    return {
        "Job commands": [(what, example_command(data)) for what, data in COMMAND_EXAMPLES.values()],
        "Job events": [
            (what, example_event(data, seq))
            for seq, (what, data) in enumerate(EVENT_EXAMPLES.values(), start=1)
        ],
        "Node commands": [
            (what, example_node_command(data)) for what, data in NODE_COMMAND_EXAMPLES.values()
        ],
        "Node events": [
            (what, example_node_event(data, seq))
            for seq, (what, data) in enumerate(NODE_EVENT_EXAMPLES.values(), start=1)
        ],
    }


def wire_value(record: WireRecord) -> bytes:
    if isinstance(record, Command | NodeCommand):
        return command_to_json(record)
    return event_to_json(record)


def wire_headers(record: WireRecord) -> list[tuple[str, bytes]]:
    """The headers its producer puts on the record (the source is the producer, as the platform's)."""
    if isinstance(record, Command | NodeCommand):
        return command_headers(record, record.producer)
    return cloudevent_headers(record, record.producer)


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
    """The generated part of docs/events.md: every job and node command and event type, an example of
    each, and the headers of each section's first example."""
    parts = [BEGIN, "\n"]
    for name, shown in examples().items():
        first = shown[0][1]
        parts.append(f"\n## {name} (topic `{SECTIONS[name].topic}`)\n\n")
        parts.append(f"Headers of the `{first.type}` example (CloudEvents Kafka binding, binary mode):\n\n")
        parts.append(_headers_table(wire_headers(first)))
        for what, record in shown:
            parts.append("\n" + _heading(record.type, record.schema_version) + "\n" + what + "\n\n")
            parts.append(_json_block(wire_value(record)))
    parts.append("\n" + END)
    return "".join(parts)


def generated_part(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


_EXAMPLE = re.compile(
    rf"^## ({'|'.join(SECTIONS)}) \(|^### (\w+) · v(\d+)\n\n.*?\n\n```json\n(.*?)\n```", re.M | re.S
)


def doc_examples(text: str) -> Iterator[tuple[str, str, int, str]]:
    """(section, type, version, JSON) of every example in the doc's generated part."""
    section = ""
    for match in _EXAMPLE.finditer(text):
        if match.group(1):
            section = match.group(1)
        else:
            yield section, match.group(2), int(match.group(3)), match.group(4)


# --------------------------------------------------------------------------- the doc


def test_the_doc_shows_an_example_of_every_job_and_node_command_and_event_type() -> None:
    assert sorted(COMMAND_EXAMPLES) == sorted(COMMAND_TYPES), "add an example for each new command type"
    assert sorted(EVENT_EXAMPLES) == sorted(EVENT_TYPES), "add an example for each new event type"
    assert sorted(NODE_COMMAND_EXAMPLES) == sorted(NODE_COMMAND_TYPES), "add an example for each node command"
    assert sorted(NODE_EVENT_EXAMPLES) == sorted(NODE_EVENT_TYPES), "add an example for each node event"
    tables: tuple[Mapping[str, tuple[str, Payload]], ...] = (
        COMMAND_EXAMPLES,
        EVENT_EXAMPLES,
        NODE_COMMAND_EXAMPLES,
        NODE_EVENT_EXAMPLES,
    )
    for table in tables:
        assert [data.type_name() for _, data in table.values()] == list(table), "named by its payload's type"
    shown_in_doc = {(section, name) for section, name, _, _ in doc_examples(generated_part(DOC.read_text()))}
    assert shown_in_doc == {(section, name) for section, kind in SECTIONS.items() for name in kind.types}


def test_the_doc_examples_are_what_the_models_write_now() -> None:
    assert generated_part(DOC.read_text()) == render_examples(), (
        "docs/events.md is stale: run .venv/bin/python -m tests.integration.test_kafka_wire_format"
    )


def test_every_example_in_the_doc_decodes_to_its_type_and_version_and_back() -> None:
    examples_in_doc = list(doc_examples(generated_part(DOC.read_text())))
    assert {section for section, _, _, _ in examples_in_doc} == set(SECTIONS)
    for section, name, version, text in examples_in_doc:
        kind = SECTIONS[section]
        decoded = kind.decode(text)
        assert isinstance(decoded, kind.envelope), f"{name} in {section} decodes to {type(decoded).__name__}"
        assert (decoded.type, decoded.schema_version) == (name, version)
        assert json.loads(wire_value(decoded)) == json.loads(text)


def test_a_reader_of_job_records_only_is_refused_node_records() -> None:
    """Why the doc tells readers to dispatch on the type: the job-only decoders refuse node records."""
    observe = command_to_json(example_node_command(NODE_COMMAND_EXAMPLES["ObserveNode"][1]))
    joined = event_to_json(example_node_event(NODE_EVENT_EXAMPLES["NodeJoined"][1], 1))
    with pytest.raises(DecodeError, match="ObserveNode is a node command"):
        command_from_json(observe)
    with pytest.raises(DecodeError, match="NodeJoined is a node event"):
        event_from_json(joined)


def test_every_examples_key_and_cloudevents_subject_are_its_job_id_or_node_key() -> None:
    for section, shown in examples().items():
        for _, record in shown:
            key = JOB_ID if isinstance(record, Command | Event) else f"node:{NODE}"
            headers = dict(wire_headers(record))
            assert record.key == key
            assert headers["ce_subject"] == key.encode()
            kind = "command." if SECTIONS[section].topic == "ffdl.commands" else ""
            assert headers["ce_type"] == f"io.ffdl.{kind}{record.type}.v{record.schema_version}".encode()


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


@pytest.mark.parametrize(
    ("change", "label"),
    [
        (lambda raw: _with(raw, data=[]), "undecodable"),
        (lambda raw: _with(raw, schema_version=2), "schema_version"),
        (lambda raw: _with(raw, data={"spec": {"gpus": 8}}), "invalid"),
        (lambda raw: _with(raw, data={"spec": {**NODE_SPEC.model_dump(), "gpus": -1}}), "invalid"),
        (lambda raw: _with(raw, node="gpu node 1"), "invalid"),
        (lambda raw: _with(raw, node=None), "invalid"),
        (lambda raw: _with(raw, tenant="vision"), "invalid"),
    ],
)
def test_every_reason_the_codec_gives_for_a_bad_node_command_has_a_dead_letter_class(
    change: Any, label: str
) -> None:
    observe = command_to_json(example_node_command(NODE_COMMAND_EXAMPLES["ObserveNode"][1]))
    with pytest.raises(DecodeError) as refused:
        any_command_from_json(change(observe))
    assert reason_class(refused.value.reason) == label


def _with(value: bytes, **changes: Any) -> bytes:
    """A command's JSON with top-level fields changed (``None``: removed)."""
    raw = {**json.loads(value), **changes}
    return json.dumps({k: v for k, v in raw.items() if v is not None}).encode()


# --------------------------------------------------------------------------- an outside producer


def doc_program(text: str, heading: str) -> str:
    """The first Python program of the doc's section ``heading``."""
    section = text[text.index(f"\n{heading}\n") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```\n", start)]


async def run_doc_program(heading: str, env: Mapping[str, str]) -> str:
    """Run the doc's program in a child Python; what it printed last."""
    run = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", doc_program(DOC.read_text(), heading)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()[-1]


@pytest.fixture
async def settings(tmp_path: Path, broker: TansuBroker) -> Settings:
    return fast_settings(
        tmp_path / "ffdl",
        bus=broker.url,
        kafka=KafkaConfig(session_timeout_s=2.0, heartbeat_interval_s=0.2),
        launcher="instant",
        topic_prefix=f"test-{uuid.uuid4().hex[:10]}",
        nodes=[{"name": "node-a", "gpus": 8}],
        direct_tenants=["default"],
    )


@pytest.mark.integration
async def test_a_job_submitted_by_the_docs_confluent_kafka_program_runs_to_completed(
    api: Api, settings: Settings, broker: TansuBroker
) -> None:
    env = {
        "KAFKA_BOOTSTRAP": broker.bootstrap,
        "FFDL_COMMANDS_TOPIC": f"{settings.topic_prefix}.tenant.default.commands",
    }
    job_id = await run_doc_program("## Producing commands from outside", env)

    async def known() -> bool:
        return (await api.http.get(f"/v1/jobs/{job_id}")).status_code == 200

    await wait_until_async(known, 30, what=f"job {job_id} projected")
    job = await api.wait(job_id, "COMPLETED")
    assert job["tenant"] == "default"
    assert job["spec"]["command"] == "python train.py --epochs 90"


@pytest.mark.integration
async def test_a_node_drained_by_the_docs_confluent_kafka_program_is_drained_by_an_operator(
    api: Api, settings: Settings, broker: TansuBroker
) -> None:
    async def node_a() -> dict[str, Any]:
        response = await api.http.get("/v1/nodes/node-a", params={"history": "true"})
        return dict(response.json()) if response.status_code == 200 else {}

    async def ready() -> bool:  # the scheduler observed it: a node command for it is no dead letter
        return (await node_a()).get("status") == "READY"

    await wait_until_async(ready, 30, what="node-a in the inventory")
    env = {
        "KAFKA_BOOTSTRAP": broker.bootstrap,
        "FFDL_COMMANDS_TOPIC": f"{settings.topic_prefix}.commands",
        "FFDL_NODE": "node-a",
    }
    command_id = await run_doc_program("### Draining a node from outside", env)

    async def answered() -> bool:
        return any(event["causation_id"] == command_id for event in (await node_a())["history"])

    await wait_until_async(answered, 30, what=f"an event caused by {command_id}")
    node = await node_a()
    [event] = [event for event in node["history"] if event["causation_id"] == command_id]
    assert (event["type"], event["data"]) == (
        "NodeCordoned",
        {"reason": "firmware update", "source": "operator", "drain": True},
    )
    assert event["fencing_token"] is None
    assert node["status"] == "DRAINING"
    assert node["cordon"] == {"reason": "firmware update", "source": "operator", "drain": True}


if __name__ == "__main__":
    current = DOC.read_text()
    DOC.write_text(current.replace(generated_part(current), render_examples()))
    print(f"rewrote the examples in {DOC}")
