"""A cgroup per local learner, with the manifest's CPU and memory limits (DESIGN §6a).

The launcher says what a learner may use (:class:`Limits`, from the job's ``cpus`` and
``memory_mb``) and names its group; the learner agent makes the group before it starts the sandbox,
starts the sandbox inside it (a shell that moves itself into the group, then ``exec``s bwrap, so
every process of the learner is born inside) and removes the group once the learner ended.
Unsandboxed, the shell ``exec``s the command, or, where a root platform runs it as the learner
user, the user switch (:mod:`ffdl.adapters.launchers.user_switch`): the shell joins as root, and
the command, that user's, can write no ``cgroup.procs``. The agent itself stays outside: an
out-of-memory kill in the group can only pick the learner's processes.

Hosts differ. Where the cgroup v1 controllers ``memory``, ``cpu`` and ``pids`` are mounted under
``/sys/fs/cgroup`` and writable (the platform runs as root), each limit is enforced:

* ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap is accounted) =
  ``memory_mb``: the kernel kills the learner's processes beyond it;
* ``cpu.cfs_quota_us`` = ``cpus`` x ``cpu.cfs_period_us``: the learner gets at most that much CPU time;
* ``pids.max`` = :data:`PIDS_MAX`: a fork bomb stops there.

A controller that is missing or not writable is not enforced, and the agent says so in its log. A
unified (cgroup v2) hierarchy is used when it has the controllers (``memory.max``, ``cpu.max``,
``pids.max``); an empty one, as on hosts that mount v1 beside it, is not.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ffdl.events.model import LEARNER_AGENT_MEMORY_MB

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The most processes (and threads) one learner may have.
PIDS_MAX = 4096
CPU_PERIOD_US = 100_000
#: Where every learner's group lives, under each hierarchy.
PARENT = "ffdl"


@dataclass(frozen=True, slots=True)
class Limits:
    """What one learner may use, and the name of its group (one per job, attempt and rank)."""

    name: str
    memory_bytes: int
    cpu_quota_us: int
    pids_max: int = PIDS_MAX

    @classmethod
    def for_learner(cls, job_id: str, attempt: int, rank: int, cpus: float, memory_mb: int) -> Limits:
        """The limits of a learner that asked for ``cpus`` and ``memory_mb``: its agent, outside the
        group, takes :data:`LEARNER_AGENT_MEMORY_MB` of the memory (a job submitted before that
        floor keeps at least as much again)."""
        learner_mb = max(memory_mb - LEARNER_AGENT_MEMORY_MB, LEARNER_AGENT_MEMORY_MB)
        return cls(
            name=f"{job_id}-a{attempt}-r{rank}",
            memory_bytes=learner_mb * 1024 * 1024,
            cpu_quota_us=max(1000, round(cpus * CPU_PERIOD_US)),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Limits:
        raw = json.loads(text)
        limits = cls(
            name=str(raw["name"]),
            memory_bytes=int(raw["memory_bytes"]),
            cpu_quota_us=int(raw["cpu_quota_us"]),
            pids_max=int(raw["pids_max"]),
        )
        if "/" in limits.name or limits.name in ("", ".", ".."):
            raise ValueError(f"cgroup name {limits.name!r} cannot name a directory")
        return limits


@dataclass(frozen=True, slots=True)
class LearnerGroup:
    """The groups made for one learner (one per hierarchy), and the limits not enforced."""

    directories: tuple[Path, ...]
    not_enforced: tuple[str, ...]

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """Where a process writes its pid to join the groups."""
        return tuple(directory / "cgroup.procs" for directory in self.directories)

    def remove(self) -> list[str]:
        """Remove the groups (they must be empty: the learner ended); what could not be removed."""
        problems = []
        for directory in self.directories:
            try:
                directory.rmdir()
            except FileNotFoundError:
                continue
            except OSError as error:
                problems.append(f"{directory}: {error.strerror}")
        return problems


def make_group(limits: Limits, root: Path = CGROUP_ROOT) -> LearnerGroup:
    """Make the learner's groups with their limits, on whichever hierarchies this host has."""
    unified = root / "unified" if (root / "unified" / "cgroup.controllers").exists() else root
    if _controllers(unified) >= {"memory", "cpu", "pids"}:
        return _make_v2(unified, limits)
    return _make_v1(root, limits)


def _controllers(hierarchy: Path) -> set[str]:
    try:
        return set((hierarchy / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def _make_v1(root: Path, limits: Limits) -> LearnerGroup:
    settings = {
        "memory": [
            ("memory.limit_in_bytes", limits.memory_bytes),
            ("memory.memsw.limit_in_bytes", limits.memory_bytes),
        ],
        "cpu": [("cpu.cfs_period_us", CPU_PERIOD_US), ("cpu.cfs_quota_us", limits.cpu_quota_us)],
        "pids": [("pids.max", limits.pids_max)],
    }
    directories: list[Path] = []
    not_enforced: list[str] = []
    for controller, files in settings.items():
        directory = root / controller / PARENT / limits.name
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for name, value in files:
                if name == "memory.memsw.limit_in_bytes" and not (directory / name).exists():
                    continue  # swap is not accounted on this host: the memory limit is the limit
                (directory / name).write_text(str(value))
        except OSError as error:
            with contextlib.suppress(OSError):
                directory.rmdir()
            not_enforced.append(f"{controller}: {error.strerror or error}")
            continue
        directories.append(directory)
    return LearnerGroup(tuple(directories), tuple(not_enforced))


def _make_v2(hierarchy: Path, limits: Limits) -> LearnerGroup:
    parent = hierarchy / PARENT
    directory = parent / limits.name
    try:
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text("+memory +cpu +pids")
        directory.mkdir(exist_ok=True)
        (directory / "memory.max").write_text(str(limits.memory_bytes))
        (directory / "cpu.max").write_text(f"{limits.cpu_quota_us} {CPU_PERIOD_US}")
        (directory / "pids.max").write_text(str(limits.pids_max))
    except OSError as error:
        with contextlib.suppress(OSError):
            directory.rmdir()
        return LearnerGroup((), (f"memory, cpu, pids: {error.strerror or error}",))
    return LearnerGroup((directory,), ())


def remove_job_groups(job_id: str, root: Path = CGROUP_ROOT) -> list[str]:
    """Remove the (empty) groups of every learner of ``job_id`` that are left: an agent killed after
    the stop grace could not remove its own. What could not be removed (a process still in it)."""
    name = re.compile(rf"\A{re.escape(job_id)}-a\d+-r\d+\Z")
    problems = []
    for parent in [*root.glob(f"*/{PARENT}"), root / PARENT]:
        try:
            groups = [entry for entry in parent.iterdir() if name.match(entry.name)]
        except OSError:
            continue
        for group in groups:
            try:
                group.rmdir()
            except OSError as error:
                problems.append(f"{group}: {error.strerror}")
    return problems


def joining_command(group: LearnerGroup, command: list[str]) -> list[str]:
    """``command`` started by a shell that first moves itself into ``group``, so that everything
    ``command`` starts is born inside it (no window where a child escapes the limits)."""
    if not group.directories:
        return command
    script = (
        'for procs in "$@"; do [ "$procs" = -- ] && break; echo $$ > "$procs" || exit 125; shift; done; '
        'shift; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "ffdl-cgroup", *map(str, group.procs_files), "--", *command]


__all__ = [
    "CGROUP_ROOT",
    "PIDS_MAX",
    "LearnerGroup",
    "Limits",
    "joining_command",
    "make_group",
    "remove_job_groups",
]
