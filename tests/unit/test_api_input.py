"""The API's bounds on what callers send and what tenants are shown, without a platform: manifest
parsing, data and result places, log tails and the redaction of other tenants' jobs from reasons."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import threading
import traceback
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import pytest
import yaml
from fastapi import HTTPException, Request
from hypothesis import given
from hypothesis import strategies as st

from ffdl.adapters.tenants import Principal
from ffdl.api import dependencies
from ffdl.api.app import http_problem
from ffdl.api.dependencies import parsed_manifest, problem
from ffdl.api.fairness import FairWorker, TenantQueues
from ffdl.api.manifest import MAX_DEPTH, MAX_NODES, ManifestError, OutOfTime, parse_manifest
from ffdl.api.redaction import ANOTHER_JOB, ANOTHER_TENANT, Redactor, mentioned_jobs
from ffdl.api.routes.logs import TAIL_MAX_BYTES, tail_of
from ffdl.api.strict_json import StrictJSONResponse
from ffdl.core.places import place_problem
from ffdl.events import job_events as ev
from ffdl.events.model import JobSpec
from ffdl.projections.store import LoggedEvent, Projection
from tests.job_history import folded_job


def problems(text: str | bytes) -> list[tuple[str, str]]:
    with pytest.raises(ManifestError) as refused:
        parse_manifest(text)
    return refused.value.problems


def test_yaml_anchors_and_aliases_are_refused_before_anything_is_expanded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A billion laughs: refused at the first anchor, before a single value is constructed (so
    before any alias could be expanded)."""
    levels = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    levels += [f"a{n}: &a{n} [" + ",".join([f"*a{n - 1}"] * 9) + "]" for n in range(1, 8)]

    def constructed(*args: object) -> None:
        raise AssertionError("a value of the bomb was constructed")

    monkeypatch.setattr(yaml.SafeLoader, "construct_document", constructed)
    refused = problems("\n".join([*levels, "name: bomb", "command: run", "labels: *a7"]))
    assert refused == [("(body)", "YAML anchors and aliases (&, *) are not accepted")]
    assert "anchors" in problems("name: &n job\ncommand: run\n")[0][1]


def test_nesting_and_size_are_bounded() -> None:
    assert (
        "levels"
        in problems("name: x\ncommand: y\nlabels: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))[0][1]
    )
    assert "values" in problems("name: x\ncommand: y\nlabels: [" + ",".join(["1"] * MAX_NODES) + "]")[0][1]
    parse_manifest("name: x\ncommand: y\nlabels: {a: b}\nenv: {A: b}\n")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: x\ncommand: y\nlearners: " + "9" * 10_000, "learners"),
        ("name: x\ncommand: y\ncpus: " + "9" * 10_000 + ".0", "cpus"),
        ("name: x\ncommand: y\ncpus: .nan", "cpus"),
        ("name: x\nmemory: .inf\nframework: {name: tf, command: y}", "memory"),
        ("name: x\nmemory: " + "9" * 400 + "Tb\nframework: {name: tf, command: y}", "memory"),
        ('{"name": "job\\n", "command": "y"}', "name"),
        ("name: x\ncommand: y\nlabels: {when: 2024-13-45}", "(body)"),
        ("name: x\ncommand: y\n? [a, b]\n: c", "(body)"),
        (b"name: x\ncommand: \xff\xfe", "(body)"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_field(text: str | bytes, field: str) -> None:
    assert field in [f for f, _ in problems(text)]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (b'{"name": "x",\t"command": "y"}', "(body)"),
        (b"name: x\ncommand: |#c\n  y\n", "(body)"),
        (b"name: x\ncommand: y\nlabels:\n  team: !\n", "labels.team"),
    ],
)
def test_text_libyaml_reads_otherwise_is_read_as_pure_python_pyyaml_does(text: bytes, field: str) -> None:
    """The manifest language is PyYAML's pure-Python reader's. libyaml (PyYAML's C reader, 170 times
    faster on the costliest manifest) takes each of these: a tab between tokens, a comment right
    after a block scalar's ``|``, an empty value tagged ``!`` (``""`` there, None here), so it would
    change what the API accepts (docs/security.md)."""
    assert field in [f for f, _ in problems(text)]
    assert parse_manifest(b"name: x\ncommand: y\ndata_dir: !\n").data_dir is None


