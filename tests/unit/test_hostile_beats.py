"""What a hostile agent writes under its learner key, or sends as a command, is bounded data or refused.

Whatever a learner reports, the monitor parses it without raising anything but ``ValueError``, the
commands and events it leads to are inside the bounds of ``events/reports.py``, and every JSON the
read side makes of it parses with a strict parser (``NaN`` and ``Infinity`` are no JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.adapters.bus import open_bus
from ffdl.adapters.heartbeats import EmbeddedHeartbeatStore
from ffdl.api.strict_json import StrictJSONResponse
from ffdl.core.authorization import Principal
from ffdl.core.decider import decide
from ffdl.core.job import Job, evolve
from ffdl.events import job_commands as cmd
from ffdl.events.codec import DecodeError, command_from_json, event_from_json, event_to_json
from ffdl.events.envelope import Event
from ffdl.events.reports import (
    MAX_DROP_REASONS,
    MAX_METRICS,
    MAX_STEP,
    finite_or_null,
    loads_finite,
    strict_dumps,
)
from ffdl.handlers.heartbeat_keys import (
    MAX_BEAT_WORKERS,
    MAX_EXIT_BYTES,
    ExitRecord,
    LearnerBeat,
    encode_exit,
    learner_key,
    parse_exit,
    parse_key,
)
from ffdl.handlers.heartbeat_tracker import HeartbeatTracker, Note, Report
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.monitoring import Monitor
from ffdl.handlers.ports import Bus, OutgoingRecord, Position, RecordTooLarge
from ffdl.projections.documents import dumps, job_document
from tests.job_history import running_job
from tests.services import wait_until_async

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def strict_loads(text: str | bytes) -> Any:
    def refuse(token: str) -> None:
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


_numbers = st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.booleans() | st.none()
_json = st.recursive(
    _numbers | st.text(max_size=70),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=70), inner, max_size=6),
    max_leaves=30,
)
BEATS = st.fixed_dictionaries(
    {"attempt": st.integers(1, 3)},
    optional={
        "pid": _json,
        "agent_pid": _json,
        "host": _json,
        "step": _numbers | st.integers(0, 10**6),
        "metrics": st.dictionaries(st.text(max_size=70), _numbers, max_size=150) | _json,
        "last_progress": _json,
        "started_at": _json,
        "checkpoint": _json,
        "workers": st.dictionaries(st.text(max_size=12), _numbers, max_size=300) | _json,
    },
)


@given(BEATS)
def test_whatever_a_beat_holds_comes_out_bounded_and_finite(raw: dict[str, Any]) -> None:
    beat = LearnerBeat.from_json(json.dumps(raw).encode())

    assert 0 <= beat.step <= MAX_STEP and len(beat.metrics) <= MAX_METRICS
    assert all(math.isfinite(value) for value in beat.metrics.values())
    assert math.isfinite(beat.last_progress) and math.isfinite(beat.started_at)
    assert len(beat.dropped) <= MAX_DROP_REASONS
    assert beat.checkpoint is None or isinstance(beat.checkpoint, dict)
    assert len(beat.workers) <= MAX_BEAT_WORKERS
    assert all(0 <= rank < 2**31 and 0 <= step <= MAX_STEP for rank, step in beat.workers.items())
    strict_loads(beat.to_json())


@given(st.binary(max_size=200) | _json.map(lambda value: json.dumps(value).encode()))
def test_a_beat_that_is_none_is_a_value_error_and_nothing_else(value: bytes) -> None:
    with contextlib.suppress(ValueError):
        LearnerBeat.from_json(value)


@pytest.mark.parametrize(
    "value",
    [
        b"[" * 100_000,
        b'{"attempt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"attempt": 1e999}',
        b'{"attempt": 10' + b"0" * 5000 + b"}",
        b'{"attempt": true}',
        b'{"attempt": 0}',
        json.dumps({"attempt": 1, "metrics": {f"m{i}": 1.0 for i in range(10_000)}}).encode(),
        b"\xff\xfe",
    ],
)
def test_a_hostile_beat_is_refused_whole_with_a_reason(value: bytes) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        LearnerBeat.from_json(value)


def test_a_beat_keeps_its_learner_alive_however_bad_its_report() -> None:
    raw = {
        "attempt": 1,
        "step": 2**64,
        "metrics": {"loss": math.nan, "acc": 0.5},
        "checkpoint": [1],
        "pid": -1,
    }

    beat = LearnerBeat.from_json(json.dumps(raw).encode())

    assert (beat.step, beat.metrics, beat.checkpoint, beat.pid) == (0, {"acc": 0.5}, None, None)
    assert beat.dropped == (
        f"step {2**64} is out of range 0..{MAX_STEP}",
        "checkpoint is not an object: list",
        "metric 'loss' is not finite (nan)",
    )


def test_a_checkpoint_nested_past_the_stack_is_dropped_and_the_monitor_reads_on() -> None:
    """1 KiB of a checkpoint 500 levels deep once raised RecursionError in the monitor: the role
    crashed at that key on every restart, and no learner of any tenant's job was reported lost."""
    deep = b'{"attempt": 1, "step": 3, "checkpoint": {"uri": ' + b"[" * 500 + b"]" * 500 + b"}}"
    assert len(deep) < 1100

    beat = LearnerBeat.from_json(deep)

    assert (beat.step, beat.checkpoint, beat.dropped) == (3, None, ("checkpoint holds a nested value",))
    tracked = HeartbeatTracker(grace_s=0.0, launch_timeout_s=60.0, progress_interval_s=0.0)
    tracked.resync({learner_key("job-1", 0): deep}, 0.0, revision=1)
    tracked.observe(running(), adopted=False, now=0.0)
    effects = tracked.put(learner_key("job-1", 0), deep, 1.0)
    assert [effect.data for effect in effects if isinstance(effect, Report)] == [
        cmd.ReportProgress(rank=0, attempt=1, step=3, dropped=("checkpoint holds a nested value",))
    ]


