"""Checkpoint discovery and retention in a checkpoint directory the tenant's code writes (and may
turn against the agent): what is found complete, with which step, size and checksum, what is never
followed, read or deleted, and what is kept."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.events.model import Checkpoint
from ffdl.learner import checkpoints
from ffdl.learner.channel import NOTES_PER_INTERVAL, LearnerNotes
from ffdl.learner.checkpoints import CheckpointScanner, Found, as_checkpoint, scanner_for, step_of_name


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def settle(scanner: CheckpointScanner, scans: int = 2) -> list[Found]:
    found: list[Found] = []
    for _ in range(scans):
        found += scanner.scan()
    return found


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("ckpt_step_120.pt", 120),
        ("checkpoint-120", 120),
        ("120.pt", 120),
        ("step=120.ckpt", 120),
        ("epoch=2-step=120.ckpt", 120),
        ("model_v2-120.safetensors", 120),
        ("global_step7", 7),
        ("last.ckpt", None),
        ("model.pt", None),
    ],
)
def test_the_step_comes_from_the_name(name: str, step: int | None) -> None:
    assert step_of_name(name) == step


def test_a_file_is_recorded_once_it_stopped_changing_with_its_size_and_checksum(tmp_path: Path) -> None:
    scanner = CheckpointScanner(str(tmp_path))
    target = tmp_path / "ckpt_step_20.pt"
    target.write_bytes(b"half")
    assert scanner.scan() == []  # seen once: it may still be written
    target.write_bytes(b"half and the rest")
    assert scanner.scan() == []  # it changed
    [found] = scanner.scan()
    assert (found.name, found.step, found.size_bytes) == ("ckpt_step_20.pt", 20, 17)
    assert found.checksum == sha256(b"half and the rest")
    assert settle(scanner) == []  # recorded once


async def test_the_final_scan_hands_over_what_a_scan_cut_off_by_the_exit_recorded(tmp_path: Path) -> None:
    # the learner exits while discovery's scan runs in its thread: that scan records the checkpoint,
    # but its caller is cancelled before handing it over; the final scan must still hand it over
    scanner = CheckpointScanner(str(tmp_path))
    (tmp_path / "ckpt_step_30.pt").write_bytes(b"last words")
    settle(scanner)  # what the cut-off scans found, never handed over
    handed: list[Found] = []
    await checkpoints.final_scan(scanner, handed.append)
    assert [found.step for found in handed] == [30]


async def test_the_final_scan_gives_up_at_its_deadline_while_a_scan_is_stuck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a scan stuck in its thread (a hung file system) holds the scanner: the agent's exit must not
    # wait for it beyond the final scan's deadline, handover included
    monkeypatch.setattr(checkpoints, "FINAL_SCAN_TIMEOUT_S", 0.2)
    scanner = CheckpointScanner(str(tmp_path))
    (tmp_path / "ckpt_step_30.pt").write_bytes(b"last words")
    settle(scanner)
    stuck, done = threading.Event(), threading.Event()

    def hold() -> None:
        with scanner._lock:
            stuck.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert stuck.wait(5)
    handed: list[Found] = []
    try:
        await checkpoints.final_scan(scanner, handed.append)
    finally:
        done.set()
        holder.join(5)
    assert handed == []


def test_scans_from_two_threads_run_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a scan whose caller was cancelled runs on in its thread while the final scan starts in another
    scanner = CheckpointScanner(str(tmp_path))
    inside = threading.Semaphore(0)
    release = threading.Event()
    overlapped: list[bool] = []
    running = [0]
    scan_once = scanner._scan

    def slow_scan(root: int) -> list[Found]:
        running[0] += 1
        overlapped.append(running[0] > 1)
        inside.release()
        release.wait(5)
        running[0] -= 1
        return scan_once(root)

    monkeypatch.setattr(scanner, "_scan", slow_scan)
    first = threading.Thread(target=scanner.scan)
    second = threading.Thread(target=scanner.scan)
    first.start()
    assert inside.acquire(timeout=5)
    second.start()
    assert not inside.acquire(timeout=0.2)  # the second waits for the first
    release.set()
    first.join(5)
    second.join(5)
    assert overlapped == [False, False]


def test_names_that_say_not_done_are_never_checkpoints_and_a_rename_completes_them(tmp_path: Path) -> None:
    scanner = CheckpointScanner(str(tmp_path))
    for name in ("ckpt_5.pt.tmp", ".ckpt_5.pt", "ckpt_5.pt~", "tmpab12_5.pt", "ckpt_5.partial"):
        (tmp_path / name).write_bytes(b"x")
    assert settle(scanner, 3) == []
    os.rename(tmp_path / "ckpt_5.pt.tmp", tmp_path / "ckpt_5.pt")
    assert [found.step for found in settle(scanner)] == [5]


def test_a_directory_is_complete_with_its_marker_and_checksummed_as_the_helper_does(tmp_path: Path) -> None:
    scanner = CheckpointScanner(str(tmp_path))
    directory = tmp_path / "checkpoint-40"
    (directory / "shards").mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(b"rank0")
    (directory / "shards" / "extra.bin").write_bytes(b"more")
    assert settle(scanner, 3) == []  # no marker yet: still being written
    (directory / ".metadata").write_bytes(b"meta")
    [found] = settle(scanner)
    assert (found.step, found.size_bytes) == (40, 13)
    manifest = "".join(
        f"{name}\0{len(data)}\0{hashlib.sha256(data).hexdigest()}\n"
        for name, data in sorted(
            [(".metadata", b"meta"), ("__0_0.distcp", b"rank0"), ("shards/extra.bin", b"more")]
        )
    )
    assert found.checksum == sha256(manifest.encode())


def walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the checkpoint directories scans walk, in order."""
    walked: list[str] = []
    listing = checkpoints._listing
    monkeypatch.setattr(checkpoints, "_listing", lambda *args: walked.append(args[1]) or listing(*args))
    return walked


