"""A network namespace per job for the local launcher's sandboxes: a loopback of the job's own.

A job's learners on one machine rendezvous on the loopback interface (``torch.distributed``'s
``MASTER_ADDR`` 127.0.0.1, gloo and NCCL sockets), so they must share one; with the host's, every
learner also reached every port on the host's loopback (the platform's API, Kafka, etcd, MQTT,
another job's rendezvous port), every abstract unix socket of the host, and saw every socket of the
host in ``/proc/net``. Each job now gets a named namespace (``ip netns``, ``/run/netns/ffdl-...``)
with only ``lo``, up; every learner's sandbox enters it (``nsenter --net=...`` in front of bwrap,
which then execs in its place, so the agent's child is bwrap as before). Nothing outside the job is
reachable from it, the outside network included: the operator who wants learners to reach it (a
data service, a package index) chooses the host's network instead (``FFDL_SANDBOX_NETWORK=host``),
knowing what that opens (docs/security.md).

No name server is reachable from it, so a learner's sandbox reads host names from files alone (an
``nsswitch.conf`` of its own, bound over the host's): a lookup that is not in ``/etc/hosts`` fails
at once as unknown, as on a host without DNS, rather than as a temporary failure (torch's c10d, for
one, warns on every reverse lookup of a peer's address that fails so).

The namespace is made before the job's first learner starts and removed when the launcher stops the
job's learners (every attempt's end, a halt, a cancel, a completion). A platform that stops between
the two leaves the learners running, for a restarted one to adopt, and their namespace with them;
one that nobody is in any more long after it was made is a leftover, and stops sweep those
(:func:`sweep`). Making one needs root (``CAP_SYS_ADMIN``);
:func:`probe` says whether this host can, once per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

#: Where ``ip netns`` keeps the namespaces it names.
NETNS_DIR = Path("/run/netns")
#: How long one ``ip`` command may take.
IP_TIMEOUT_S = 10.0
#: How long after its making a job's namespace with no process in it is taken for a leftover: a live
#: job's is empty only from its making to its first learner's start, and between attempts it is removed.
LEFTOVER_AFTER_S = 600.0


class JobNetworkUnavailable(RuntimeError):
    """A job's network namespace cannot be made; the message says why."""


@dataclass(frozen=True, slots=True)
class JobNetwork:
    """What a learner's sandbox needs of its job's network."""

    #: the namespace, for ``nsenter --net``
    namespace: Path
    #: the name service switch bound over the sandbox's ``/etc/nsswitch.conf``
    nsswitch: Path


def write_nsswitch(path: Path) -> Path:
    """Write the host's ``/etc/nsswitch.conf`` with host names from files alone to ``path``."""
    host = Path("/etc/nsswitch.conf")
    lines = host.read_text().splitlines() if host.exists() else []
    kept = [line for line in lines if not line.lstrip().startswith("hosts:")]
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text("\n".join([*kept, "hosts: files"]) + "\n")
    temporary.chmod(0o644)
    temporary.replace(path)
    return path


def namespace_name(job_id: str) -> str:
    """The job's namespace's name: from a digest of its id (any id, within a file name's bounds)."""
    return "ffdl-" + hashlib.sha256(job_id.encode()).hexdigest()[:24]


def namespace_path(job_id: str) -> Path:
    """Where the job's namespace is bound, for ``nsenter --net``."""
    return NETNS_DIR / namespace_name(job_id)


def enter_arguments(network: JobNetwork) -> list[str]:
    """The words in front of bwrap's that run it inside the job's namespace."""
    return [_tool("nsenter"), f"--net={network.namespace}", "--"]


