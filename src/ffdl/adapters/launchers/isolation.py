"""Keeping local learners away from the platform's files: the learner user, and directories for them.

Where the platform runs as root, the local launcher runs each learner's command as an unprivileged
user (``Settings.learner_user``, ``nobody`` by default) while the learner agent stays root, so the
agent can still write heartbeats into the platform's data directory and the command cannot. That
only holds if the command cannot reach the data directory (mode 0700, owned by the platform's
user: :func:`protect_data_dir`) and cannot swap a directory the platform writes into: the learners'
root and every directory above it must be owned by root or the platform's user and be writable by
nobody else (a sticky ``/tmp`` is fine), which :func:`prepare_learners_root` checks. It also checks
that the learner user can reach the root at all, so a misplaced root is a clear error at start, not
a learner that dies with "permission denied".

Where the platform does not run as root, learners run as its own user: their environment is still
the platform-built one, but nothing on this machine keeps them from the platform's files.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import structlog

from ffdl.adapters.launchers.user_switch import switching_command

log = structlog.get_logger(__name__)

#: Where the platform's own files may be reached only by the platform's user.
DATA_DIR_MODE = 0o700
#: Directories learners traverse but may not change: the root and each job's directory.
TRAVERSE_ONLY_MODE = 0o711
#: Directories a learner owns: its working directory, checkpoints and results.
LEARNER_DIR_MODE = 0o700
#: Directories only the platform enters: a job's logs, pidfiles and report channels.
PLATFORM_DIR_MODE = 0o700
PROBE_TIMEOUT_S = 60.0


class LearnersCannotRun(RuntimeError):
    """No learner could run as this launcher is set up; the message names the cause and the fix."""


@dataclass(frozen=True, slots=True)
class LearnerUser:
    """The unprivileged user a learner's command runs as (the agent keeps the platform's user)."""

    name: str
    uid: int
    gid: int

    @property
    def run_as(self) -> str:
        """How the agent is told whom to run the command as: ``UID:GID``."""
        return f"{self.uid}:{self.gid}"

    def can_enter(self, directory: Path) -> bool:
        """Whether this user may traverse ``directory`` and every directory above it."""
        try:
            return all(self._may_traverse(entry) for entry in [directory, *directory.parents])
        except OSError:
            return False

    def _may_traverse(self, directory: Path) -> bool:
        info = directory.stat()
        if info.st_uid == self.uid:
            return bool(info.st_mode & stat.S_IXUSR)
        if info.st_gid == self.gid:
            return bool(info.st_mode & stat.S_IXGRP)
        return bool(info.st_mode & stat.S_IXOTH)


def learner_user(spec: str) -> LearnerUser | None:
    """The user learners' commands run as, for ``spec`` (a name, ``UID`` or ``UID:GID``).

    None when there is no one to switch to: the platform does not run as root (it cannot switch),
    or ``spec`` names root itself (the operator opted out, which is logged). Raises ValueError for
    a user that does not exist, or a group of root's (gid 0): a learner holds no id of root's.
    """
    if os.geteuid() != 0:
        return None
    user = _resolve(spec)
    if user.uid == 0:
        log.warning("learners run as root: they can reach the platform's data directory", learner_user=spec)
        return None
    if user.gid <= 0:
        raise ValueError(
            f"learner_user {spec!r}: gid {user.gid} is root's group; a learner must hold no id of root's "
            "(name a group of its own: UID:GID)"
        )
    return user


def _resolve(spec: str) -> LearnerUser:
    uid_text, _, gid_text = spec.partition(":")
    try:
        entry = pwd.getpwuid(int(uid_text)) if uid_text.isdigit() else pwd.getpwnam(uid_text)
    except KeyError:
        entry = None
    if entry is None and not uid_text.isdigit():
        raise ValueError(f"learner_user {spec!r}: no such user")
    uid = entry.pw_uid if entry is not None else int(uid_text)
    gid = int(gid_text) if gid_text.isdigit() else entry.pw_gid if entry is not None else uid
    return LearnerUser(entry.pw_name if entry is not None else uid_text, uid, gid)


def protect_data_dir(data_dir: Path) -> None:
    """Make the data directory the platform's alone (log, heartbeats, tenants, projections).

    A directory of another user cannot be made so; that matters only where the platform runs as root
    (learners then run as another user, whom this mode keeps out), so only then is it logged.
    """
    data_dir.mkdir(parents=True, exist_ok=True, mode=DATA_DIR_MODE)
    info = data_dir.stat()
    if info.st_uid == os.geteuid():
        data_dir.chmod(DATA_DIR_MODE)
    elif os.geteuid() == 0 and info.st_mode & 0o077:
        log.warning(
            "the data directory belongs to another user and others may enter it: learners on this "
            "machine might reach the platform's files",
            data_dir=str(data_dir),
            mode=oct(stat.S_IMODE(info.st_mode)),
        )


def prepare_learners_root(root: Path, user: LearnerUser | None) -> None:
    """Create the learners' root; where learners run as ``user``, check that it is safe and reachable.

    Where no other user runs learners (sandboxed, or as the platform's own user) the root is the
    platform's alone: a sandboxed learner is root outside as far as files go, so it can leave a
    set-uid file of root's in its working directory and open that directory to everyone; only the
    root's mode keeps the host's other users from running it."""
    if user is None:
        root.mkdir(parents=True, exist_ok=True, mode=PLATFORM_DIR_MODE)
        if root.stat().st_uid == os.geteuid():
            root.chmod(PLATFORM_DIR_MODE)
        return
    root.mkdir(parents=True, exist_ok=True, mode=TRAVERSE_ONLY_MODE)
    root.chmod(TRAVERSE_ONLY_MODE)
    for directory in [root, *root.parents]:
        problem = _unsafe(directory)
        if problem:
            raise ValueError(
                f"learners' root {root}: {directory} {problem}, so a learner could swap a directory the "
                "platform writes into; choose another FFDL_LEARNERS_DIR"
            )
    if not user.can_enter(root):
        raise ValueError(
            f"learners' root {root}: the learner user {user.name} cannot reach it (a directory above it "
            "is closed to others); choose another FFDL_LEARNERS_DIR"
        )


def _unsafe(directory: Path) -> str | None:
    info = directory.lstat()
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if info.st_uid not in (0, os.geteuid()):
        return f"belongs to uid {info.st_uid}"
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        return "is writable by others"
    return None


def make_directory(path: Path, mode: int, owner: LearnerUser | None = None) -> None:
    """Create ``path`` (and its parents) with ``mode``, handed to ``owner`` when there is one.

    An existing directory is only accepted when it is one (not a link a learner planted) and has the
    owner it should have; its mode is then set again.
    """
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    info = path.lstat()
    owners = {os.geteuid(), owner.uid if owner is not None else os.geteuid()}
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in owners:
        raise RuntimeError(f"{path} is not a directory of uid {sorted(owners)}: refusing to use it")
    if owner is not None:
        os.chown(path, owner.uid, owner.gid)
    path.chmod(mode)


def check_interpreter_reachable(user: LearnerUser, python: str) -> None:
    """Refuse to start when unsandboxed learners, run as ``user``, could not run ``python`` (a Python
    under ``/root``, mode 0700): every job would fail with exit status 127, restart after restart."""
    needed = {Path(python).parent, Path(python).resolve().parent, Path(sys.prefix), Path(sys.base_prefix)}
    unreachable = sorted(str(directory) for directory in needed if not user.can_enter(directory))
    if unreachable:
        raise LearnersCannotRun(
            f"the learner user {user.name} cannot reach this Python ({python}: {', '.join(unreachable)} "
            "closed to it), so no learner could run; run learners sandboxed (the default, FFDL_SANDBOX), "
            "install Python where others can reach it, or set FFDL_LEARNER_USER"
        )


def check_user_switch(user: LearnerUser, python: str) -> None:
    """Refuse to start when unsandboxed learners could not be started as ``user``: run an empty
    command through the user switch (:mod:`ffdl.adapters.launchers.user_switch`) with ``python``, as
    a learner's starts, or every job would fail with exit status 125, restart after restart."""
    problem = _switch_problem(user, python)
    if problem:
        raise LearnersCannotRun(
            f"learners cannot be started as the learner user {user.name} here: {problem}. The platform "
            "(root) switches to it with this Python, which needs CAP_SETUID and CAP_SETGID; fix that, "
            "or run learners sandboxed (the default, FFDL_SANDBOX)"
        )


def _switch_problem(user: LearnerUser, python: str) -> str | None:
    given = os.memfd_create("ffdl-probe-environment", os.MFD_CLOEXEC)
    try:
        os.write(given, b"--clearenv\0")  # an empty environment, as bwrap's --args words
        os.lseek(given, 0, os.SEEK_SET)
        result = subprocess.run(
            switching_command(python, given, user.uid, user.gid, ["/bin/sh", "-c", ":"]),
            cwd="/",
            env={"PATH": os.defpath},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            pass_fds=(given,),
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    finally:
        os.close(given)
    if result.returncode != 0:
        return (result.stderr.decode(errors="replace").strip() or f"exit status {result.returncode}")[-400:]
    return None