#: The costliest manifest of the default body limit (256 KiB) for the parser: one-letter words.
SLOW = b"name: slow\ncommand: " + b"a " * 131_000


def test_a_parse_stops_at_the_first_look_at_the_clock_past_its_deadline() -> None:
    """The reader looks at the clock at each step through the text and the composer at each value,
    so a parse past its deadline stops at once, however much text is left; one whose deadline has
    passed before it starts (it waited for a parser) reads nothing."""
    looks = 0

    def clock() -> float:
        nonlocal looks
        looks += 1
        return float(looks)

    with pytest.raises(OutOfTime):
        parse_manifest(SLOW, deadline=50.0, clock=clock)
    assert looks == 51
    looks = 100
    with pytest.raises(OutOfTime) as late:
        parse_manifest(SLOW, deadline=50.0, clock=clock)
    assert looks == 101
    assert not late.value.started
    assert parse_manifest(b"name: x\ncommand: y\n", deadline=math.inf).command == "y"


def parsing() -> int:
    """How many threads run the manifest parser now."""
    return sum(
        any(f.f_code.co_filename.endswith("ffdl/api/manifest.py") for f, _ in traceback.walk_stack(frame))
        for frame in sys._current_frames().values()
    )


async def test_a_parse_past_its_time_is_answered_once_it_has_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the request was answered at the deadline while its parse went on in the thread pool."""
    monkeypatch.setattr(dependencies, "MANIFEST_PARSE_S", 0.02)  # the slow manifest takes ~0.3 s
    with pytest.raises(HTTPException) as refused:
        await parsed_manifest(SLOW, "acme")
    assert refused.value.status_code == 422
    assert "took over 0.02 s" in str(refused.value.detail)
    assert parsing() == 0


async def test_a_manifest_no_parser_takes_up_in_time_is_503_and_never_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The parser busy (a burst of slow manifests): the request is told to come back, and its
    manifest is not parsed later, when nobody waits for it."""
    monkeypatch.setattr(dependencies, "MANIFEST_PARSE_S", 0.05)
    parser = FairWorker(dependencies.MANIFEST_BYTES_WAITING_PER_TENANT, name="test-manifest")
    monkeypatch.setattr(dependencies, "_PARSER", parser)
    release = threading.Event()
    busy = parser.submit("globex", release.wait)
    assert busy is not None
    parsed: list[bytes] = []
    monkeypatch.setattr(dependencies, "parse_manifest", lambda body, *_: parsed.append(body))
    try:
        with pytest.raises(HTTPException) as refused:
            await parsed_manifest(b"name: x\ncommand: y\n", "acme")
    finally:
        release.set()
    busy.result(timeout=5)
    moved_on = parser.submit("acme", lambda: None)
    assert moved_on is not None
    moved_on.result(timeout=5)  # the queue has moved past it
    assert (refused.value.status_code, refused.value.headers) == (503, {"Retry-After": "1"})
    assert parsed == []
    assert parser.waiting("acme") == 0


