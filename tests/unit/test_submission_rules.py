"""What a job may ask for: its env reaches only its own command, its env and labels are bounded.

The rules are checked where a spec enters the platform (the ``SubmitJob`` command, whoever sends it,
and the manifest parser, whose problems the API answers as a 422 naming the field), never when a
spec already on the log is decoded: a job submitted under older rules stays readable.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from ffdl.api.manifest import ManifestError, parse_manifest
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import DecodeError, command_from_json, command_to_json, event_from_json, event_to_json
from ffdl.events.envelope import Command
from ffdl.events.model import (
    ENV_NAME_MAX,
    ENV_TOTAL_MAX_BYTES,
    ENV_VALUE_MAX,
    LABEL_KEY_MAX,
    LABEL_VALUE_MAX,
    LEARNER_CONTRACT_VARIABLES,
    LEARNER_MEMORY_MIN_MB,
    JobSpec,
    env_problems,
    label_problems,
)
from tests.job_history import folded_job

AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
FORBIDDEN = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PYTHONUSERBASE",
    "BASH_ENV",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "LOCPATH",
    "NLSPATH",
    "TZDIR",
    "HOSTALIASES",
    "FFDL_TOKEN",
    "FFDL_KAFKA__SASL_PASSWORD",
    *sorted(LEARNER_CONTRACT_VARIABLES),
]


def spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"name": "job", "command": "true", **fields})


def fields_of(problems: list[tuple[str, str]]) -> list[str]:
    return [field for field, _ in problems]


@pytest.mark.parametrize("name", FORBIDDEN)
def test_a_job_may_not_set_loader_interpreter_or_platform_variables(name: str) -> None:
    problems = env_problems({name: "x"})
    assert fields_of(problems) == [f"env.{name}"]
    assert problems[0][1].startswith("may not be set: ")


@pytest.mark.parametrize(
    "name", ["PATH", "HOME", "OMP_NUM_THREADS", "NCCL_DEBUG", "PYTHONHASHSEED", "my.setting", "_x"]
)
def test_a_job_may_set_ordinary_variables(name: str) -> None:
    assert env_problems({name: "value"}) == []


@pytest.mark.parametrize(
    "name", ["", "1ST", "A=B", "WITH SPACE", "TRAILING\n", "LINE\nBREAK", "-DASH", "X" * (ENV_NAME_MAX + 1)]
)
def test_a_variable_name_is_a_bounded_identifier_without_a_trailing_newline(name: str) -> None:
    assert fields_of(env_problems({name: "x"})) == [f"env.{name}"]


def test_values_and_the_whole_env_are_bounded() -> None:
    assert fields_of(env_problems({"A": "x" * (ENV_VALUE_MAX + 1)})) == ["env.A"]
    assert fields_of(env_problems({"A": "nul\0byte"})) == ["env.A"]
    assert env_problems({"A": "x" * ENV_VALUE_MAX}) == []
    wide = {
        f"V{index}": "é" * (ENV_VALUE_MAX // 2) for index in range(ENV_TOTAL_MAX_BYTES // ENV_VALUE_MAX + 1)
    }
    assert fields_of(env_problems(wide)) == ["env"]


@pytest.mark.parametrize("key", ["", "-team", "team-", "a b", "team\n", "x" * (LABEL_KEY_MAX + 1), "ümlaut"])
def test_a_label_key_is_a_bounded_name_without_a_trailing_newline(key: str) -> None:
    assert fields_of(label_problems({key: "v"})) == [f"labels.{key}"]


def test_label_values_are_bounded_and_free_of_control_characters() -> None:
    assert label_problems({"team": "vision", "ffdl.io/owner": "Ana María", "demo": ""}) == []
    assert fields_of(label_problems({"team": "v" * (LABEL_VALUE_MAX + 1)})) == ["labels.team"]
    assert fields_of(label_problems({"team": "line\nbreak"})) == ["labels.team"]


#: ``TZ`` values that name a file of the job's choosing: glibc opens a path after ``:`` or at the
#: start, and a name under ``TZDIR`` with ``..`` climbs out of it, in every program that converts a
#: time (the root-side shell, ``nsenter`` and ``bwrap`` that start the command got the job's env as
#: theirs; they no longer do, and the rule stays as defence in depth).
HOSTILE_TZ = [
    ":/etc/shadow",
    "/etc/shadow",
    ":/proc/self/environ",
    "/root/.ssh/id_ed25519",
    "../../../../etc/shadow",
    ":../../../etc/shadow",
    "Europe/../../../../etc/shadow",
    "posix/../../../../tmp/evil",
    "..",
    ":/usr/share/zoneinfo/../../../etc/shadow",
    "//etc/shadow",
    "UTC\n",
    "Europe/Berlin ",
    "Europe/Berlin\x7f",
    "Zone/" + "x" * 300,
]
#: Zone names (relative to the system's zone directory, with or without ``:``), POSIX TZ strings
#: (their rules may hold ``/``: ``M10.5.0/3``), the system's own default and zone files.
ORDINARY_TZ = [
    "",
    "UTC",
    "Europe/Berlin",
    ":Europe/Berlin",
    "America/Argentina/Buenos_Aires",
    "Etc/GMT+5",
    "Etc/GMT-14",
    "right/UTC",
    "EST5EDT",
    "CET-1CEST,M3.5.0,M10.5.0/3",
    "<+0330>-3:30",
    "<-03>3",
    "NZST-12NZDT,M9.5.0,M4.1.0/3",
    ":/etc/localtime",
    "/etc/localtime",
    "/usr/share/zoneinfo/Asia/Tokyo",
    ":/usr/share/zoneinfo/UTC",
]


@pytest.mark.parametrize("value", HOSTILE_TZ)
def test_a_job_s_tz_may_not_name_a_file_of_its_choosing(value: str) -> None:
    """``TZ=:/path`` (or ``/path``, or ``..`` under ``TZDIR``) made glibc open that file, as root, in
    the shell, ``nsenter`` and ``bwrap`` that started the command, had they converted a time:
    ``TZDIR`` was refused, ``TZ`` carried the same path."""
    ((field, message),) = env_problems({"TZ": value})
    assert field == "env.TZ"
    assert "time zone" in message and "not a path" in message
    with pytest.raises(ValidationError, match=r"env\.TZ: "):
        cmd.SubmitJob(spec=spec(env={"TZ": value}))


@pytest.mark.parametrize("value", ORDINARY_TZ)
def test_a_job_may_set_a_zone_name_or_a_posix_tz_string(value: str) -> None:
    assert env_problems({"TZ": value}) == []


@given(st.text(alphabet="/.:ab<>+-,0", max_size=12))
def test_an_accepted_tz_never_leaves_the_system_s_zone_files(value: str) -> None:
    if not env_problems({"TZ": value}):
        name = value.removeprefix(":")
        assert ".." not in name
        assert not name.startswith("/") or name == "/etc/localtime" or name.startswith("/usr/share/zoneinfo/")


def test_the_manifest_parser_names_a_tz_that_names_a_file() -> None:
    with pytest.raises(ManifestError) as refused:
        parse_manifest("name: job\ncommand: 'true'\nenv: {TZ: ':/etc/shadow', OK: 'yes'}\n")
    assert fields_of(refused.value.problems) == ["env.TZ"]


@given(st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=4))
def test_an_accepted_env_never_names_a_forbidden_variable(env: dict[str, str]) -> None:
    if not env_problems(env):
        assert not any(
            name.startswith(("FFDL_", "LD_")) or name in LEARNER_CONTRACT_VARIABLES or not name.isascii()
            for name in env
        )
        assert not any(name.endswith("\n") or "\0" in value for name, value in env.items())


def test_the_manifest_parser_names_each_refused_field() -> None:
    with pytest.raises(ManifestError) as refused:
        parse_manifest(
            "name: job\ncommand: 'true'\nenv: {LD_PRELOAD: /tmp/x.so, OK: 'yes'}\nlabels: {'a b': x}\n"
        )
    assert fields_of(refused.value.problems) == ["env.LD_PRELOAD", "labels.a b"]


def test_a_submit_command_with_a_refused_env_is_undecodable_whoever_sent_it() -> None:
    with pytest.raises(ValidationError, match=r"env\.PYTHONPATH: may not be set"):
        cmd.SubmitJob(spec=spec(env={"PYTHONPATH": "/tmp/evil"}))
    accepted = Command(
        command_id=uuid.uuid4(),
        issued_at=AT,
        job_id="j",
        tenant="t",
        producer="service",
        data=cmd.SubmitJob(spec=spec(env={"OK": "1"})),
    )
    forged = json.loads(command_to_json(accepted))
    forged["data"]["spec"]["env"] = {"LD_PRELOAD": "/tmp/evil.so"}
    with pytest.raises(DecodeError, match="LD_PRELOAD"):
        command_from_json(json.dumps(forged).encode())


#: Text that is not Unicode: a lone UTF-16 surrogate, as JSON's ``\ud800`` makes it, among any characters.
NOT_UNICODE_TEXT = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=6).map(
    "".join
)


def has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(character) <= 0xDFFF for character in text)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"env": {"A": "\udfff"}}, "env.A"),
        ({"env": {"A\udfff": "x"}}, "env.A\\udfff"),
        ({"labels": {"team": "\ud800"}}, "labels.team"),
        ({"labels": {"\ud800": "v"}}, "labels.\\ud800"),
    ],
)
def test_a_map_entry_that_is_not_unicode_is_refused_naming_it_escaped(
    fields: dict[str, object], field: str
) -> None:
    """A lone surrogate made the byte count of the env raise (the API's 500), passed the label
    rules, and named a label key raw in a problem no UTF-8 response could encode."""
    ((named, message),) = spec(**fields).submission_problems()
    assert (named, "lone UTF-16 surrogate" in message) == (field, True)
    with pytest.raises(ValidationError, match="not Unicode text") as refused:
        cmd.SubmitJob(spec=spec(**fields))
    str(refused.value).encode()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"name": "job\ud800"}, "name"),
        ({"command": "python train.py \ud800"}, "command"),
        ({"env": {"A": "\udfff"}}, "env.A"),
        ({"env": {"A\udfff": "x"}}, "env.A\\udfff"),
        ({"labels": {"team": "\ud800"}}, "labels.team"),
        ({"labels": {"\ud800": "v"}}, "labels.\\ud800"),
        ({"gpu_type": "a100\udc80"}, "gpu_type"),
        ({"image": "\udc80"}, "image"),
        ({"framework": "\udc80"}, "framework"),
        ({"framework_version": "\udc80"}, "framework_version"),
        ({"data_dir": "data/\ud800"}, "data_dir"),
        ({"result_dir": "out/\ud800"}, "result_dir"),
    ],
)
def test_every_text_of_a_manifest_that_is_not_unicode_is_refused_naming_its_field(
    fields: dict[str, object], field: str
) -> None:
    """What JSON's escapes spell (``\\ud800`` without its pair), wherever it is: the map entries by
    the submission rules, every other string by pydantic, which refuses a bounded string that is not
    Unicode; each problem can be written in UTF-8."""
    with pytest.raises(ManifestError) as refused:
        parse_manifest(json.dumps({"name": "job", "command": "true", **fields}).encode())
    assert fields_of(refused.value.problems) == [field]
    str(refused.value).encode()


@given(st.dictionaries(NOT_UNICODE_TEXT, NOT_UNICODE_TEXT, max_size=3))
def test_any_env_or_labels_are_judged_without_raising_and_every_problem_encodes(
    entries: dict[str, str],
) -> None:
    problems = spec(env=entries, labels=entries).submission_problems()
    for field, message in problems:
        f"{field}: {message}".encode()
    not_unicode = any(map(has_surrogate, [*entries, *entries.values()]))
    assert any("not Unicode" in message for _, message in problems) == not_unicode


def read_back(old: JobSpec) -> JobSpec:
    """``old`` as the log gives it back: submitted, written and decoded."""
    _, (submitted,) = folded_job([ev.JobSubmitted(spec=old)], AT, job_id="j", tenant="t")
    decoded = event_from_json(event_to_json(submitted))
    assert isinstance(decoded.data, ev.JobSubmitted)
    return decoded.data.spec


def test_a_job_submitted_under_older_rules_stays_readable_on_the_log() -> None:
    old = read_back(spec(env={"LD_PRELOAD": "/tmp/evil.so"}, labels={"a b": "x"}))
    assert fields_of(old.submission_problems()) == ["env.LD_PRELOAD", "labels.a b"]


def test_a_job_whose_labels_an_older_platform_took_with_a_lone_surrogate_stays_readable() -> None:
    old = read_back(spec(labels={"team": "\ud800"}))
    assert old.labels == {"team": "\ud800"}
    assert fields_of(old.submission_problems()) == ["labels.team"]


def _command(job_id: str, data: cmd.CommandData) -> Command:
    return Command(
        command_id=uuid.uuid4(), issued_at=AT, job_id=job_id, tenant="t", producer="service", data=data
    )


@pytest.mark.parametrize(
    "job_id", ["a/b", "..", ".", ".hidden", "trailing.", "-x", "a b", "x\n", "a%2fb", "é"]
)
def test_a_new_job_id_that_cannot_name_a_directory_or_a_url_is_refused_whoever_sends_it(job_id: str) -> None:
    with pytest.raises(ValidationError, match="a new job's id must be"):
        _command(job_id, cmd.SubmitJob(spec=spec()))
    forged = json.loads(command_to_json(_command("placeholder", cmd.SubmitJob(spec=spec()))))
    forged["job_id"] = job_id
    with pytest.raises(DecodeError, match="a new job's id must be"):
        command_from_json(json.dumps(forged).encode())


@given(st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,52}[a-z0-9])?\Z"))
def test_every_id_the_api_makes_is_a_valid_new_job_id(name: str) -> None:
    job_id = f"{spec(name=name).name}-{uuid.uuid4().hex[:8]}"  # as routes/jobs.py names a submission
    assert _command(job_id, cmd.SubmitJob(spec=spec(name=name))).job_id == job_id


def test_a_job_submitted_under_an_older_id_rule_can_still_be_cancelled() -> None:
    cancel = _command("a/b", cmd.CancelJob())
    assert command_from_json(command_to_json(cancel)).job_id == "a/b"


def test_a_learner_asks_for_at_least_its_agent_s_share_of_memory_and_as_much_again() -> None:
    assert fields_of(spec(memory_mb=LEARNER_MEMORY_MIN_MB - 1).submission_problems()) == ["memory_mb"]
    assert spec(memory_mb=LEARNER_MEMORY_MIN_MB).submission_problems() == []
    with pytest.raises(ValidationError, match=f"memory_mb: at least {LEARNER_MEMORY_MIN_MB}"):
        cmd.SubmitJob(spec=spec(learners=1024, memory_mb=16))
    with pytest.raises(ManifestError) as refused:
        parse_manifest("name: job\ncommand: 'true'\nmemory_mb: 16\n")
    assert fields_of(refused.value.problems) == ["memory_mb"]


@pytest.mark.parametrize("field", ["gpu_type", "image", "framework", "framework_version"])
def test_a_spec_string_echoed_in_reasons_holds_no_control_characters(field: str) -> None:
    assert fields_of(spec(**{field: "a100\x1b]52;c;x\x07"}).submission_problems()) == [field]
    assert spec(**{field: "nvidia-h100 80GB"}).submission_problems() == []