def test_a_key_that_fails_to_read_is_skipped_with_its_name_and_the_store_is_read_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever fails in one key (a learner's side writes them), the monitor names it and reads the
    others: one key once crashed the role at every restart, for every job."""
    real = LearnerBeat.from_json

    def failing(value: bytes) -> LearnerBeat:
        if b"poison" in value:
            raise RuntimeError("nothing anyone expected")
        return real(value)

    monkeypatch.setattr(LearnerBeat, "from_json", staticmethod(failing))
    tracked = HeartbeatTracker(grace_s=0.0, launch_timeout_s=60.0, progress_interval_s=0.0)
    tracked.observe(running(), adopted=False, now=0.0)
    poisoned = learner_key("job-2", 0)
    effects = tracked.resync(
        {poisoned: b'{"attempt": 1, "poison": 1}', learner_key("job-1", 0): b'{"attempt": 1, "step": 2}'},
        1.0,
        revision=1,
    )
    [skipped] = [effect for effect in effects if isinstance(effect, Note) and effect.level == "error"]
    assert skipped.details == {"key": poisoned, "error": "RuntimeError: nothing anyone expected"}
    assert [effect.data for effect in effects if isinstance(effect, Report)] == [
        cmd.ReportProgress(rank=0, attempt=1, step=2)
    ]


def _recursive_finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _recursive_finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_recursive_finite_or_null(item) for item in value]
    return value


@given(_json)
def test_the_read_side_cleans_non_finite_numbers_as_the_recursive_definition_does(value: Any) -> None:
    cleaned = finite_or_null(value)
    assert cleaned == _recursive_finite_or_null(value)
    assert json.dumps(cleaned, allow_nan=False) == json.dumps(
        _recursive_finite_or_null(value), allow_nan=False
    )


def test_the_read_side_cleans_a_value_nested_deeper_than_the_stack() -> None:
    deep: Any = math.nan
    for _ in range(100_000):
        deep = [deep]
    cleaned = finite_or_null(deep)
    for _ in range(100_000):
        cleaned = cleaned[0]
    assert cleaned is None


def test_a_beat_keeps_the_workers_steps_it_can_read_and_says_why_it_dropped_the_others() -> None:
    raw = {"attempt": 1, "workers": {"2": 12, "x": 3, "3": -1, "4": 8}}

    beat = LearnerBeat.from_json(json.dumps(raw).encode())

    assert beat.workers == {2: 12, 4: 8}
    assert beat.dropped == (
        "worker rank 'x' is not a small integer",
        f"step -1 is out of range 0..{MAX_STEP}",
    )


@pytest.mark.parametrize(
    "key", ["/ffdl/jobs/j/learners/²", "/ffdl/jobs/j/learners/1234567890", "/ffdl/jobs/j/exits/1/٣"]
)
def test_a_key_whose_rank_is_no_plain_number_is_no_learners(key: str) -> None:
    assert parse_key(key) is None


@pytest.mark.parametrize(
    "value",
    [
        b'{"exit_code": 1e999}',
        b'{"exit_code": ' + b"9" * 300 + b"}",
        b'{"exit_code": ' + b"9" * 5000 + b"}",
        b'{"exit_code": true}',
        b"[" * 300,
        b"[" * (MAX_EXIT_BYTES - 1),
        b"\xff\xfe",
        b'{"exit_code": 0, "checkpoint": {"uri": "' + b"x" * MAX_EXIT_BYTES + b'"}}',
    ],
)
def test_a_hostile_exit_record_is_a_value_error(value: bytes) -> None:
    with pytest.raises(ValueError):
        parse_exit(value)


@given(st.dictionaries(st.text(max_size=20), st.recursive(st.none() | st.integers() | st.text(), st.lists)))
def test_an_exit_record_s_checkpoint_is_an_object_or_left_out(checkpoint: dict[str, Any]) -> None:
    for named in (checkpoint, [checkpoint], "file:///c/1.pt", 7):
        record = parse_exit(json.dumps({"exit_code": 3, "checkpoint": named}).encode())
        assert record.exit_code == 3
        assert record.checkpoint == (named if isinstance(named, dict) and named else None)


@given(
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.text(min_size=1, max_size=4096),
    st.text(max_size=200),
    st.integers(min_value=0, max_value=MAX_STEP),
)
@settings(max_examples=200)
def test_the_exit_record_an_agent_writes_is_always_read_back_with_its_code(
    code: int, uri: str, checksum: str, step: int
) -> None:
    """Whatever a learner named as its checkpoint (a URI of any 4,096 characters, lone surrogates
    and emoji included), the agent's record stays readable, so a clean exit is never taken for a loss."""
    checkpoint = {"uri": uri, "checksum": checksum, "step": step, "rank": 0, "attempt": 1, "size_bytes": 0}
    record = encode_exit(code, checkpoint)
    assert len(record) <= MAX_EXIT_BYTES
    assert parse_exit(record) == ExitRecord(code, checkpoint)


def test_an_exit_record_is_utf_8_so_a_uri_of_escaped_characters_keeps_it_under_the_limit() -> None:
    uri = "file:///c/" + "\U0001f600" * 4086
    checkpoint = {"uri": uri.encode().decode("unicode_escape"), "step": 1}
    assert len(json.dumps(checkpoint)) > MAX_EXIT_BYTES, "escaped, it would be over"
    assert parse_exit(encode_exit(0, checkpoint)).checkpoint == checkpoint


def test_an_exit_record_that_would_be_over_the_limit_goes_without_its_checkpoint() -> None:
    checkpoint = {"uri": "file:///c/1.pt", "metrics": "x" * MAX_EXIT_BYTES}
    assert parse_exit(encode_exit(-15, checkpoint)) == ExitRecord(-15, None)


def command(data: cmd.CommandData) -> str:
    body = {
        "type": type(data).__name__,
        "schema_version": type(data).VERSION,
        "command_id": "00000000-0000-0000-0000-000000000001",
        "issued_at": "2026-01-01T00:00:00Z",
        "producer": "hostile",
        "job_id": "job-1",
        "tenant": "acme",
        "data": data.model_dump(mode="json"),
    }
    return json.dumps(body)


@pytest.mark.parametrize(
    ("metrics", "why"),
    [
        ({"loss": math.nan}, "finite"),
        ({"loss": math.inf}, "finite"),
        ({f"m{index}": 1.0 for index in range(MAX_METRICS + 1)}, "at most"),
        ({"x" * 65: 1.0}, "at most 64"),
        ({"": 1.0}, "at least 1"),
    ],
)
def test_a_forged_progress_command_outside_the_bounds_is_undecodable_with_the_reason(
    metrics: dict[str, float], why: str
) -> None:
    """The owner dead-letters what it cannot decode, with the reason (test_poison_records.py)."""
    text = command(cmd.ReportProgress.model_construct(rank=0, attempt=1, step=1, metrics=metrics, dropped=()))

    with pytest.raises(DecodeError, match=why):
        command_from_json(text)


def test_a_progress_report_of_version_1_is_brought_inside_the_bounds() -> None:
    body = json.loads(command(cmd.ReportProgress(rank=0, attempt=1, step=3)))
    body["schema_version"], body["data"] = (
        1,
        {"rank": 0, "attempt": 1, "step": 3, "metrics": {"loss": math.nan}},
    )

    progress = command_from_json(json.dumps(body)).data

    assert progress == cmd.ReportProgress(
        rank=0, attempt=1, step=3, metrics={}, dropped=("metric 'loss' is not finite (nan)",)
    )


def running() -> Job:
    return running_job("learning", NOW)[0]


@settings(max_examples=60, deadline=None)
@given(BEATS.map(lambda raw: {**raw, "attempt": 1}))
def test_whatever_a_learner_reports_every_json_of_the_read_side_parses_strictly(raw: dict[str, Any]) -> None:
    """From the learner's key to the API: the beat, the owner's decision, the log, the projection's
    document and the API's rendering of both."""
    beat = LearnerBeat.from_json(json.dumps(raw).encode())
    job = running()
    progress = cmd.ReportProgress(
        rank=0, attempt=1, step=beat.step, metrics=beat.metrics, dropped=beat.dropped
    )
    events = decide(job, command_from_json(command(progress)), NOW)  # as the owner reads it off the log
    for event in events:
        logged = event_to_json(event)
        strict_loads(logged)
        job = evolve(job, event_from_json(logged))
    document = strict_loads(dumps(job_document(job)))
    assert strict_loads(StrictJSONResponse(document).body) == document


@given(_json)
def test_the_api_renders_any_value_as_strict_json_with_non_finite_numbers_as_null(value: Any) -> None:
    rendered = strict_loads(StrictJSONResponse(value).body)
    assert rendered == strict_loads(strict_dumps(value))
    json.dumps(rendered, allow_nan=False)  # no non-finite number left (a string "NaN" is fine)


def test_a_document_an_older_platform_stored_with_a_nan_is_read_with_null() -> None:
    stored = '{"learners":[{"metrics":{"loss":NaN,"lr":-Infinity,"acc":0.5}}]}'

    assert loads_finite(stored) == {"learners": [{"metrics": {"loss": None, "lr": None, "acc": 0.5}}]}
    assert strict_loads(strict_dumps(loads_finite(stored)))


class SmallRecords:
    """A bus whose topic takes records of at most ``limit`` bytes, as a Kafka topic configured with a
    smaller ``max.message.bytes`` than the platform's own limit does."""

    def __init__(self, bus: Bus, limit: int) -> None:
        self._bus = bus
        self._limit = limit

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        for record in records:
            if len(record.value) > self._limit:
                raise RecordTooLarge(
                    f"a record of {len(record.value)} bytes is over the limit of {self._limit}"
                )
        return await self._bus.publish(topic, records)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)