def test_tenants_take_turns_and_each_has_at_most_its_bound_waiting() -> None:
    """The next item is the first of the tenant served least recently: a tenant with many waiting
    gets one turn in each round, and one more than its bound is refused for it alone."""
    queues: TenantQueues[str] = TenantQueues(bound=3)
    assert all(queues.offer("acme", f"acme-{n}") for n in range(3))
    assert not queues.offer("acme", "acme-3")
    assert queues.offer("globex", "globex-0") and queues.offer("initech", "initech-0")
    assert queues.offer("globex", "globex-1")
    taken = [queues.take() for _ in range(6)]
    assert taken == ["acme-0", "globex-0", "initech-0", "acme-1", "globex-1", "acme-2"]
    assert queues.take() is None
    # a tenant just served, whose queue is full again, comes after one that has waited since
    assert queues.offer("acme", "acme-4") and queues.offer("acme", "acme-5")
    assert queues.take() == "acme-4"
    assert queues.offer("acme", "acme-6") and queues.offer("globex", "globex-2")
    assert [queues.take(), queues.take()] == ["globex-2", "acme-5"]
    # an item taken out frees its place in its tenant's queue
    assert queues.waiting("acme") == 1 and queues.offer("acme", "acme-7") and queues.offer("acme", "acme-8")
    assert not queues.offer("acme", "acme-9")
    assert queues.withdraw("acme", "acme-7") and not queues.withdraw("acme", "acme-7")
    assert queues.offer("acme", "acme-9")
    assert [queues.take() for _ in range(4)] == ["acme-6", "acme-8", "acme-9", None]


def test_a_tenant_s_queue_is_bounded_by_what_its_items_cost_not_by_how_many() -> None:
    """A script's burst of small manifests all wait their turn where four of the costliest fill the
    queue; one costlier than the whole bound is let in while its tenant has nothing waiting."""
    queues: TenantQueues[str] = TenantQueues(bound=100)
    assert all(queues.offer("script", f"small-{n}", 5) for n in range(20))
    assert not queues.admits("script", 1) and not queues.offer("script", "small-20", 1)
    assert queues.offer("acme", "costly-0", 60) and not queues.offer("acme", "costly-1", 60)
    assert queues.offer("acme", "costly-2", 40) and not queues.admits("acme", 1)
    assert queues.take() == "small-0" and queues.admits("script", 5) and queues.offer("script", "small-20", 5)
    assert queues.take() == "costly-0" and queues.offer("acme", "costly-1", 60)
    assert queues.offer("globex", "huge", 500) and not queues.offer("globex", "tiny", 1)
    assert queues.withdraw("globex", "huge") and queues.offer("globex", "tiny", 1)


@given(
    st.lists(
        st.one_of(st.sampled_from(["acme", "globex", "initech", "umbrella"]), st.none()),
        max_size=200,
    )
)
def test_an_item_at_the_head_of_its_queue_waits_for_at_most_one_of_each_other_tenant(
    steps: list[str | None],
) -> None:
    """Whatever the tenants send and however long their queues: once a tenant's item is the next of
    its queue, the worker takes at most one item of each other tenant before it (None: a take)."""
    queues: TenantQueues[tuple[str, int]] = TenantQueues(bound=3)
    sent: dict[str, int] = {}
    ahead: dict[str, list[str]] = {}  # the tenants served since each tenant's next item became so
    for step in steps:
        if step is not None:
            if queues.offer(step, (step, sent.get(step, 0))):
                sent[step] = sent.get(step, 0) + 1
                ahead.setdefault(step, [])
            continue
        item = queues.take()
        if item is None:
            assert not ahead
            continue
        tenant, _ = item
        assert len(ahead[tenant]) == len(set(ahead[tenant])), ahead[tenant]
        del ahead[tenant]
        for served in ahead.values():
            served.append(tenant)
        if queues.waiting(tenant):
            ahead[tenant] = []


