"""The contract stays a contract: committed JSON Schemas, lossless codec, clear decode errors, upcasting.

A payload's schema may only change together with a version bump, so consumers of an exported log
and services publishing commands are never surprised; the wire format must round-trip every value
exactly, and anything undecodable must say why (that reason goes into the dead-letter record).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.events import codec
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import (
    DecodeError,
    JsonObject,
    command_from_json,
    command_to_json,
    event_from_json,
    event_to_json,
)
from ffdl.events.envelope import Command, Event, EventData, Payload
from ffdl.events.model import (
    Checkpoint,
    ErrorCode,
    JobSpec,
    LearnerPlacement,
    LossReason,
    Placement,
    env_problems,
)
from ffdl.events.schema_export import (
    SCHEMA_DIR,
    all_payload_types,
    export_schemas,
    render_schema,
    schema_filename,
)

EXPORT = "python -m ffdl.events.schema_export"
AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def schema_drift(key: str, cls: type[Payload], directory: Path = SCHEMA_DIR) -> str | None:
    """Why the committed schema of ``cls`` does not match the code, or None when it does."""
    path = directory / schema_filename(key, cls)
    if not path.exists():
        return f"{path.name} is missing: run `{EXPORT}` and commit the new file"
    if path.read_text() != render_schema(cls):
        return (
            f"schema of {key} changed without a version bump: bump VERSION, add an upcaster from the old "
            f"version, and run `{EXPORT}`"
        )
    return None


@pytest.mark.parametrize("key", sorted(all_payload_types()))
def test_committed_schema_matches_the_payload_type(key: str) -> None:
    drift = schema_drift(key, all_payload_types()[key])
    assert drift is None, drift


def test_a_changed_payload_is_reported_as_a_schema_change_without_a_version_bump() -> None:
    class JobQueued(EventData):  # the real JobQueued, with a field added but VERSION kept
        reason: str = ""
        position: int = 0

    drift = schema_drift("event.JobQueued", JobQueued)

    assert drift == (
        "schema of event.JobQueued changed without a version bump: bump VERSION, add an upcaster from the "
        "old version, and run `python -m ffdl.events.schema_export`"
    )


def test_every_committed_schema_file_is_a_known_type_at_a_version_up_to_its_current() -> None:
    types = all_payload_types()
    for path in SCHEMA_DIR.glob("*.json"):
        key, _, version = path.name.removesuffix(".json").rpartition(".v")
        assert key in types, f"{path.name} names no payload type"
        assert 1 <= int(version) <= types[key].VERSION, (
            f"{path.name} is newer than {key} v{types[key].VERSION}"
        )
        assert json.loads(path.read_text())["x-ffdl-schema-version"] == int(version)


def test_export_writes_exactly_the_rendered_schemas(tmp_path: Path) -> None:
    written = export_schemas(tmp_path)

    assert sorted(p.name for p in written) == sorted(
        schema_filename(k, c) for k, c in all_payload_types().items()
    )
    for key, cls in all_payload_types().items():
        assert schema_drift(key, cls, tmp_path) is None


# -- codec round-trips --------------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8"), max_size=24)
names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
# A job's env names only variables it may set (JobSpec.submission_problems): no FFDL_ or LD_ names.
variables = st.from_regex(r"[A-EG-KM-Z_][A-Z0-9_]{0,10}", fullmatch=True).filter(
    lambda name: not env_problems({name: ""})
)
finite = st.floats(-1e9, 1e9, allow_nan=False)
metrics = st.dictionaries(st.text(min_size=1, max_size=8), finite, max_size=3)
ranks = st.integers(0, 64)
attempts = st.integers(1, 20)
job_specs = st.builds(
    JobSpec,
    name=names,
    command=texts.filter(bool),
    learners=st.integers(1, 8),
    gpus=st.integers(0, 8),
    gpu_type=st.none() | names,
    cpus=st.floats(0.1, 64, allow_nan=False),
    env=st.dictionaries(variables, texts.filter(lambda text: "\0" not in text), max_size=3),
    placement=st.sampled_from(("pack", "spread")),
)
checkpoints = st.builds(
    Checkpoint, rank=ranks, attempt=attempts, step=st.integers(0, 10**9), uri=texts.filter(bool)
)
placements = st.builds(
    Placement,
    learners=st.lists(
        st.builds(
            LearnerPlacement, rank=ranks, node=names, gpus=st.lists(st.integers(0, 7), max_size=4).map(tuple)
        ),
        max_size=3,
    ).map(tuple),
)
event_payloads = st.one_of(
    st.builds(ev.JobSubmitted, spec=job_specs, submitted_by=texts),
    st.builds(ev.GpusAllocated, placement=placements, reason=texts),
    st.builds(
        ev.LearnerProgressed, rank=ranks, attempt=attempts, step=st.integers(0, 10**6), metrics=metrics
    ),
    st.builds(
        ev.JobRestarting,
        attempt=attempts,
        reason=texts,
        backoff_s=st.floats(0, 60),
        resume_from=st.none() | checkpoints,
    ),
    st.builds(ev.JobFailed, code=st.sampled_from(ErrorCode), reason=texts),
    st.builds(ev.CommandRejected, command_id=texts, command_type=texts, reason=texts),
)
command_payloads = st.one_of(
    st.builds(cmd.SubmitJob, spec=job_specs),
    st.builds(cmd.AllocateGpus, placement=placements),
    st.builds(cmd.ReportProgress, rank=ranks, attempt=attempts, step=st.integers(0, 10**6), metrics=metrics),
    st.builds(
        cmd.ReportLearnerLost, rank=ranks, attempt=attempts, reason=st.sampled_from(LossReason), detail=texts
    ),
    st.builds(cmd.ReportCheckpoint, checkpoint=checkpoints),
    st.builds(cmd.ResumeJob),
)
instants = st.datetimes(timezones=st.just(UTC))
tokens = st.none() | st.integers(0, 2**40)
events = st.builds(
    Event,
    event_id=st.uuids(),
    job_id=names,
    tenant=names,
    seq=st.integers(1, 2**40),
    occurred_at=instants,
    causation_id=st.none() | st.uuids(),
    correlation_id=st.none() | st.uuids(),
    producer=texts,
    fencing_token=tokens,
    data=event_payloads,
)
commands = st.builds(
    Command,
    command_id=st.uuids(),
    job_id=names,
    tenant=names,
    issued_at=instants,
    producer=texts.filter(bool),
    correlation_id=st.none() | st.uuids(),
    fencing_token=tokens,
    data=command_payloads,
)


@settings(max_examples=75, deadline=None)
@given(event=events)
def test_events_round_trip_through_json(event: Event) -> None:
    assert event_from_json(event_to_json(event)) == event


@settings(max_examples=75, deadline=None)
@given(command=commands)
def test_commands_round_trip_through_json(command: Command) -> None:
    assert command_from_json(command_to_json(command)) == command


# -- decode errors ------------------------------------------------------------------------------


def _queued_event() -> JsonObject:
    event = Event(
        event_id=uuid.UUID(int=1),
        job_id="job-1",
        tenant="acme",
        seq=3,
        occurred_at=AT,
        producer="decider",
        data=ev.JobQueued(reason="waiting"),
    )
    raw: JsonObject = json.loads(event_to_json(event))
    return raw


def _submit_command() -> JsonObject:
    command = Command(
        command_id=uuid.UUID(int=2),
        job_id="job-1",
        tenant="acme",
        issued_at=AT,
        producer="api",
        data=cmd.SubmitJob(spec=JobSpec(name="mnist", command="python train.py")),
    )
    raw: JsonObject = json.loads(command_to_json(command))
    return raw


def _without(raw: JsonObject, *path: str) -> JsonObject:
    """A deep copy of ``raw`` with the field at ``path`` removed."""
    copy: JsonObject = json.loads(json.dumps(raw))
    parent = copy
    for part in path[:-1]:
        parent = parent[part]
    del parent[path[-1]]
    return copy


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\xfe{not json", "not JSON: "),
        (b"[1, 2, 3]", "not a JSON object"),
        (json.dumps({**_queued_event(), "type": "JobTeleported"}), "unknown type 'JobTeleported'"),
        (json.dumps(_without(_queued_event(), "type")), "missing 'type'"),
        (
            json.dumps({**_queued_event(), "schema_version": 7}),
            "JobQueued schema_version 7 is newer than this platform's 1",
        ),
        (json.dumps({**_queued_event(), "data": []}), "'data' must be an object"),
        (json.dumps(_without(_queued_event(), "job_id")), "invalid event envelope: job_id: Field required"),
        (
            json.dumps({**_queued_event(), "data": {"reason": 5}}),
            "invalid JobQueued: reason: Input should be a valid string",
        ),
    ],
    ids=[
        "bytes",
        "array",
        "unknown-type",
        "no-type",
        "newer-version",
        "data-not-object",
        "no-job-id",
        "wrong-field",
    ],
)
def test_undecodable_events_say_why(value: bytes | str, reason: str) -> None:
    with pytest.raises(DecodeError) as error:
        event_from_json(value)
    assert error.value.reason.startswith(reason), error.value.reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\x00\x01", "not JSON: "),
        (b'"SubmitJob"', "not a JSON object"),
        (json.dumps({**_submit_command(), "type": "FormatCluster"}), "unknown type 'FormatCluster'"),
        (json.dumps(_without(_submit_command(), "data", "spec")), "invalid SubmitJob: spec: Field required"),
        (
            json.dumps(_without(_submit_command(), "data", "spec", "command")),
            "invalid SubmitJob: spec.command: Field required",
        ),
        (
            json.dumps(_without(_submit_command(), "tenant")),
            "invalid command envelope: tenant: Field required",
        ),
        (json.dumps({**_submit_command(), "schema_version": 3}), "SubmitJob schema_version 3 is newer"),
    ],
    ids=["bytes", "string", "unknown-type", "no-spec", "no-spec-command", "no-tenant", "newer-version"],
)
def test_undecodable_commands_say_why(value: bytes | str, reason: str) -> None:
    with pytest.raises(DecodeError) as error:
        command_from_json(value)
    assert error.value.reason.startswith(reason), error.value.reason


# -- upcasting ----------------------------------------------------------------------------------


def _note_to_reason(data: JsonObject) -> JsonObject:
    """Version 1 of the (pretend) bumped JobQueued called its reason ``note``."""
    rest = {key: value for key, value in data.items() if key != "note"}
    return {**rest, "reason": data.get("note", "")}


def test_an_older_version_is_upcast_by_its_registered_upcaster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev.JobQueued, "VERSION", 2)
    monkeypatch.setitem(codec.UPCASTERS, ("JobQueued", 1), _note_to_reason)
    old = {**_queued_event(), "schema_version": 1, "data": {"note": "waiting for GPUs"}}

    event = event_from_json(json.dumps(old))

    assert event.data == ev.JobQueued(reason="waiting for GPUs")
    assert event.schema_version == 2
    assert json.loads(event_to_json(event))["schema_version"] == 2
    assert event_from_json(event_to_json(event)) == event  # the current version needs no upcaster


def test_an_older_version_without_an_upcaster_is_a_decode_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev.JobQueued, "VERSION", 2)
    old = {**_queued_event(), "schema_version": 1}

    with pytest.raises(DecodeError, match="no upcaster for JobQueued schema_version 1"):
        event_from_json(json.dumps(old))