def learning(job_id: str) -> tuple[Job, Event]:
    job, events = running_job(job_id, datetime.now(UTC), job_id=job_id)
    return job, events[-1]


async def test_a_report_the_log_refuses_is_dropped_and_holds_up_no_other_jobs(tmp_path: Path) -> None:
    store = EmbeddedHeartbeatStore(tmp_path / "heartbeats.sqlite", poll_interval_s=0.02)
    bus = open_bus(f"embedded://{tmp_path / 'log'}", 1)
    await bus.start()
    small = SmallRecords(bus, limit=2_000)
    monitor = Monitor(
        store,
        CommandSender(small, Topics(), "monitor@test", Principal.platform("monitor")),  # type: ignore[arg-type]
        grace_s=0.0,
        progress_interval_s=0.0,
        check_interval_s=0.02,
    )
    stop = asyncio.Event()
    running_monitor = asyncio.create_task(monitor.run(stop))
    try:
        for job_id in ("hostile", "other"):
            job, last = learning(job_id)
            monitor.observe(last, job)
        many = {f"metric_with_a_long_name_{index:03d}": 1.0 for index in range(MAX_METRICS)}
        await store.put(learner_key("hostile", 0), LearnerBeat(attempt=1, step=1, metrics=many).to_json())
        await store.put(
            learner_key("other", 0), LearnerBeat(attempt=1, step=1, metrics={"loss": 0.5}).to_json()
        )

        async def progress_of_other() -> bool:
            sent = [command_from_json(record.value) async for record in bus.read(Topics().commands, 0)]
            return any(c.job_id == "other" and isinstance(c.data, cmd.ReportProgress) for c in sent)

        await wait_until_async(progress_of_other, 10, what="the other job's progress sent")
        sent = [command_from_json(record.value) async for record in bus.read(Topics().commands, 0)]
        assert not any(c.job_id == "hostile" and isinstance(c.data, cmd.ReportProgress) for c in sent)
    finally:
        stop.set()
        await running_monitor
        await bus.close()
        await store.close()


def test_the_monitor_logs_a_cut_report_with_job_tenant_and_reasons_and_sends_the_reasons_on() -> None:
    tracked = HeartbeatTracker(grace_s=0.0, launch_timeout_s=60.0, progress_interval_s=0.0)
    tracked.resync({}, 0.0, revision=1)
    tracked.observe(running(), adopted=False, now=0.0)
    raw = {"attempt": 1, "step": 4, "metrics": {"loss": math.nan, "acc": 0.5}}

    effects = tracked.put(learner_key("job-1", 0), json.dumps(raw).encode(), 1.0)

    (note,) = [effect for effect in effects if isinstance(effect, Note)]
    reasons = ["metric 'loss' is not finite (nan)"]
    assert (note.message, note.details) == (
        "learner report cut to the bounds",
        {"job_id": "job-1", "tenant": "acme", "rank": 0, "reasons": reasons},
    )
    progress = [effect.data for effect in effects if isinstance(effect, Report)]
    assert progress == [
        cmd.ReportProgress(rank=0, attempt=1, step=4, metrics={"acc": 0.5}, dropped=tuple(reasons))
    ]