async def test_a_tenant_s_manifest_is_parsed_before_the_rest_of_another_s_flood(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fake parser stepped by hand: acme's flood fills its queue and is refused past it (429, for
    acme alone), and globex's manifest is parsed next, before acme's queued ones."""
    parser = FairWorker(2 * len(b"name: acme-0\ncommand: run\n"), name="test-manifest")  # two of acme's
    monkeypatch.setattr(dependencies, "_PARSER", parser)
    started: dict[bytes, threading.Event] = {}
    release: dict[bytes, threading.Event] = {}
    order: list[bytes] = []

    def parse(body: bytes, *_: object) -> JobSpec:
        order.append(body)
        started[body].set()
        assert release[body].wait(10)
        return parse_manifest(body)

    monkeypatch.setattr(dependencies, "parse_manifest", parse)

    def manifest_of(name: str) -> bytes:
        body = f"name: {name}\ncommand: run\n".encode()
        started[body], release[body] = threading.Event(), threading.Event()
        return body

    flood = [manifest_of(f"acme-{n}") for n in range(3)]
    parsing_flood = [asyncio.create_task(parsed_manifest(flood[0], "acme"))]
    assert await asyncio.to_thread(started[flood[0]].wait, 10)  # the parser has taken acme-0
    parsing_flood += [asyncio.create_task(parsed_manifest(body, "acme")) for body in flood[1:]]
    await asyncio.sleep(0)  # each task queues its manifest in its first step, before it awaits
    assert parser.waiting("acme") == 2
    with pytest.raises(HTTPException) as refused:
        await parsed_manifest(manifest_of("acme-3"), "acme")
    assert (refused.value.status_code, refused.value.headers) == (429, {"Retry-After": "1"})
    assert "come to 52 bytes" in str(refused.value.detail)
    ours = manifest_of("globex-0")
    parsing_ours = asyncio.create_task(parsed_manifest(ours, "globex"))
    await asyncio.sleep(0)
    assert parser.waiting("globex") == 1
    release[flood[0]].set()
    assert await asyncio.to_thread(started[ours].wait, 10)
    assert order == [flood[0], ours], "globex's manifest waited behind acme's queue"
    release[ours].set()
    assert (await parsing_ours).name == "globex-0"
    for body in flood[1:]:
        release[body].set()
    assert [spec.name for spec in await asyncio.gather(*parsing_flood)] == ["acme-0", "acme-1", "acme-2"]
    assert order == [flood[0], ours, *flood[1:]]


def test_a_piece_withdrawn_while_it_waits_is_never_done_and_one_taken_cannot_be() -> None:
    worker = FairWorker(1, name="test-turns")
    started, release = threading.Event(), threading.Event()
    done: list[str] = []

    def work(name: str) -> str:
        started.set()
        assert release.wait(10)
        done.append(name)
        return name

    first = worker.submit("acme", work, "first")
    assert first is not None and started.wait(10)
    second = worker.submit("acme", work, "second")
    assert second is not None and worker.submit("acme", work, "third") is None
    assert worker.withdraw(second) and second.cancelled() and worker.waiting("acme") == 0
    assert not worker.withdraw(first), "one the worker has taken runs to its end"
    fourth = worker.submit("acme", work, "fourth")
    assert fourth is not None
    release.set()
    assert (first.result(10), fourth.result(10)) == ("first", "fourth")
    assert done == ["first", "fourth"]


def test_a_body_holding_text_utf8_cannot_encode_is_written_with_escapes_and_the_rest_as_utf8() -> None:
    """A label an older platform took with a lone surrogate made every read of its job a 500."""
    stored = {"labels": {"\ud800": "caf\u00e9 \udfff"}, "loss": math.nan}
    assert json.loads(bytes(StrictJSONResponse(stored).body)) == {
        "labels": {"\ud800": "caf\u00e9 \udfff"},
        "loss": None,
    }
    assert StrictJSONResponse({"team": "caf\u00e9"}).body == '{"team":"caf\u00e9"}'.encode()


async def test_a_refusal_naming_text_utf8_cannot_encode_is_written_all_the_same() -> None:
    """Starlette's own response made such a 422 a 500 (a label key named as it was sent, before)."""
    request = Request({"type": "http", "method": "POST", "path": "/v1/jobs", "headers": []})
    response = await http_problem(request, problem(422, "refused: \udfff", "labels.\ud800"))
    assert (response.status_code, json.loads(bytes(response.body))) == (
        422,
        {"detail": [{"field": "labels.\ud800", "message": "refused: \udfff"}]},
    )


