"""The namespace sandbox every local learner's command runs in (bubblewrap; DESIGN §6a).

The learner agent stays outside, as the platform's user: it keeps the heartbeat and writes the
learner's log. Only the command runs inside ``bwrap``, which the agent starts with the arguments
built here:

* **its own user, PID, IPC and cgroup namespaces** (``--unshare-user --unshare-pid --unshare-ipc
  --unshare-cgroup-try``): the learner sees only its own processes in ``/proc``, cannot signal or
  ``ptrace`` anything outside, has its own System V IPC and POSIX message queues; it cannot make
  user namespaces of its own (``--disable-userns``), which keeps much of the kernel out of reach;
* **a root of its own** built from nothing: the system's programs and libraries read-only
  (``/usr`` and the ``/bin``, ``/lib``... beside it, a short list of ``/etc`` files), the platform's
  interpreter and import path read-only (so a Python under ``/root``, mode 0700, runs: the bind is
  made by bwrap as the platform's user), a fresh ``/proc``, a minimal ``/dev`` (with a private
  ``/dev/shm``), a private ``/tmp``; and of the learners' root only the job's own working, checkpoint
  and result directories, writable, and the learner's report socket. Nothing else of the host
  exists in it: not the data directory, not the tenants file, not other jobs' directories, not
  the job's logs or pidfiles. The root itself is read-only (``--remount-ro /``): only the job's
  directories, ``/tmp`` and ``/dev/shm`` can be written. A protected path that lies inside a bound
  directory is covered again (a tmpfs over a directory, ``/dev/null`` over a file);
* **one life** (``--die-with-parent``, PID namespace): when the learner's shell ends, bwrap's init
  (PID 1 of the namespace) exits and the kernel kills every process left in the namespace, whatever
  ``setsid`` or double fork it did; when the agent dies, bwrap and the namespace die with it;
* **a network of the job's own** (``network="job"``, the default): every learner of a job enters the
  job's network namespace, with only a loopback interface, which its learners share to rendezvous
  (``torch.distributed``) and nobody else is in (:mod:`ffdl.adapters.launchers.job_network`); a
  namespace per learner would cut the rendezvous. With ``network="host"`` (the operator's choice,
  for learners that must reach the outside) they share the host's, and what that leaves open is in
  docs/security.md;
* **no controlling terminal** (``--new-session``), no capability (``--cap-drop ALL``: bwrap keeps
  them all for uid 0 inside, a learner run as root) and no new privileges (bwrap sets
  ``PR_SET_NO_NEW_PRIVS``; set-uid programs do not elevate);
* **an environment bwrap gives** (``--clearenv``, then ``--setenv NAME VALUE`` for each variable
  of the learner's, read from a descriptor: ``--args FD``, :func:`environment_file`): the programs
  that make the sandbox (the shell that joins the learner's cgroup, ``nsenter``, bwrap itself, all
  the platform's user) start with the platform's ``PATH`` alone (:func:`setup_environment`), so no
  variable of the job's (an allocator's tuning, a locale, a shell's startup file) is in their
  environment when the loader and the C library start them, and the env's values (a tenant's
  secrets) are on no command line: bwrap sets them as it parses its arguments, in its own memory,
  after its own start, and starts the learner's command with them;
* **a few system calls refused** (``--seccomp``, :data:`DENIED_SYSCALLS`, ``EPERM``): the kernel's
  keyrings, whose keys are charged to the sandbox's owner outside, root (one learner filled root's
  key quota, so that root on the host could add no key), and ``bpf`` and ``userfaultfd``, kernel
  attack surface no training program needs. System calls of another architecture (a 32-bit call on
  x86_64) kill the process. The agent hands bwrap the filter on a pipe (:func:`filter_pipe`).

Run as root, bwrap maps the learner's uid inside to root outside: the kernel checks the files a
learner touches as the owner of every root-owned file it can see. So the sandbox hides by mounts:
what is not bound does not exist, and what is bound read-only cannot be changed. The job's own
directories belong to the platform's user for that reason (inside they show as the learner's).

:func:`probe` checks once per process that the sandbox can be made here, with the interpreter in it.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyseccomp

from ffdl.adapters.launchers import job_network
from ffdl.adapters.launchers.isolation import LearnersCannotRun

#: Where the learner's report socket appears inside its sandbox (``FFDL_REPORT_SOCKET``).
REPORT_SOCKET_INSIDE = "/run/ffdl/report.sock"
#: The system's read-only top-level directories (or their symbolic links, on merged-/usr systems).
SYSTEM_DIRECTORIES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: What of ``/etc`` a program needs: users' names, name resolution, TLS roots, the loader, locale.
#: Nothing secret (``shadow``, host keys, the platform's own files) is among them.
ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "resolv.conf",
    "gai.conf",
    "protocols",
    "services",
    "localtime",
    "timezone",
    "os-release",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl/certs",
    "ca-certificates.conf",
    "mime.types",
    "fonts",
)
#: GPU device nodes every CUDA program needs besides its own ``/dev/nvidiaN`` (and MIG's capabilities).
#: What of the fresh ``/proc`` acts on the whole host when written: the sysctls (``kernel.core_pattern``
#: names a program the kernel runs as root, outside), ``sysrq-trigger`` (reboot), interrupts, buses,
#: drivers. Each is covered read-only: the kernel lets the learner's uid, root outside, write them
#: without any capability (a sysctl's mode is checked against the global root uid), and bwrap's own
#: cover skips them when it cannot write them itself while it builds the sandbox.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "acpi", "scsi", "driver", "fs", "pressure", "mtrr")
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps")
PROBE_TIMEOUT_S = 60.0
#: What the programs that make a learner's sandbox get of the platform's environment (they find
#: nothing by it: each is named by its path; bwrap gives the learner its own).
SETUP_VARIABLES = ("PATH",)
#: What a sandboxed learner may not call (see the module docstring).
DENIED_SYSCALLS = ("add_key", "keyctl", "request_key", "bpf", "userfaultfd")


class SandboxUnavailable(LearnersCannotRun):
    """The sandbox cannot be made on this host; the message names the cause and the fix."""


@dataclass(frozen=True, slots=True)
class LearnerPlaces:
    """What one learner's sandbox holds of the host besides the system and the interpreter."""

    #: Directories the learner writes (its job's working, checkpoint and result directories).
    writable: Sequence[Path]
    #: Directories it reads (a job's data directory).
    readable: Sequence[Path]
    #: The agent's report socket outside, bound at :data:`REPORT_SOCKET_INSIDE`.
    report_socket: Path
    #: Its working directory inside.
    work_dir: Path
    #: The host's GPU indices it holds.
    gpus: Sequence[int] = ()
    #: The job's network it enters (:mod:`ffdl.adapters.launchers.job_network`); None: the host's.
    network: job_network.JobNetwork | None = None


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How to make learners' sandboxes on this host: bwrap, the paths every sandbox reads, and the
    paths no sandbox may see even where they lie inside one of those."""

    bwrap: str
    interpreter: tuple[Path, ...]
    protected: tuple[Path, ...]
    #: job: each job's learners get a network namespace of the job's own, with only its loopback
    #: (:mod:`ffdl.adapters.launchers.job_network`); host: they share the host's, and reach all it does
    network: Literal["job", "host"] = "job"

    @classmethod
    def for_this_interpreter(
        cls, protected: Iterable[Path], bwrap: str | None = None, network: Literal["job", "host"] = "job"
    ) -> Sandbox:
        """The sandbox for learners run with this process's interpreter and import path.

        Raises :class:`SandboxUnavailable` when there is no bwrap."""
        found = bwrap or shutil.which("bwrap")
        if found is None:
            raise SandboxUnavailable(
                "bubblewrap (bwrap) is not installed: install it (apt-get install bubblewrap) so that "
                "learners run sandboxed, or opt out with FFDL_SANDBOX=off (ffdl up --no-sandbox) to run "
                "tenant code unconfined"
            )
        resolved = tuple(sorted({path.resolve() for path in protected}))
        return cls(found, interpreter_paths(), resolved, network)

    def base_arguments(self, uid: int, gid: int) -> list[str]:
        """Everything of a learner's sandbox that is the same for every learner."""
        arguments = [
            self.bwrap,
            "--unshare-user",
            "--disable-userns",
            "--cap-drop",  # bwrap keeps every capability for uid 0 inside (FFDL_LEARNER_USER=root)
            "ALL",
            "--uid",
            str(uid),
            "--gid",
            str(gid),
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--proc",
            "/proc",
            *_proc_arguments(),
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
        ]
        arguments += _system_arguments()
        for path in self.interpreter:
            arguments += ["--ro-bind", str(path), str(path)]
        for path in self.protected:
            if path.exists() and any(path.is_relative_to(bound) for bound in self.interpreter):
                arguments += (
                    ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
                )
        return arguments

    def arguments(self, places: LearnerPlaces, uid: int, gid: int) -> list[str]:
        """bwrap's command line for one learner, up to the ``--`` after which its command follows
        (behind the ``nsenter`` that puts it in its job's network namespace, if it has one)."""
        arguments = self.base_arguments(uid, gid)
        for directory in places.readable:
            arguments += ["--ro-bind", str(directory), str(directory)]
        for directory in places.writable:
            arguments += ["--bind", str(directory), str(directory)]
        arguments += ["--ro-bind", str(places.report_socket), REPORT_SOCKET_INSIDE]
        arguments += _gpu_arguments(places.gpus)
        entered: list[str] = []
        if places.network is not None:
            entered = job_network.enter_arguments(places.network)
            arguments += ["--ro-bind", str(places.network.nsswitch), "/etc/nsswitch.conf"]
        return [*entered, *arguments, "--remount-ro", "/", "--chdir", str(places.work_dir), "--"]

    def check(self, uid: int, gid: int, environment: dict[str, str]) -> None:
        """Make one sandbox now, and run this interpreter in it to import the learners' helper, as a
        learner would: raises :class:`SandboxUnavailable` naming what failed (cached per process)."""
        problem = _probe(
            tuple(self.base_arguments(uid, gid)), sys.executable, tuple(sorted(environment.items()))
        )
        if problem:
            raise SandboxUnavailable(
                f"bubblewrap cannot run a learner here: {problem}. Learners need user, mount and PID "
                "namespaces (run as root, or enable unprivileged user namespaces) and this Python "
                f"({sys.executable}) inside; fix that, or opt out with FFDL_SANDBOX=off "
                "(ffdl up --no-sandbox) to run tenant code unconfined"
            )
        if self.network == "job" and (problem := job_network.probe()):
            raise SandboxUnavailable(
                f"a network namespace per job cannot be made here: {problem}. It needs root and iproute2; "
                "fix that, or let learners share the host's network with FFDL_SANDBOX_NETWORK=host "
                "(they then reach every port of the host's loopback interface: docs/security.md)"
            )