async def ensure(job_id: str) -> Path:
    """Make the job's namespace with its loopback up; its path. Raises
    :class:`JobNetworkUnavailable` with ``ip``'s own words.

    One that a process is still in (a learner of an earlier attempt that outlived its kill) is kept;
    any other left there (by a launch that failed after making it, or an ``ip netns add`` cut short,
    which leaves a plain file) is made afresh, so that its age is this launch's: :func:`sweep` takes
    an empty namespace made long ago for a leftover, and the one a launch is about to enter is empty.
    The caller keeps the two apart (a sweep between this and the learners' start would find the new
    one young, not one made anew after the sweep listed it)."""
    name = namespace_name(job_id)
    path = NETNS_DIR / name
    if path.exists():
        try:
            occupied = bool(await _ip("netns", "pids", name))
        except JobNetworkUnavailable:  # no namespace mounted there
            occupied = False
        if not occupied:
            await _ip("netns", "delete", name)
    if not path.exists():
        await _ip("netns", "add", name)
    await _ip("-n", name, "link", "set", "lo", "up")
    return path


async def remove(job_id: str) -> None:
    """Remove the job's namespace, if there is one (a failure is logged: the job has ended anyway)."""
    name = namespace_name(job_id)
    if not (NETNS_DIR / name).exists():
        return
    try:
        await _ip("netns", "delete", name)
    except JobNetworkUnavailable as error:
        log.warning("job network namespace left behind", job_id=job_id, namespace=name, error=str(error))


async def sweep(older_than_s: float = LEFTOVER_AFTER_S) -> list[str]:
    """Remove the platform's namespaces that no process is in and that were made over
    ``older_than_s`` ago (see the module docstring); their names. Not while :func:`ensure` runs
    (the caller's to keep apart): a namespace listed old could be made anew meanwhile."""
    swept: list[str] = []
    for name in _made_before(time.time() - older_than_s):
        try:
            if await _ip("netns", "pids", name):
                continue
            await _ip("netns", "delete", name)
        except JobNetworkUnavailable as error:
            log.warning("leftover job network namespace not removed", namespace=name, error=str(error))
            continue
        log.info("leftover job network namespace removed", namespace=name)
        swept.append(name)
    return swept


@functools.cache
def probe() -> str | None:
    """What keeps this host from making a job's namespace, or None (made and removed once per process)."""
    name = f"ffdl-probe-{os.getpid()}"
    try:
        ip, nsenter = _tool("ip"), _tool("nsenter")
    except JobNetworkUnavailable as error:
        return str(error)
    commands = [
        [ip, "netns", "add", name],
        [ip, "-n", name, "link", "set", "lo", "up"],
        [nsenter, f"--net={NETNS_DIR / name}", "--", ip, "-o", "link", "show", "lo"],
    ]
    try:
        for command in commands:
            result = subprocess.run(command, capture_output=True, timeout=IP_TIMEOUT_S, check=False)
            if result.returncode != 0:
                said = result.stderr.decode(errors="replace").strip() or f"exit status {result.returncode}"
                return f"{' '.join(command[:4])}: {said[-300:]}"
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    finally:
        if (NETNS_DIR / name).exists():
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):  # a sweep takes it later
                subprocess.run(
                    [ip, "netns", "delete", name], capture_output=True, timeout=IP_TIMEOUT_S, check=False
                )
    return None


async def _ip(*arguments: str) -> str:
    """What ``ip ARGUMENTS`` prints, or :class:`JobNetworkUnavailable` with what it said instead."""
    process = await asyncio.create_subprocess_exec(
        _tool("ip"),
        *arguments,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(IP_TIMEOUT_S):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise JobNetworkUnavailable(
            f"ip {' '.join(arguments)}: no answer within {IP_TIMEOUT_S:g} s"
        ) from None
    if process.returncode != 0:
        said = stderr.decode(errors="replace").strip() or f"exit status {process.returncode}"
        raise JobNetworkUnavailable(f"ip {' '.join(arguments)}: {said[-300:]}")
    return stdout.decode(errors="replace").strip()


def _made_before(cutoff: float) -> list[str]:
    """The platform's namespaces made before ``cutoff`` (wall-clock seconds), by name."""
    made: list[str] = []
    for path in sorted(NETNS_DIR.glob("ffdl-*")) if NETNS_DIR.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
            if path.stat().st_mtime < cutoff:
                made.append(path.name)
    return made


def _tool(name: str) -> str:
    """A system tool's path (``ip`` lives in ``/usr/sbin``, which a non-root PATH may lack)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if found is None:
        raise JobNetworkUnavailable(f"{name} is not installed (apt-get install iproute2 util-linux)")
    return found
