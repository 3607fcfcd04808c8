"""Checkpoint discovery and retention in ``FFDL_CHECKPOINT_DIR``, for the learner agent (architecture §6a).

A training program written for ``torchrun`` saves checkpoints and never calls ffdl; the agent finds
them. What counts as a checkpoint, at the top of the checkpoint directory:

* a regular file with a step in its name (``ckpt_step_120.pt``, ``120.pt``, ``step=120.ckpt``,
  ``epoch=2-step=120.ckpt``, ``model-120.safetensors``) whose size, modification time and inode
  stayed the same over two scans. A file renamed into place is complete as it appears; a file
  written in place (``torch.save(state, "ckpt_120.pt")``) is complete once it stops changing;
* a directory with a step in its name (``checkpoint-120/``, ``step_120/``) holding a completion
  marker (:data:`COMPLETION_MARKERS`: ``torch.distributed.checkpoint``'s ``.metadata``, written
  last, or an explicit ``COMPLETE``), whose listing stayed the same over two scans.

The step comes from the name (after ``step``, else the last number of it) or from a sidecar
``NAME.step`` holding the number, which wins. Names that say "not done" (a leading dot, ``.tmp``,
``.partial``, ``~``...) are never checkpoints, and neither are names that no checkpoint record can
carry (not UTF-8, or a URI past its length): they are passed over with a note, once while they
stay. A checkpoint is recorded once its SHA-256 is known (for a directory: the hash of its manifest
of files, as :func:`ffdl.learner.report_checkpoint` computes it), with its size; the newest (highest
step) becomes the learner's checkpoint, which the monitor records and the next attempt gets as
``FFDL_RESUME_FROM``.

Retention (``FFDL_KEEP_CHECKPOINTS``, the manifest's ``keep_checkpoints``; 0 keeps everything):
after a new checkpoint is recorded, complete checkpoints beyond the newest N are deleted, never the
one the attempt resumed from, nor the newest.

The directory is written by the tenant's code, which may be hostile, while the agent runs with the
platform's privileges. So: the directory and everything in it are opened relative to directory
descriptors with ``O_NOFOLLOW`` (a symlink is never followed, at any depth: each component is
opened on its own), a file is read only after ``fstat`` on the opened descriptor says it is a
regular file with one link (no FIFO blocks the agent, no hard link to another's file is hashed),
a scan looks at most at :data:`MAX_ENTRIES` names and hashes at most :data:`HASH_BYTES_PER_SCAN`
bytes (a big checkpoint is hashed over several scans, incrementally, and only once), and deletion
is ``unlinkat`` / ``unlinkat(AT_REMOVEDIR)`` relative to the directory's descriptor, after checking that the
name still holds what was recorded. The agent runs each scan in a worker thread, so the heartbeat
never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import structlog

from ffdl.events.model import Checkpoint, JobSpec, checkpoint_uri_problem
from ffdl.events.reports import MAX_STEP
from ffdl.learner.channel import LearnerNotes

log = structlog.get_logger(__name__)

#: Names in the checkpoint directory looked at per scan.
MAX_ENTRIES = 1000
#: Entries (files and directories, at any depth) in one checkpoint directory, and its depth.
MAX_ENTRIES_PER_CHECKPOINT = 10_000
#: Entries of checkpoint directories one scan walks, the newest directories first.
SCAN_ENTRIES_MAX = 2 * MAX_ENTRIES_PER_CHECKPOINT
MAX_DEPTH = 8
#: Bytes hashed per scan, over every checkpoint still being hashed.
HASH_BYTES_PER_SCAN = 32 * 1024 * 1024
READ_CHUNK = 1024 * 1024
#: What a sidecar ``NAME.step`` may hold.
SIDECAR_MAX_BYTES = 32
SIDECAR_SUFFIX = ".step"
#: Files whose presence says a checkpoint directory is completely written.
COMPLETION_MARKERS = frozenset({".metadata", "COMPLETE", ".complete", "_SUCCESS", "DONE"})
#: What a learner keeps without ``FFDL_KEEP_CHECKPOINTS``: the manifest's default.
DEFAULT_KEEP: int = JobSpec.model_fields["keep_checkpoints"].default

_NOT_DONE = re.compile(r"(\A\.|~\Z|\.(tmp|temp|part|partial|lock|incomplete)(\.|\Z)|\Atmp)", re.IGNORECASE)
_STEP_NAMED = re.compile(r"step[_=-]?(\d{1,18})", re.IGNORECASE)
_LAST_NUMBER = re.compile(r"(\d{1,18})(?!.*\d)")
_EXTENSIONS = re.compile(r"(\.[A-Za-z][A-Za-z0-9]{0,15})+\Z")
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def step_of_name(name: str) -> int | None:
    """The step a checkpoint's name says: the number after ``step``, else the last number of the
    name without its extensions (``checkpoint-120`` 120, ``120.pt`` 120, ``epoch=2-step=120.ckpt``
    120); None when there is none."""
    if found := _STEP_NAMED.search(name):
        return int(found.group(1))
    stem = _EXTENSIONS.sub("", name)
    found = _LAST_NUMBER.search(stem)
    return int(found.group(1)) if found else None


@dataclass(frozen=True, slots=True)
class Found:
    """A complete checkpoint: its name in the directory, step, size and ``sha256:`` checksum."""

    name: str
    step: int
    size_bytes: int
    checksum: str
    mtime_ns: int


@dataclass(slots=True)
class _Hashing:
    """A checkpoint being hashed, over as many scans as its size needs."""

    identity: tuple[int, ...]
    step: int
    mtime_ns: int
    files: list[tuple[str, ...]]  # paths from the checkpoint directory: (name,) for a file
    sizes: list[int]
    is_dir: bool
    index: int = 0
    offset: int = 0
    current: hashlib._Hash = field(default_factory=hashlib.sha256)
    manifest: hashlib._Hash = field(default_factory=hashlib.sha256)


class CheckpointScanner:
    """Finds the complete checkpoints in one directory, scan after scan; see the module docstring.

    Scans run one at a time (a lock): the agent scans in a worker thread, and a scan whose caller was
    cancelled (the learner exited mid-scan) runs on to its end in that thread while the next waits.
    What the learner's directory makes the scanner say goes to ``notes`` (the agent's, bounded).
    """

    def __init__(
        self,
        directory: str,
        *,
        resume_from: str = "",
        keep: int = DEFAULT_KEEP,
        notes: LearnerNotes | None = None,
    ) -> None:
        self._directory = directory
        self._resume_name = _name_in(directory, resume_from)
        self._keep = keep
        self._notes = notes if notes is not None else LearnerNotes(log, time.monotonic)
        self._seen: dict[str, tuple[int, ...]] = {}  # name -> what it looked like last scan
        self._hashing: dict[str, _Hashing] = {}
        self._recorded: dict[str, tuple[Found, tuple[int, ...]]] = {}
        # directories whose listing was refused (too many entries, or not only files and
        # directories), by how their top level looked then: not walked again each second
        self._refused: dict[str, tuple[int, ...]] = {}
        # names no record can carry, noted once while they stay
        self._passed_over: set[str] = set()
        self._lock = threading.RLock()

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def notes(self) -> LearnerNotes:
        return self._notes

    @property
    def settling(self) -> bool:
        """Whether a checkpoint seen in the last scan is still to be confirmed or hashed."""
        return bool(self._hashing) or any(name not in self._recorded for name in self._seen)

    @property
    def recorded(self) -> list[Found]:
        """Every checkpoint recorded and not deleted, oldest step first."""
        with self._lock:
            return sorted((found for found, _ in self._recorded.values()), key=_order)

    def scan(self) -> list[Found]:
        """One bounded scan: the checkpoints found complete by it, oldest step first (then pruned)."""
        with self._lock:
            try:
                root = os.open(self._directory, _OPEN_DIR)
            except OSError:
                return []  # not there yet, or not a directory the agent may read
            try:
                fresh = self._scan(root)
                if fresh:
                    self._prune(root)
                return fresh
            finally:
                os.close(root)

    def _scan(self, root: int) -> list[Found]:
        current: dict[str, tuple[int, ...]] = {}
        directories: list[tuple[int, str, os.stat_result]] = []
        passed_over: set[str] = set()
        for name, info in _entries(root, MAX_ENTRIES):
            if _NOT_DONE.search(name) or name.endswith(SIDECAR_SUFFIX) or name in self._recorded:
                continue
            is_dir = stat.S_ISDIR(info.st_mode)
            if not is_dir and (not stat.S_ISREG(info.st_mode) or info.st_nlink != 1):
                continue
            step = _sidecar_step(root, name + SIDECAR_SUFFIX)
            if step is None:
                step = step_of_name(name)
            if step is None or step > MAX_STEP:  # a step past what JSON keeps exact is no step
                continue  # (known before a directory is walked: a name without one never is)
            if (problem := checkpoint_uri_problem(_uri(self._directory, name))) is not None:
                # never hashed, recorded or counted by retention: its record would be refused
                passed_over.add(name)
                if name not in self._passed_over:
                    self._notes.warning(
                        "learner checkpoint passed over", name=ascii(name)[:300], reason=problem
                    )
                continue
            if is_dir:
                directories.append((step, name, info))
            else:
                self._settle(name, _identity(info), step, info, None, current)
        walk = _Walk(SCAN_ENTRIES_MAX)
        present = {name for _, name, _ in directories}
        refused = {name: identity for name, identity in self._refused.items() if name in present}
        for step, name, info in sorted(directories, reverse=True):  # the newest first
            identity = _identity(info)
            if refused.get(name) == identity:
                continue  # refused as it is: walked again once its top level changes
            if not _marked(root, name):
                continue  # being written: not walked (a learner may fill it with anything)
            try:
                listing = _listing(root, name, walk)
            except _BudgetSpent:
                break  # what is left waits for the next scan
            if listing is None or not COMPLETION_MARKERS & {path[0] for path, _ in listing if len(path) == 1}:
                refused[name] = identity
                continue
            self._settle(name, (*identity, hash(tuple(listing))), step, info, listing, current)
        self._refused = refused
        self._passed_over = passed_over
        for name in [
            name for name, hashing in self._hashing.items() if current.get(name) != hashing.identity
        ]:
            del self._hashing[name]  # changed or gone while being hashed: start again when it settles
        self._seen = current
        return self._hash(root)

    def _settle(
        self,
        name: str,
        identity: tuple[int, ...],
        step: int,
        info: os.stat_result,
        listing: list[tuple[tuple[str, ...], int]] | None,
        current: dict[str, tuple[int, ...]],
    ) -> None:
        """A candidate as this scan found it: hashed once it looks as it did in the last scan."""
        current[name] = identity
        if self._seen.get(name) != identity or name in self._hashing:
            return
        files: list[tuple[str, ...]]
        if listing is None:
            files, sizes = [(name,)], [info.st_size]
        else:
            files, sizes = [(name, *path) for path, _ in listing], [size for _, size in listing]
        self._hashing[name] = _Hashing(
            identity, step, info.st_mtime_ns, files, sizes, is_dir=listing is not None
        )

    def _hash(self, root: int) -> list[Found]:
        budget = HASH_BYTES_PER_SCAN
        fresh: list[Found] = []
        for name, hashing in sorted(self._hashing.items(), key=lambda item: item[1].step, reverse=True):
            if budget <= 0:
                break
            try:
                budget -= _advance(root, hashing, budget)
            except OSError:
                del self._hashing[name]  # swapped or unreadable: looked at again when it settles
                continue
            if hashing.index < len(hashing.files):
                continue
            del self._hashing[name]
            digest = hashing.manifest.hexdigest() if hashing.is_dir else hashing.current.hexdigest()
            found = Found(name, hashing.step, sum(hashing.sizes), f"sha256:{digest}", hashing.mtime_ns)
            self._recorded[name] = (found, hashing.identity)
            fresh.append(found)
        return sorted(fresh, key=_order)

    # -- retention ----------------------------------------------------------------------------

    def _prune(self, root: int) -> None:
        if self._keep <= 0:
            return
        ordered = self.recorded
        for found in ordered[: max(len(ordered) - self._keep, 0)]:
            if found.name == self._resume_name:
                continue
            _, identity = self._recorded.pop(found.name)
            _delete(root, found.name, identity)


def _order(found: Found) -> tuple[int, int]:
    return (found.step, found.mtime_ns)


def _name_in(directory: str, path: str) -> str:
    """``path``'s name when it lies directly in ``directory``, else ""."""
    if not path:
        return ""
    head, _, tail = path.rstrip("/").rpartition("/")
    return tail if os.path.normpath(head) == os.path.normpath(directory) else ""


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_mode, info.st_size, info.st_mtime_ns)