def interpreter_paths() -> tuple[Path, ...]:
    """The directories this interpreter needs, read-only: its prefixes, its executable's directory
    and its import path (a venv's ``.pth`` files may add other trees), outside ``/usr`` (bound
    whole), each once, none inside another (a protected path inside one is covered again by
    :meth:`Sandbox.base_arguments`)."""
    import_path = list(sys.path)
    started_from = _started_from()
    if started_from in import_path:
        import_path.remove(started_from)  # once: a second entry was put there on purpose
    candidates = {
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.exec_prefix),
        Path(sys.executable).parent,
        Path(os.path.realpath(sys.executable)).parent,
        *(Path(entry) for entry in import_path if entry and os.path.isabs(entry)),
    }
    # the path as this process names it and the path it resolves to: both must exist inside
    existing = {form for path in candidates if path.exists() for form in (path.absolute(), path.resolve())}
    roots: list[Path] = []
    for path in sorted(existing, key=lambda candidate: len(candidate.parts)):
        if path.is_relative_to("/usr") or any(path.is_relative_to(root) for root in roots):
            continue
        if path == Path(path.anchor):
            raise SandboxUnavailable(
                f"the interpreter's import path holds {path}: binding it would show the host"
            )
        roots.append(path)
    return tuple(roots)


def _started_from() -> str | None:
    """The entry Python put first on this process's import path when it started: the working
    directory under ``python -m`` (``cd /root && python -m ffdl up`` would show ``/root``, its keys
    and credentials, to every learner), a script's own directory. It is where the platform was
    started from, not a place learners import from. None under ``-P``/``-I``, or after ``-c``."""
    if sys.flags.safe_path:
        return None
    words = iter(sys.orig_argv[1:])
    for word in words:
        if word == "-m":
            return os.getcwd()
        if word in ("-c", "-"):
            return None
        if word in ("-W", "-X", "--check-hash-based-pycs"):
            next(words, None)
        elif not word.startswith("-"):
            return os.path.dirname(os.path.realpath(word))
    return None