@pytest.mark.parametrize(
    ("place", "accepted"),
    [
        ("s3://bucket/prefix", True),
        ("train-data", True),
        ("out/model", True),
        ("/data/mnist", True),
        ("/data", True),
        ("/", False),
        ("/database", False),
        ("/data/../etc", False),
        ("out/../../..", False),
        ("train\n", False),
        ("a\0b", False),
    ],
)
def test_places_are_uris_relative_paths_or_under_a_root(place: str, accepted: bool) -> None:
    assert (place_problem(place, [PurePosixPath("/data")]) is None) is accepted


def test_with_no_root_configured_no_absolute_path_is_a_place() -> None:
    assert "none are configured" in str(place_problem("/data", []))


def counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the reads made through files opened from now on."""
    sizes: list[int] = []
    opened = Path.open

    class Counted:
        def __init__(self, handle: BinaryIO) -> None:
            self.handle = handle

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def seek(self, offset: int, whence: int = 0) -> int:
            return self.handle.seek(offset, whence)

        def read(self, size: int = -1) -> bytes:
            data = self.handle.read(size)
            sizes.append(len(data))
            return data

    monkeypatch.setattr(Path, "open", lambda path, mode="r": Counted(opened(path, mode)))
    return sizes


def test_a_tail_is_read_from_the_end_of_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "learner-0.log"
    with log.open("wb") as handle:
        handle.truncate(64 << 30)  # sparse: reading it whole would never finish in time
        handle.seek(0, 2)
        handle.write(b"one\ntwo\nthree")
    read = counting_reads(monkeypatch)
    assert tail_of(log, 2) == (b"two\nthree", (64 << 30) + 13)
    assert sum(read) <= TAIL_MAX_BYTES, "read back from the end, at most its bound: not the whole 64 GiB"
    monkeypatch.undo()
    log.write_bytes(b"a\nb\n")
    assert tail_of(log, 5) == (b"a\nb\n", 4)
    log.write_bytes(b"x" * 100 + b"\n")
    assert tail_of(log, 1, max_bytes=10) == (b"x" * 9 + b"\n", 101)


_NAMES = st.from_regex(r"\A[a-z][a-z0-9]{0,6}-[0-9a-f]{8}\Z")


@given(
    ours=st.lists(_NAMES, max_size=3, unique=True),
    theirs=st.lists(_NAMES, min_size=1, max_size=3, unique=True),
)
def test_a_tenant_is_shown_no_other_tenants_job_id_in_any_reason(ours: list[str], theirs: list[str]) -> None:
    theirs = [job for job in theirs if job not in ours]
    if not theirs:
        return
    named = [*theirs, *ours]
    document = {
        "job_id": "mine-00000000",
        "reason": f"preempted to reclaim tenant globex's guarantee of 4 GPUs for job {theirs[0]}: "
        "tenant acme borrows beyond its own",
        "waiting": {
            "detail": f"it would fit, but only on nodes kept free for {', '.join(named)}, ahead of it",
            "waiting_for": named,
        },
        "history": [{"reason": f"higher-priority job {theirs[-1]} waits ahead of it"}],
        "spec": {"command": f"echo job {theirs[0]}"},
    }
    mentioned = mentioned_jobs(document)
    assert set(named) <= mentioned
    owners = {**dict.fromkeys(theirs, "globex"), **dict.fromkeys(ours, "acme")}
    shown = Redactor(Principal("acme", admin=False), mentioned, owners, ["acme", "globex"]).value(document)
    reasons = f"{shown['reason']} {shown['waiting']} {shown['history']}"
    for job in theirs:
        assert not re.search(rf"(?<![\w-]){re.escape(job)}(?![\w-])", reasons)
    for job in ours:
        assert job in shown["waiting"]["waiting_for"] and job in shown["waiting"]["detail"]
    assert shown["waiting"]["waiting_for"].count(ANOTHER_JOB) == len(theirs)
    assert "globex" not in reasons and f"{ANOTHER_TENANT}'s guarantee" in shown["reason"]
    assert "tenant acme borrows" in shown["reason"], "the caller's own name stays"
    assert shown["spec"] == document["spec"], "only reasons are rewritten"
    admin = Redactor(Principal("sre", admin=True), mentioned, owners, ["acme", "globex"])
    assert admin.value(document) == document, "an admin sees the truth"


def test_a_tenant_s_own_reasons_are_not_garbled_by_words_that_follow_job() -> None:
    """Only ids are hidden: a word after "job " that is no job and looks like no id is left alone
    (it made "job has ended already" into "another tenant's job ended already")."""
    owners = {"train-1a2b3c4d": "globex"}
    document = {
        "reason": "job has ended already (COMPLETED)",
        "history": [
            {"reason": "a job with this id exists already"},
            {"reason": "preempted by job train-1a2b3c4d"},
            {"reason": "held back by job gone-00000000"},  # another's, deleted since: unknown, hidden
        ],
    }
    shown = Redactor(Principal("acme", admin=False), mentioned_jobs(document), owners, ["acme", "globex"])
    assert shown.value(document) == {
        "reason": "job has ended already (COMPLETED)",
        "history": [
            {"reason": "a job with this id exists already"},
            {"reason": f"preempted by {ANOTHER_JOB}"},
            {"reason": f"held back by {ANOTHER_JOB}"},
        ],
    }


def test_the_owner_of_a_deleted_job_is_still_known_so_its_id_stays_hidden_from_others(tmp_path: Path) -> None:
    """A reason may name a job deleted since (its history stays on the log); that it is another
    tenant's is read from its history, so a plain-word id of another tenant's is not shown as if
    it were no job at all."""
    spec = JobSpec(name="secret", command="true", learners=1, gpus=1)
    datas = [ev.JobSubmitted(spec=spec), ev.JobAccepted(), ev.JobQueued(), ev.JobCancelled(), ev.JobDeleted()]
    _, events = folded_job(datas, datetime.now(UTC), job_id="secret", tenant="globex")
    projection = Projection(tmp_path / "projection.sqlite")
    try:
        for offset, event in enumerate(events):
            projection.apply([LoggedEvent(event, 0, offset)])
        assert projection.get("secret") is None, "deleted: no longer listed"
        owners = projection.tenants_of(["secret", "never-was"])
    finally:
        projection.close()

    assert owners == {"secret": "globex"}
    document = {"reason": "preempted by job secret"}
    shown = Redactor(Principal("acme", admin=False), mentioned_jobs(document), owners, ["acme", "globex"])
    assert shown.value(document) == {"reason": f"preempted by {ANOTHER_JOB}"}


def test_a_declared_body_length_a_tenant_chooses_weighs_only_on_its_own_queue() -> None:
    """What a sender declares is read before its body, as the cost its manifest would add to its own
    queue: a length missing, not a number or below one counts as one byte (the real length is
    charged once the body is read), and a huge one only keeps that tenant's next manifest out while
    one of its own waits."""

    def declared(value: bytes | None) -> int:
        headers = [] if value is None else [(b"content-length", value)]
        return dependencies._declared_length(Request({"type": "http", "headers": headers}))

    assert [declared(None), declared(b"abc"), declared(b"-5"), declared(b"0")] == [1, 1, 1, 1]
    huge = declared(b"9" * 30)
    assert huge == int("9" * 30)
    queues: TenantQueues[str] = TenantQueues(bound=100)
    assert queues.admits("acme", huge), "an empty queue lets one in: the body limit refuses the rest"
    assert queues.offer("acme", "waiting", 10)
    assert not queues.admits("acme", huge) and queues.admits("globex", huge)
    assert queues.admits("acme", 1) and not queues.offer("acme", "understated, charged its real length", 91)