def full_directory(path: Path, files: int, marker: str = "COMPLETE") -> None:
    path.mkdir()
    for index in range(files):
        (path / f"f{index}").write_bytes(b"")
    (path / marker).write_bytes(b"")


def test_a_directory_whose_name_has_no_step_is_never_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A learner's marked directories of 10,000 entries each, named without a step, were walked every
    second by its agent, outside its cgroup: about a core."""
    walked = walks(monkeypatch)
    full_directory(tmp_path / "ckpt-final-xx", 20)
    assert settle(CheckpointScanner(str(tmp_path)), 3) == [] and walked == []


def test_a_refused_directory_is_walked_again_only_once_its_top_level_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "MAX_ENTRIES_PER_CHECKPOINT", 10)
    walked = walks(monkeypatch)
    full_directory(tmp_path / "step_5", 20)
    scanner = CheckpointScanner(str(tmp_path))
    assert settle(scanner, 3) == [] and walked == ["step_5"]
    for index in range(20):
        (tmp_path / "step_5" / f"f{index}").unlink()
    assert [found.step for found in settle(scanner, 3)] == [5] and walked == ["step_5"] * 3


def test_a_scan_walks_a_bounded_number_of_entries_the_newest_directories_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "SCAN_ENTRIES_MAX", 5)
    walked = walks(monkeypatch)
    for step in (1, 2):
        full_directory(tmp_path / f"step_{step}", 2)  # three entries each, the marker's included
    scanner = CheckpointScanner(str(tmp_path))
    assert [found.step for found in settle(scanner)] == [2]
    assert walked == ["step_2", "step_1"] * 2  # step_1's walk is cut short by the budget, twice
    assert [found.step for found in settle(scanner)] == [1]


def test_a_directory_without_its_marker_is_not_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walked = walks(monkeypatch)
    directory = tmp_path / "checkpoint-40"
    for index in range(200):  # what a learner could grow without end: a scan must not walk it
        (directory / f"d{index}").mkdir(parents=True)
    (directory / "COMPLETE").mkdir()  # a marker must be a plain file
    (tmp_path / "step_7").mkdir()
    (tmp_path / "step_7" / "DONE").symlink_to(tmp_path / "elsewhere")
    assert settle(CheckpointScanner(str(tmp_path)), 3) == []
    assert walked == []


def test_directories_count_toward_a_checkpoint_s_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "MAX_ENTRIES_PER_CHECKPOINT", 10)
    for step, empty_directories in ((1, 8), (2, 9)):
        directory = tmp_path / f"step_{step}"
        for index in range(empty_directories):
            (directory / f"d{index}").mkdir(parents=True)
        (directory / "DONE").write_bytes(b"")
    # step 1 holds 9 entries (its marker included), step 2 ten and, with this one, eleven:
    (tmp_path / "step_2" / "d0" / "deeper").mkdir()
    assert [found.step for found in settle(CheckpointScanner(str(tmp_path)))] == [1]


def test_a_sidecar_names_the_step(tmp_path: Path) -> None:
    (tmp_path / "last.ckpt").write_bytes(b"weights")
    (tmp_path / "last.ckpt.step").write_text("300\n")
    [found] = settle(CheckpointScanner(str(tmp_path)))
    assert (found.name, found.step) == ("last.ckpt", 300)


# -- hostile directories ---------------------------------------------------------------------------


def test_links_are_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"the platform's")
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "ckpt_1.pt").symlink_to(secret)
    os.link(secret, directory / "ckpt_2.pt")  # a hard link to a file that is not the learner's
    linked = directory / "checkpoint-3"
    linked.mkdir()
    (linked / "COMPLETE").write_bytes(b"")
    (linked / "weights").symlink_to(secret)
    (directory / "checkpoint-4").symlink_to(linked, target_is_directory=True)
    assert settle(CheckpointScanner(str(directory)), 3) == []


def test_the_directory_itself_is_not_followed_when_it_is_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "ckpt_1.pt").write_bytes(b"x")
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert settle(CheckpointScanner(str(tmp_path / "link"))) == []


def test_a_fifo_named_like_a_checkpoint_never_blocks_the_scan(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "ckpt_9.pt")
    done = threading.Event()

    def scan() -> None:
        settle(CheckpointScanner(str(tmp_path)), 3)
        done.set()

    threading.Thread(target=scan, daemon=True).start()
    assert done.wait(10), "the scan blocked on a FIFO"


def test_a_scan_looks_at_a_bounded_number_of_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoints, "MAX_ENTRIES", 5)
    for step in range(50):
        (tmp_path / f"ckpt_{step}.pt").write_bytes(b"x")
    assert len(settle(CheckpointScanner(str(tmp_path)))) <= 5


def test_a_big_checkpoint_is_hashed_over_several_scans_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "HASH_BYTES_PER_SCAN", 1000)
    data = os.urandom(4500)
    (tmp_path / "ckpt_7.pt").write_bytes(data)
    scanner = CheckpointScanner(str(tmp_path))
    results = [scanner.scan() for _ in range(8)]
    # seen; confirmed and hashed 1000 bytes a scan, the last 500 in the sixth scan; then recorded once
    assert [len(found) for found in results] == [0, 0, 0, 0, 0, 1, 0, 0]
    assert results[5][0].checksum == sha256(data)


def test_a_checkpoint_rewritten_while_hashed_is_hashed_again_from_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "HASH_BYTES_PER_SCAN", 1000)
    target = tmp_path / "ckpt_7.pt"
    target.write_bytes(b"a" * 3000)
    scanner = CheckpointScanner(str(tmp_path))
    assert settle(scanner, 3) == []
    target.write_bytes(b"b" * 2000)
    found = settle(scanner, 8)
    assert [item.checksum for item in found] == [sha256(b"b" * 2000)]


# -- retention -------------------------------------------------------------------------------------


def test_retention_keeps_the_newest_and_the_one_resumed_from(tmp_path: Path) -> None:
    scanner = CheckpointScanner(str(tmp_path), resume_from=str(tmp_path / "ckpt_10.pt"), keep=2)
    for step in (10, 20, 30, 40):
        (tmp_path / f"ckpt_{step}.pt").write_bytes(b"x")
        settle(scanner)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpt_10.pt", "ckpt_30.pt", "ckpt_40.pt"]
    assert [found.step for found in scanner.recorded] == [10, 30, 40]


def test_keep_zero_keeps_everything(tmp_path: Path) -> None:
    scanner = CheckpointScanner(str(tmp_path), keep=0)
    for step in range(5):
        (tmp_path / f"{step}.pt").write_bytes(b"x")
    settle(scanner)
    assert len(list(tmp_path.iterdir())) == 5


def test_retention_deletes_directories_and_never_what_a_link_swapped_in_points_to(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep me")
    directory = tmp_path / "ckpt"
    directory.mkdir()
    scanner = CheckpointScanner(str(directory), keep=1)
    for step in (1, 2):
        (directory / f"checkpoint-{step}").mkdir()
        (directory / f"checkpoint-{step}" / "COMPLETE").write_bytes(b"")
    (directory / "ckpt_3.pt").write_bytes(b"x")
    settle(scanner)
    assert sorted(path.name for path in directory.iterdir()) == ["ckpt_3.pt"]

    (directory / "ckpt_4.pt").write_bytes(b"x")
    settle(scanner)  # ckpt_3 is now the one to delete...
    (directory / "ckpt_5.pt").write_bytes(b"x")
    (directory / "ckpt_4.pt").unlink()
    (directory / "ckpt_4.pt").symlink_to(outside / "precious")  # ...and ckpt_4 is swapped for a link
    settle(scanner)
    assert (outside / "precious").read_bytes() == b"keep me"
    assert (directory / "ckpt_4.pt").is_symlink()


def test_retention_removes_a_nested_checkpoint_and_survives_nesting_deeper_than_the_stack(
    tmp_path: Path,
) -> None:
    """A learner may nest directories in a recorded checkpoint deeper than Python's stack (a
    recursive delete raised RecursionError, which ended the agent before its exit record): what lies
    past the bound stays, and scanning and retention go on."""
    scanner = CheckpointScanner(str(tmp_path), keep=1)
    for step in (1, 2):
        nested = tmp_path / f"step_{step}" / "model" / "shards"
        nested.mkdir(parents=True)
        (nested / "0.bin").write_bytes(b"x")
        (tmp_path / f"step_{step}" / "COMPLETE").write_bytes(b"")
    settle(scanner)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step_2"]
    assert (tmp_path / "step_2" / "model" / "shards" / "0.bin").exists()

    nest(tmp_path / "step_2", DEEPER_THAN_THE_STACK)
    try:
        for step in (3, 4):
            (tmp_path / f"step_{step}").mkdir()
            (tmp_path / f"step_{step}" / "COMPLETE").write_bytes(b"")
            settle(scanner)
        assert [found.step for found in scanner.recorded] == [4]
        assert not (tmp_path / "step_3").exists()
        assert (tmp_path / "step_2" / "d").is_dir(), "past the bound, left in the learner's place"
    finally:
        unnest(tmp_path / "step_2", DEEPER_THAN_THE_STACK)


DEEPER_THAN_THE_STACK = 1200  # directories: a path past PATH_MAX, as a learner makes it (one at a time)


def nest(top: Path, depth: int) -> None:
    """``depth`` directories ``d`` one in another under ``top``, made relative to the working directory."""
    here = os.getcwd()
    os.chdir(top)
    try:
        for _ in range(depth):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(here)


def unnest(top: Path, depth: int) -> None:
    """Remove what :func:`nest` made (pytest's own clean-up of the temporary directory recurses)."""
    here = os.getcwd()
    os.chdir(top)
    try:
        levels = 0
        while levels < depth and os.path.isdir("d"):
            os.chdir("d")
            levels += 1
        for _ in range(levels):
            os.chdir("..")
            os.rmdir("d")
    finally:
        os.chdir(here)


@settings(max_examples=30, deadline=None)
@given(
    steps=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=12, unique=True),
    keep=st.integers(min_value=1, max_value=5),
    resumed=st.integers(min_value=0, max_value=11),
)
def test_retention_never_deletes_the_newest_nor_the_resumed_and_keeps_at_most_keep_others(
    tmp_path_factory: pytest.TempPathFactory, steps: list[int], keep: int, resumed: int
) -> None:
    directory = tmp_path_factory.mktemp("ckpt")
    resume = f"ckpt_{steps[resumed % len(steps)]}.pt"
    scanner = CheckpointScanner(str(directory), resume_from=str(directory / resume), keep=keep)
    for step in steps:
        (directory / f"ckpt_{step}.pt").write_bytes(b"x")
        settle(scanner)
    left = {path.name for path in directory.iterdir()}
    assert resume in left
    assert f"ckpt_{max(steps)}.pt" in left
    newest = {f"ckpt_{step}.pt" for step in sorted(steps)[-keep:]}
    assert left <= newest | {resume}


