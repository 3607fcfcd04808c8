"""The helper a training program calls to tell the platform how far it got (architecture §6).

It needs nothing but the environment the platform sets for every learner:

* :func:`report_progress` and :func:`report_checkpoint` send one JSON line each over the unix socket
  named by ``FFDL_REPORT_SOCKET``, which the learner's agent listens on (:mod:`ffdl.learner.channel`);
  the agent publishes what it takes in the learner's heartbeat, which is what the monitor turns into
  progress and checkpoint records;
* :func:`resume_from` is the checkpoint to start from (``FFDL_RESUME_FROM``, empty on a fresh start);
* :func:`checkpoint_dir` is where checkpoints go (``FFDL_CHECKPOINT_DIR``, shared by the attempts).

Outside the platform ``FFDL_REPORT_SOCKET`` is unset: reports are then dropped with one warning, so
the same program runs on a laptop unchanged. A program that uses no helper still counts as
progressing while it writes new lines to its output.

Each process keeps one connection (a forked child opens its own, so two processes never write into
one stream), opened on the first report and again after a failure. Sending never holds the training
program up for long: connecting and sending are bounded by :data:`SEND_TIMEOUT_S`, and a report that
cannot be sent in that time is dropped with a warning. The agent takes about a thousand small reports
a second (:class:`~ffdl.learner.channel.LearnerBudget`): a program that reports faster waits in its
sends. A report that was sent survives the program
crashing right after it (the agent reads what is in the socket after the learner ended). The
functions are safe to call from several threads; lines from different threads never interleave.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import threading
import time
import warnings
from pathlib import Path

__all__ = ["checkpoint_dir", "report_checkpoint", "report_progress", "resume_from"]

REPORT_SOCKET_VARIABLE = "FFDL_REPORT_SOCKET"
RESUME_FROM_VARIABLE = "FFDL_RESUME_FROM"
CHECKPOINT_DIR_VARIABLES = ("FFDL_CHECKPOINT_DIR", "CHECKPOINT_DIR")
DEFAULT_CHECKPOINT_DIR = "checkpoints"

#: Seconds a report may take to connect and to be sent before it is dropped.
SEND_TIMEOUT_S = 2.0
#: The longest path ``connect`` takes for a unix socket (longer ones are reached through their directory).
_MAX_SOCKET_PATH = 107

_warned_unreported = False
_lock = threading.Lock()
#: This process's connection to the agent, and the pid that opened it.
_connection: tuple[int, socket.socket] | None = None


def report_progress(step: int, **metrics: float) -> None:
    """Report that the program reached ``step`` (with metrics such as ``loss=0.3``).

    Metrics that are not finite numbers (a diverged loss) are left out: JSON cannot carry them.
    """
    if step < 0:
        raise ValueError(f"step must not be negative, got {step}")
    finite = {name: float(value) for name, value in metrics.items() if math.isfinite(value)}
    _append({"type": "progress", "step": int(step), "metrics": finite, "time": time.time(), **_local_rank()})


def report_checkpoint(path: str | Path, step: int) -> None:
    """Report a checkpoint (a file or a directory) that is completely written at ``path``.

    Its size and SHA-256 are computed here, so call this after the checkpoint was written (and
    renamed into place), never before.
    """
    if step < 0:
        raise ValueError(f"step must not be negative, got {step}")
    location = Path(path).resolve()
    size_bytes, checksum = _measure(location)
    _append(
        {
            "type": "checkpoint",
            "step": int(step),
            "uri": f"file://{location}",
            "size_bytes": size_bytes,
            "checksum": f"sha256:{checksum}",
            "time": time.time(),
        }
    )


def resume_from() -> Path | None:
    """The checkpoint this attempt starts from, or ``None`` on a fresh start."""
    value = os.environ.get(RESUME_FROM_VARIABLE, "")
    return Path(value) if value else None


def checkpoint_dir() -> Path:
    """The directory for checkpoints (created if missing); ``./checkpoints`` outside the platform."""
    value = next((os.environ[name] for name in CHECKPOINT_DIR_VARIABLES if os.environ.get(name)), "")
    directory = Path(value or DEFAULT_CHECKPOINT_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _local_rank() -> dict[str, int]:
    """``local_rank``: which of its learner's workers reports (torchrun's ``LOCAL_RANK``), if known."""
    value = os.environ.get("LOCAL_RANK", "")
    return {"local_rank": int(value)} if value.isdigit() else {}


def _append(report: dict[str, object]) -> None:
    global _warned_unreported  # noqa: PLW0603 - the one-time warning is process state by nature
    target = os.environ.get(REPORT_SOCKET_VARIABLE, "")
    if not target:
        if not _warned_unreported:
            _warned_unreported = True
            warnings.warn(
                f"{REPORT_SOCKET_VARIABLE} is not set (not running under ffdl): progress and checkpoint "
                "reports are dropped",
                RuntimeWarning,
                stacklevel=3,
            )
        return
    line = (json.dumps(report, separators=(",", ":"), allow_nan=False) + "\n").encode()
    with _lock:
        for attempt in range(2):  # a connection the agent closed is opened again, once
            try:
                _send(target, line)
                return
            except OSError as error:
                _disconnect()
                if attempt == 1 or isinstance(error, TimeoutError):
                    warnings.warn(f"ffdl report dropped: {error}", RuntimeWarning, stacklevel=3)
                    return


def _send(target: str, line: bytes) -> None:
    global _connection  # noqa: PLW0603 - one connection per process
    if _connection is None or _connection[0] != os.getpid():
        if _connection is not None:
            _connection[1].detach()  # the parent's: left to the parent, never written here
        _connection = (os.getpid(), _connect(target))
    # MSG_NOSIGNAL: a program that restored SIGPIPE must not die of an agent that closed the connection
    _connection[1].sendall(line, socket.MSG_NOSIGNAL)


def _connect(target: str) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    connection.settimeout(SEND_TIMEOUT_S)
    try:
        if len(os.fsencode(target)) <= _MAX_SOCKET_PATH:
            connection.connect(target)
        else:
            directory = os.open(os.path.dirname(target), os.O_PATH | os.O_CLOEXEC)
            try:
                connection.connect(f"/proc/self/fd/{directory}/{os.path.basename(target)}")
            finally:
                os.close(directory)
    except BaseException:
        connection.close()
        raise
    return connection


def _disconnect() -> None:
    global _connection  # noqa: PLW0603
    if _connection is not None:
        if _connection[0] == os.getpid():
            _connection[1].close()
        else:
            _connection[1].detach()
        _connection = None


def _measure(location: Path) -> tuple[int, str]:
    """Size and SHA-256 of a file; for a directory, the SHA-256 of its manifest of files.

    The manifest has one line per file, in name order: relative name, size and the file's SHA-256.
    """
    if location.is_file():
        return location.stat().st_size, _sha256_of(location)
    if not location.is_dir():
        raise FileNotFoundError(f"checkpoint {location} does not exist")
    manifest = hashlib.sha256()
    size_bytes = 0
    for file in sorted(p for p in location.rglob("*") if p.is_file()):
        file_size = file.stat().st_size
        size_bytes += file_size
        manifest.update(
            f"{file.relative_to(location).as_posix()}\0{file_size}\0{_sha256_of(file)}\n".encode()
        )
    return size_bytes, manifest.hexdigest()


def _sha256_of(file: Path) -> str:
    with file.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()