def _system_arguments() -> list[str]:
    arguments: list[str] = []
    for name in SYSTEM_DIRECTORIES:
        path = Path(name)
        if path.is_symlink():
            arguments += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            arguments += ["--ro-bind", name, name]
    for name in ETC_FILES:
        path = Path("/etc") / name
        if path.exists():
            arguments += ["--ro-bind", str(path), str(path)]
    return arguments


def _proc_arguments() -> list[str]:
    """Cover what of ``/proc`` writes to the host read-only (:data:`PROC_READ_ONLY`)."""
    covered = [Path("/proc") / name for name in PROC_READ_ONLY]
    return [word for path in covered if path.exists() for word in ("--ro-bind", str(path), str(path))]


def _gpu_arguments(gpus: Sequence[int]) -> list[str]:
    """The GPUs' device nodes (and what the driver reads in ``/sys``), where this host has them."""
    nodes = [Path(f"/dev/nvidia{gpu}") for gpu in gpus]
    nodes = [node for node in nodes if node.exists()]
    if not nodes:
        return []
    nodes += [Path("/dev") / name for name in NVIDIA_CONTROL_DEVICES if (Path("/dev") / name).exists()]
    arguments = [argument for node in nodes for argument in ("--dev-bind", str(node), str(node))]
    return [*arguments, "--ro-bind", "/sys", "/sys"]