def _entries(directory: int, limit: int) -> Iterator[tuple[str, os.stat_result]]:
    """Up to ``limit`` names in ``directory`` (a descriptor) with their ``lstat``."""
    with os.scandir(directory) as entries:
        for count, entry in enumerate(entries):
            if count >= limit:
                return
            with contextlib.suppress(OSError):
                yield entry.name, entry.stat(follow_symlinks=False)


def _marked(root: int, name: str) -> bool:
    """Whether the directory ``name`` holds a completion marker, a plain file: looked up by name
    before anything is walked, so a directory still being written (or never finished: a hundred
    thousand empty directories cost a whole walk) costs a few ``lstat`` per scan."""
    try:
        descriptor = os.open(name, _OPEN_DIR, dir_fd=root)
    except OSError:
        return False
    try:
        for marker in COMPLETION_MARKERS:
            with contextlib.suppress(OSError):
                info = os.stat(marker, dir_fd=descriptor, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                    return True
        return False
    finally:
        os.close(descriptor)


class _BudgetSpent(Exception):
    """A scan walked as many entries as it may: the rest of the directories wait for the next."""


@dataclass(slots=True)
class _Walk:
    """What a scan may still walk of its checkpoint directories, in entries."""

    left: int


def _listing(root: int, name: str, walk: _Walk) -> list[tuple[tuple[str, ...], int]] | None:
    """A checkpoint directory's regular files (relative paths, sizes) in name order, its
    subdirectories walked without following a link; None when it holds more entries (files and
    directories) than allowed, or anything but files and directories. Each entry is taken from
    ``walk``; raises :class:`_BudgetSpent` once that is spent."""
    files: list[tuple[tuple[str, ...], int]] = []
    entries = 0

    def walk_in(parent: int, entry: str, prefix: tuple[str, ...]) -> bool:
        nonlocal entries
        try:
            descriptor = os.open(entry, _OPEN_DIR, dir_fd=parent)
        except OSError:
            return False
        try:
            for child, info in _entries(descriptor, MAX_ENTRIES_PER_CHECKPOINT + 1):
                entries += 1
                walk.left -= 1
                if entries > MAX_ENTRIES_PER_CHECKPOINT:
                    return False
                if walk.left < 0:
                    raise _BudgetSpent
                path = (*prefix, child)
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                    files.append((path, info.st_size))
                elif not (
                    stat.S_ISDIR(info.st_mode) and len(path) < MAX_DEPTH and walk_in(descriptor, child, path)
                ):
                    return False
            return True
        finally:
            os.close(descriptor)

    return sorted(files) if walk_in(root, name, ()) else None


def _open_beneath(root: int, path: tuple[str, ...]) -> int:
    """Open the regular file at ``path`` under ``root``, each component without following a link."""
    descriptors: list[int] = []
    try:
        parent = root
        for component in path[:-1]:
            parent = os.open(component, _OPEN_DIR, dir_fd=parent)
            descriptors.append(parent)
        descriptor = os.open(path[-1], _OPEN_FILE, dir_fd=parent)
    finally:
        for opened in descriptors:
            os.close(opened)
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(descriptor)
        raise OSError(errno.EINVAL, f"{'/'.join(path)} is no plain file")
    return descriptor


def _advance(root: int, hashing: _Hashing, budget: int) -> int:
    """Hash up to ``budget`` more bytes of ``hashing``; the bytes read. A file that is not its
    recorded size any more raises ``OSError`` (the checkpoint changed)."""
    spent = 0
    while hashing.index < len(hashing.files) and spent < budget:
        path, size = hashing.files[hashing.index], hashing.sizes[hashing.index]
        descriptor = _open_beneath(root, path)
        try:
            if os.fstat(descriptor).st_size != size:
                raise OSError(errno.ESTALE, f"{'/'.join(path)} changed")
            while hashing.offset < size and spent < budget:
                chunk = os.pread(
                    descriptor, min(READ_CHUNK, budget - spent, size - hashing.offset), hashing.offset
                )
                if not chunk:
                    raise OSError(errno.ESTALE, f"{'/'.join(path)} shrank")
                hashing.current.update(chunk)
                hashing.offset += len(chunk)
                spent += len(chunk)
        finally:
            os.close(descriptor)
        if hashing.offset < size:
            break
        if hashing.is_dir:
            relative = "/".join(path[1:])
            hashing.manifest.update(f"{relative}\0{size}\0{hashing.current.hexdigest()}\n".encode())
            hashing.current = hashlib.sha256()
        hashing.index += 1
        hashing.offset = 0
    return spent


def _sidecar_step(root: int, name: str) -> int | None:
    try:
        descriptor = _open_beneath(root, (name,))
    except OSError:
        return None
    try:
        text = os.read(descriptor, SIDECAR_MAX_BYTES + 1)
    finally:
        os.close(descriptor)
    value = text.strip()
    if len(text) > SIDECAR_MAX_BYTES or not value.isdigit():
        return None
    return int(value)


def _delete(root: int, name: str, identity: tuple[int, ...]) -> None:
    """Delete the checkpoint ``name`` if it is still what was recorded, without following a link."""
    try:
        info = os.stat(name, dir_fd=root, follow_symlinks=False)
    except OSError:
        return
    if _identity(info)[:3] != identity[:3]:
        return  # the name holds something else now: not ours to delete
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(info.st_mode):
            _remove_tree(root, name)
        else:
            os.unlink(name, dir_fd=root)
        with contextlib.suppress(OSError):
            os.unlink(name + SIDECAR_SUFFIX, dir_fd=root)


def _remove_tree(parent: int, name: str) -> None:
    """Remove the directory ``name`` in ``parent`` with what is in it, relative to descriptors and
    never through a link, without recursion (``shutil.rmtree`` recurses on this Python, and a
    learner may nest directories deeper than the stack: the ``RecursionError`` ended its agent before
    the exit record). At most :data:`MAX_DEPTH` directories deep and :data:`MAX_ENTRIES_PER_CHECKPOINT`
    entries, as a checkpoint is when it is recorded: what the learner put there since beyond that
    stays (in its own place), and the directory with it; :class:`OSError` then."""
    opened = [(parent, name, os.open(name, _OPEN_DIR, dir_fd=parent))]
    removed = 0
    try:
        while opened:
            _, _, directory = opened[-1]
            deeper = None
            with os.scandir(directory) as entries:
                for entry in entries:
                    removed += 1
                    if removed > MAX_ENTRIES_PER_CHECKPOINT:
                        raise OSError(errno.EFBIG, "too many entries to remove")
                    if entry.is_dir(follow_symlinks=False):
                        deeper = entry.name
                        break
                    os.unlink(entry.name, dir_fd=directory)
            if deeper is not None:
                if len(opened) > MAX_DEPTH:
                    raise OSError(errno.ELOOP, "nested too deeply to remove")
                opened.append((directory, deeper, os.open(deeper, _OPEN_DIR, dir_fd=directory)))
                continue
            above, own, _ = opened.pop()
            os.close(directory)
            os.rmdir(own, dir_fd=above)
    finally:
        for _, _, directory in opened:
            os.close(directory)


#: How often the agent scans, and how long its last scan after the learner's exit may take.
SCAN_INTERVAL_S = 1.0
FINAL_SCAN_TIMEOUT_S = 10.0
CHECKPOINT_DIR_VARIABLE = "FFDL_CHECKPOINT_DIR"
RESUME_FROM_VARIABLE = "FFDL_RESUME_FROM"
KEEP_VARIABLE = "FFDL_KEEP_CHECKPOINTS"


def scanner_for(environment: Mapping[str, str], rank: int, notes: LearnerNotes) -> CheckpointScanner | None:
    """The scanner of a learner's agent: rank 0's only (the learners of a job share the directory,
    and rank 0 is who saves in data-parallel training), None without a checkpoint directory."""
    directory = environment.get(CHECKPOINT_DIR_VARIABLE, "")
    if rank != 0 or not directory:
        return None
    keep = environment.get(KEEP_VARIABLE, "")
    return CheckpointScanner(
        directory,
        resume_from=environment.get(RESUME_FROM_VARIABLE, ""),
        keep=int(keep) if keep.isdigit() else DEFAULT_KEEP,
        notes=notes,
    )


def as_checkpoint(found: Found, directory: str, *, rank: int, attempt: int) -> Checkpoint:
    """The record of a found checkpoint, named as the learner sees it (its ``FFDL_RESUME_FROM``)."""
    return Checkpoint(
        rank=rank,
        attempt=attempt,
        step=found.step,
        uri=_uri(directory, found.name),
        size_bytes=found.size_bytes,
        checksum=found.checksum,
    )


def _uri(directory: str, name: str) -> str:
    return f"file://{os.path.join(directory, name)}"


async def discover(scanner: CheckpointScanner, on_found: Callable[[Found], None]) -> None:
    """Scan every :data:`SCAN_INTERVAL_S` in a worker thread, handing what is found to ``on_found``
    on the caller's loop, until cancelled."""
    while True:
        _hand_over(await asyncio.to_thread(_scan_or_note, scanner), scanner, on_found)
        await asyncio.sleep(SCAN_INTERVAL_S)


def _scan_or_note(scanner: CheckpointScanner) -> list[Found]:
    """A scan, or nothing when it fails: whatever the learner left in its directory, the agent goes
    on (its heartbeat, its exit record) and the scan is tried again (noted, within the bound)."""
    try:
        return scanner.scan()
    except Exception:
        scanner.notes.warning("checkpoint scan failed", directory=scanner.directory, exc_info=True)
        return []


def _hand_over(found: Iterable[Found], scanner: CheckpointScanner, on_found: Callable[[Found], None]) -> None:
    """Each checkpoint found to ``on_found``; one it fails on is noted and the rest handed over: a
    failure raised from here ended the agent before its exit record, and its clean exit was then
    taken for a lost learner."""
    for each in found:
        try:
            on_found(each)
        except Exception:
            scanner.notes.warning(
                "checkpoint found but not reported", name=ascii(each.name)[:300], exc_info=True
            )


async def final_scan(scanner: CheckpointScanner, on_found: Callable[[Found], None]) -> None:
    """After the learner exited nothing writes any more: scan until nothing is left to settle or
    hash (a checkpoint written on SIGTERM is recorded before the exit is reported), within
    :data:`FINAL_SCAN_TIMEOUT_S`; then every checkpoint recorded is handed over again, oldest first:
    the scan :func:`discover` was in when the learner exited recorded what it found, but its caller
    was cancelled before it could hand that over. All within the deadline, since a scan stuck in
    its thread (a hung file system) holds the scanner's lock."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(FINAL_SCAN_TIMEOUT_S):
            while True:
                _hand_over(await asyncio.to_thread(_scan_or_note, scanner), scanner, on_found)
                if not scanner.settling:
                    break
            _hand_over(await asyncio.to_thread(lambda: scanner.recorded), scanner, on_found)