def test_only_rank_0_scans_and_the_platforms_keep_is_read() -> None:
    environment = {"FFDL_CHECKPOINT_DIR": "/ckpt", "FFDL_KEEP_CHECKPOINTS": "7"}
    notes = LearnerNotes(Notes(), time.monotonic)
    assert scanner_for(environment, 1, notes) is None
    assert scanner_for({}, 0, notes) is None
    scanner = scanner_for(environment, 0, notes)
    assert scanner is not None and scanner._keep == 7 and scanner.notes is notes


def test_a_step_past_what_json_keeps_exact_is_no_checkpoint(tmp_path: Path) -> None:
    """Reports bound a step to 2^53 - 1; a name or a sidecar file may say more: not recorded."""
    (tmp_path / f"ckpt_{2**53}.pt").write_bytes(b"x")
    (tmp_path / "model.pt").write_bytes(b"y")
    (tmp_path / "model.pt.step").write_text("9" * 32)
    (tmp_path / f"ckpt_{2**53 - 1}.pt").write_bytes(b"z")
    assert [found.step for found in settle(CheckpointScanner(str(tmp_path), keep=0))] == [2**53 - 1]


class Notes:
    """A logger that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append({"event": event, **fields})

    info = warning


def test_a_name_no_record_can_carry_is_passed_over_with_one_note_while_it_stays(tmp_path: Path) -> None:
    """A file name that is not UTF-8 (the kernel takes any bytes) made the record of the checkpoint
    raise inside the agent, which then died before its exit record: a clean exit taken for a lost
    learner. Passed over, it is never recorded, hashed nor counted by retention."""
    root = os.fsencode(tmp_path)
    for name in (b"ckpt_step_9\xff.pt", b"ckpt_step_8\xc3(.pt"):
        with open(root + b"/" + name, "wb") as file:
            file.write(b"x")
    (tmp_path / "ckpt_step_5.pt").write_bytes(b"kept")
    (tmp_path / "ckpt_step_1.pt").write_bytes(b"old")
    notes = Notes()
    scanner = CheckpointScanner(str(tmp_path), keep=1, notes=LearnerNotes(notes, time.monotonic))

    found = settle(scanner, scans=5)

    assert [each.name for each in found] == ["ckpt_step_1.pt", "ckpt_step_5.pt"]
    for each in found:
        as_checkpoint(each, str(tmp_path), rank=0, attempt=1)  # every one found can be recorded
    assert sorted(os.listdir(root)) == [b"ckpt_step_5.pt", b"ckpt_step_8\xc3(.pt", b"ckpt_step_9\xff.pt"]
    passed = [line for line in notes.lines if line["event"] == "learner checkpoint passed over"]
    assert sorted(line["name"] for line in passed) == [
        ascii("ckpt_step_8\udcc3(.pt"),
        ascii("ckpt_step_9\udcff.pt"),
    ]
    assert all("unicode" in line["reason"] for line in passed)


def test_a_name_whose_uri_is_past_what_a_record_carries_is_passed_over(tmp_path: Path) -> None:
    directory = tmp_path
    while len(str(directory)) < 3700:
        directory /= "d" * 200
    directory /= "e" * (3950 - len(str(directory)))  # a path the kernel still opens whole
    directory.mkdir(parents=True)
    parent = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:  # the file's own path is past the kernel's limit, and its URI past the record's
        os.close(os.open("c" * 200 + "_step_3.pt", os.O_WRONLY | os.O_CREAT, dir_fd=parent))
    finally:
        os.close(parent)
    notes = Notes()
    scanner = CheckpointScanner(str(directory), notes=LearnerNotes(notes, time.monotonic))

    assert settle(scanner, scans=3) == []
    assert [line["reason"] for line in notes.lines] == ["String should have at most 4096 characters"]


async def test_a_failure_to_report_a_found_checkpoint_is_noted_and_the_others_are_reported(
    tmp_path: Path,
) -> None:
    for step in (1, 2):
        (tmp_path / f"ckpt_step_{step}.pt").write_bytes(b"x")
    notes = Notes()
    scanner = CheckpointScanner(str(tmp_path), notes=LearnerNotes(notes, time.monotonic))
    reported: list[Checkpoint] = []

    def report(found: Found) -> None:
        if found.step == 1:
            raise ValueError("refused")
        reported.append(as_checkpoint(found, str(tmp_path), rank=0, attempt=1))

    await checkpoints.final_scan(scanner, report)

    assert [checkpoint.step for checkpoint in reported] == [2, 2]  # found, then handed over again
    assert [line["event"] for line in notes.lines] == ["checkpoint found but not reported"] * 2


def test_a_failing_scan_is_noted_within_the_learner_s_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: CheckpointScanner) -> list[Found]:
        raise RecursionError("whatever the learner left")

    monkeypatch.setattr(CheckpointScanner, "scan", fail)
    notes = Notes()
    scanner = CheckpointScanner(str(tmp_path), notes=LearnerNotes(notes, time.monotonic))

    for _ in range(NOTES_PER_INTERVAL + 5):
        assert checkpoints._scan_or_note(scanner) == []
    assert [line["event"] for line in notes.lines] == ["checkpoint scan failed"] * NOTES_PER_INTERVAL