@functools.cache
@functools.cache
def filter_program() -> bytes:
    """The seccomp filter of :data:`DENIED_SYSCALLS`, as the BPF program bwrap loads."""
    program = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    program.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
    for name in DENIED_SYSCALLS:
        program.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    read, write = os.pipe()
    with os.fdopen(write, "wb") as out:
        program.export_bpf(out)
    with os.fdopen(read, "rb") as exported:
        return exported.read()


def filter_pipe() -> int:
    """The reading end of a pipe holding :func:`filter_program`, for ``bwrap --seccomp FD``: the
    caller passes it to bwrap (``pass_fds``) and closes its own copy once bwrap is started."""
    read, write = os.pipe()
    try:
        os.write(write, filter_program())  # a few hundred bytes: never more than a pipe holds
    finally:
        os.close(write)
    return read


def filtered(arguments: Sequence[str], descriptor: int) -> list[str]:
    """bwrap's command line (:meth:`Sandbox.arguments`, ending in ``--``) with the filter on
    ``descriptor`` loaded before the command."""
    return _before_command(arguments, "--seccomp", str(descriptor))


def setup_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of the programs that make a learner's sandbox, run as the platform's user:
    :data:`SETUP_VARIABLES` of ``environ`` (the platform's, never the job's), ``PATH`` at least."""
    kept = {name: environ[name] for name in SETUP_VARIABLES if environ.get(name)}
    return {"PATH": os.defpath, **kept}


def environment_arguments(environment: Mapping[str, str]) -> bytes:
    """bwrap's arguments that make ``environment`` the whole environment of the command it starts:
    ``--clearenv``, then ``--setenv NAME VALUE`` for each variable, each word ended by a NUL, as
    ``--args FD`` reads them (a value may hold anything but a NUL: spaces, newlines, ``=``)."""
    words = [b"--clearenv"]
    for name, value in environment.items():
        words += [b"--setenv", os.fsencode(name), os.fsencode(value)]
    if any(b"\0" in word for word in words) or any(not name or "=" in name for name in environment):
        raise ValueError("a variable's name is not empty and holds no '=' or NUL, its value no NUL")
    return b"".join(word + b"\0" for word in words)


def environment_file(environment: Mapping[str, str]) -> int:
    """A descriptor to read :func:`environment_arguments` from, from its start, for ``bwrap --args
    FD``: the caller passes it to bwrap (``pass_fds``), which closes it once read, and closes its
    own copy once bwrap is started. A sealed memory file, not a pipe: a job's env (64 KiB) and the
    platform's variables may be more than a pipe holds before bwrap reads it."""
    data = environment_arguments(environment)
    descriptor = os.memfd_create("ffdl-learner-environment", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(descriptor, fcntl.F_ADD_SEALS, seals)
        os.lseek(descriptor, 0, os.SEEK_SET)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def with_environment(arguments: Sequence[str], descriptor: int) -> list[str]:
    """bwrap's command line (ending in ``--``) with the command's environment read from
    ``descriptor`` (:func:`environment_file`): bwrap clears its own and sets the learner's before it
    starts the command. Its own (what it was started with) is :func:`setup_environment`'s."""
    return _before_command(arguments, "--args", str(descriptor))


def _before_command(arguments: Sequence[str], *words: str) -> list[str]:
    if not arguments or arguments[-1] != "--":
        raise ValueError("the sandbox's arguments end with '--', after which the command follows")
    return [*arguments[:-1], *words, "--"]


def _probe(base: tuple[str, ...], python: str, environment: tuple[tuple[str, str], ...]) -> str | None:
    """What keeps a learner from running here, or None. The interpreter gets ``environment`` as a
    learner gets its own (bwrap sets it), and bwrap the setup's."""
    variables = dict(environment)
    seccomp = filter_pipe()
    try:
        given = environment_file(variables)
    except BaseException:
        os.close(seccomp)
        raise
    arguments = with_environment(filtered([*base, "--chdir", "/", "--"], seccomp), given)
    try:
        result = subprocess.run(
            [*arguments, python, "-c", "import ffdl.learner"],
            env=setup_environment(variables),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            pass_fds=(seccomp, given),
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    finally:
        os.close(seccomp)
        os.close(given)
    if result.returncode != 0:
        return (result.stderr.decode(errors="replace").strip() or f"exit status {result.returncode}")[-400:]
    return None


def sandbox_processes(bwrap_pid: int) -> list[int]:
    """The processes of the sandbox ``bwrap_pid`` runs, as this process's pids, but its init (PID 1
    inside, bwrap's own reaper): those a stop signal is for."""
    try:
        children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
    except OSError:
        return []
    inits = [int(child) for child in children]
    namespaces = {namespace for init in inits if (namespace := _pid_namespace(init)) is not None}
    if not namespaces:
        return []
    members = []
    for entry in os.scandir("/proc"):
        if (
            entry.name.isdigit()
            and int(entry.name) not in inits
            and _pid_namespace(int(entry.name)) in namespaces
        ):
            members.append(int(entry.name))
    return members


def signal_sandbox(bwrap_pid: int, signum: int) -> int:
    """Send ``signum`` to every process of the sandbox (as a process group signal would reach them
    all, ``setsid`` or not); how many got it."""
    sent = 0
    for pid in sandbox_processes(bwrap_pid):
        try:
            os.kill(pid, signum)
            sent += 1
        except ProcessLookupError:
            continue
    return sent


def _pid_namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


__all__ = [
    "REPORT_SOCKET_INSIDE",
    "SETUP_VARIABLES",
    "LearnerPlaces",
    "Sandbox",
    "SandboxUnavailable",
    "environment_arguments",
    "environment_file",
    "interpreter_paths",
    "sandbox_processes",
    "setup_environment",
    "signal_sandbox",
    "with_environment",
]
