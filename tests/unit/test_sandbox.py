"""The sandbox's command line and the learner's cgroup: what a learner's sandbox holds, what its
limits are, and how its processes are found; the sandbox itself runs in the contract and hostile suites."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ffdl.adapters.launchers.cgroups import (
    CPU_PERIOD_US,
    PIDS_MAX,
    Limits,
    joining_command,
    make_group,
    remove_job_groups,
)
from ffdl.adapters.launchers.sandbox import (
    REPORT_SOCKET_INSIDE,
    LearnerPlaces,
    Sandbox,
    SandboxUnavailable,
    environment_arguments,
    environment_file,
    filter_pipe,
    filtered,
    interpreter_paths,
    sandbox_processes,
    setup_environment,
    with_environment,
)
from ffdl.events.model import LEARNER_AGENT_MEMORY_MB
from tests.services import wait_until

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def binds(arguments: list[str], kind: str) -> list[str]:
    return [arguments[index + 2] for index, word in enumerate(arguments) if word == kind]


def test_a_learner_holds_its_own_places_writable_and_nothing_of_the_platform(tmp_path: Path) -> None:
    data_dir, root = tmp_path / "data", tmp_path / "learners"
    data_dir.mkdir()
    root.mkdir()
    interpreter = tmp_path  # an interpreter installed above the platform's directories
    sandbox = Sandbox("/usr/bin/bwrap", (interpreter,), (data_dir, root))
    job = root / "job-1"
    places = LearnerPlaces(
        writable=[job / "work", job / "checkpoints"],
        readable=[Path("/datasets/digits")],
        report_socket=job / "channels" / "attempt-1-rank-0" / "report.sock",
        work_dir=job / "work",
    )

    arguments = sandbox.arguments(places, 65534, 65534)

    assert arguments[-5:] == ["--remount-ro", "/", "--chdir", str(job / "work"), "--"]
    assert binds(arguments, "--bind") == [str(job / "work"), str(job / "checkpoints")]
    assert str(places.report_socket) in arguments and REPORT_SOCKET_INSIDE in arguments
    assert "/datasets/digits" in binds(arguments, "--ro-bind")
    # the platform's places inside the bound interpreter tree are covered again, before the job's
    tmpfs = [arguments[index + 1] for index, word in enumerate(arguments) if word == "--tmpfs"]
    assert {str(data_dir.resolve()), str(root.resolve())} <= set(tmpfs)
    assert arguments.index(str(root.resolve())) < arguments.index(str(job / "work"))
    flags = ("--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc", "--die-with-parent")
    for flag in (*flags, "--new-session"):
        assert flag in arguments
    assert "/etc" not in binds(arguments, "--ro-bind")
    assert not any(path.endswith("shadow") for path in binds(arguments, "--ro-bind"))
    # the host's sysctls are read-only over the fresh /proc (the e2e suite tries to open one)
    assert arguments.index("--proc") < arguments.index("/proc/sys") and "/proc/sys" in binds(
        arguments, "--ro-bind"
    )


def test_the_interpreter_paths_cover_this_python_and_none_twice() -> None:
    paths = interpreter_paths()
    assert any(Path(os.path.realpath(sys.executable)).is_relative_to(path) for path in paths)
    assert all(not a.is_relative_to(b) for a in paths for b in paths if a != b)


@pytest.mark.parametrize("started", [["-m", "show"], ["show.py"]])
def test_the_directory_the_platform_was_started_from_is_not_bound(tmp_path: Path, started: list[str]) -> None:
    # ``cd /root && python -m ffdl up`` puts /root first on the import path: binding it would show
    # root's keys and credentials to every learner (and a script's directory is no import path either)
    home = tmp_path / "home"
    home.mkdir()
    (home / "show.py").write_text(
        "from ffdl.adapters.launchers.sandbox import interpreter_paths\n"
        "print('\\n'.join(map(str, interpreter_paths())))\n"
    )

    shown = subprocess.run(
        [sys.executable, *started], cwd=home, capture_output=True, text=True, check=True
    ).stdout.split()

    assert shown and not any(home.is_relative_to(path) for path in map(Path, shown)), shown


def test_without_bwrap_the_sandbox_cannot_be_made_and_says_how_to_opt_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable, match="FFDL_SANDBOX=off"):
        Sandbox.for_this_interpreter([])


@needs_bwrap
def test_the_processes_of_a_sandbox_are_found_from_outside_but_its_init(tmp_path: Path) -> None:
    sandbox = Sandbox.for_this_interpreter([])
    base = sandbox.base_arguments(os.geteuid(), os.getegid())
    bwrap = subprocess.Popen([*base, "--", "/bin/sh", "-c", "setsid sleep 30 & exec sleep 31"])

    def commands() -> list[bytes]:
        found = []
        for pid in sandbox_processes(bwrap.pid):
            with contextlib.suppress(OSError):
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        return sorted(found)

    try:
        # both sleeps, the setsid one too, and not bwrap's init
        wait_until(lambda: commands() == [b"sleep\x0030\x00", b"sleep\x0031\x00"], 10.0, what="both sleeps")
    finally:
        bwrap.kill()
        bwrap.wait()


def test_limits_come_from_the_manifest_less_the_agent_s_share_of_the_memory() -> None:
    limits = Limits.for_learner("job-1", 2, 0, cpus=1.5, memory_mb=512)
    assert limits == Limits("job-1-a2-r0", (512 - LEARNER_AGENT_MEMORY_MB) << 20, 150_000, PIDS_MAX)
    # a job submitted before the floor of twice the agent's share keeps at least that share
    assert (
        Limits.for_learner("job-1", 2, 0, cpus=1.5, memory_mb=16).memory_bytes
        == LEARNER_AGENT_MEMORY_MB << 20
    )
    assert Limits.from_json(limits.to_json()) == limits
    with pytest.raises(ValueError, match="cannot name a directory"):
        Limits.from_json(limits.to_json().replace("job-1-a2-r0", "../escape"))


def test_a_v1_host_gets_each_limit_in_its_controller_and_says_which_it_lacks(tmp_path: Path) -> None:
    for controller in ("memory", "cpu"):
        (tmp_path / controller).mkdir()
    (tmp_path / "pids").write_text("not a hierarchy")
    limits = Limits.for_learner("job-1", 1, 0, cpus=2, memory_mb=128)

    group = make_group(limits, tmp_path)

    memory = tmp_path / "memory" / "ffdl" / "job-1-a1-r0"
    cpu = tmp_path / "cpu" / "ffdl" / "job-1-a1-r0"
    assert group.directories == (memory, cpu)
    assert (memory / "memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (cpu / "cpu.cfs_quota_us").read_text() == str(2 * CPU_PERIOD_US)
    assert [problem.split(":")[0] for problem in group.not_enforced] == ["pids"]
    command = joining_command(group, ["bwrap", "--"])
    assert command[-2:] == ["bwrap", "--"] and str(memory / "cgroup.procs") in command


def test_a_stopped_jobs_leftover_groups_are_removed_and_no_other_jobs(tmp_path: Path) -> None:
    for controller in ("memory", "pids"):
        for name in ("job-1-a1-r0", "job-1-a2-r3", "job-1-a1-r0x", "job-1-abc-a1-r0", "job-2-a1-r0"):
            (tmp_path / controller / "ffdl" / name).mkdir(parents=True)

    assert remove_job_groups("job-1", tmp_path) == []

    left = sorted(path.name for path in (tmp_path / "memory" / "ffdl").iterdir())
    assert left == ["job-1-a1-r0x", "job-1-abc-a1-r0", "job-2-a1-r0"]


KEYRING_AND_ECHO = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
SYS_ADD_KEY = {"x86_64": 248, "aarch64": 217}[os.uname().machine]
found = libc.syscall(SYS_ADD_KEY, b"user", b"hog", b"x" * 16, 16, -4)  # KEY_SPEC_USER_KEYRING
print(found, errno.errorcode.get(ctypes.get_errno()), os.getpid())
"""


@needs_bwrap
@pytest.mark.parametrize("uid", [0, 65534])
def test_a_sandboxed_learner_holds_no_capability_whatever_its_user(uid: int) -> None:
    """bwrap keeps every capability for uid 0 inside its user namespace: a learner run as root
    (FFDL_LEARNER_USER=root) held them all in the sandbox, which the docs said kept none."""
    sandbox = Sandbox.for_this_interpreter([])
    base = [*sandbox.base_arguments(uid, uid), "--chdir", "/", "--"]
    status = subprocess.run(
        [*base, "/bin/cat", "/proc/self/status"], capture_output=True, text=True, check=True
    ).stdout
    held = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith("Cap")}
    assert held["CapEff"] == held["CapPrm"] == held["CapBnd"] == "0" * 16


@needs_bwrap
def test_a_sandboxed_learner_may_not_touch_the_keyrings_and_runs_otherwise(tmp_path: Path) -> None:
    """Keys are charged to the sandbox's owner outside, root: a learner that added keys filled root's
    quota, and root on the host could add none."""
    sandbox = Sandbox.for_this_interpreter([])
    base = [*sandbox.base_arguments(os.geteuid(), os.getegid()), "--chdir", "/", "--"]
    descriptor = filter_pipe()
    try:
        shown = subprocess.run(
            [*filtered(base, descriptor), sys.executable, "-c", KEYRING_AND_ECHO],
            capture_output=True,
            text=True,
            check=True,
            pass_fds=(descriptor,),
        ).stdout.split()
    finally:
        os.close(descriptor)

    assert shown[:2] == ["-1", "EPERM"] and shown[2] == "2"  # refused; and PID 2, under bwrap's init
    with pytest.raises(ValueError, match="end with '--'"):
        filtered(base[:-1], 3)


#: Values a job's env may hold, which must reach its command as they are: one word to bwrap each.
AWKWARD_VALUES = {
    "SPACES": " a value  with spaces ",
    "NEWLINES": "line one\nline two\n",
    "EQUALS": "a=b==c=",
    "NON_ASCII": "\u00e9t\u00e9 \u65e5\u672c \U0001f389",
    "OPTION": "--setenv",
    "CLEARS": "--clearenv",
    "EMPTY": "",
    "QUOTES": "'\"$(id)`id`\\",
    "dotted.and-dashed": "x",
}


@needs_bwrap
def test_bwrap_gives_the_command_exactly_the_environment_it_read_from_a_descriptor() -> None:
    """bwrap starts with the setup's environment alone and sets the command's from a memory file: values
    with spaces, newlines, ``=``, non-ASCII, option-like words; and more than a pipe holds (64 KiB)."""
    large = {f"LARGE_{index}": f"{index}:" + "x" * 400 for index in range(256)}
    given = {"PATH": "/usr/bin:/bin", **AWKWARD_VALUES, **large}
    assert len(environment_arguments(given)) > 64 * 1024
    sandbox = Sandbox.for_this_interpreter([])
    base = [*sandbox.base_arguments(os.geteuid(), os.getegid()), "--chdir", "/", "--"]
    descriptor = environment_file(given)
    try:
        shown = subprocess.run(
            [*with_environment(base, descriptor), "/usr/bin/env", "-0"],
            env=setup_environment({"PATH": "/usr/bin:/bin", "MALLOC_PERTURB_": "85", "HOME": "/root"}),
            capture_output=True,
            check=True,
            pass_fds=(descriptor,),
        ).stdout
    finally:
        os.close(descriptor)

    seen = dict(os.fsdecode(entry).split("=", 1) for entry in shown.split(b"\0") if entry)
    assert seen == {**given, "PWD": "/"}  # bwrap's own PWD, where the command runs


def test_the_setup_keeps_only_the_platforms_path_and_the_command_line_holds_no_value() -> None:
    assert setup_environment({"PATH": "/opt/bin:/usr/bin", "LANG": "C.UTF-8", "FFDL_TOKEN": "x"}) == {
        "PATH": "/opt/bin:/usr/bin"
    }
    assert setup_environment({}) == {"PATH": os.defpath}
    arguments = with_environment(["/usr/bin/bwrap", "--unshare-pid", "--"], 7)
    assert arguments == ["/usr/bin/bwrap", "--unshare-pid", "--args", "7", "--"]
    words = environment_arguments({"A": "1", "B": "x\ny"}).split(b"\0")
    assert words == [b"--clearenv", b"--setenv", b"A", b"1", b"--setenv", b"B", b"x\ny", b""]
    for refused in ({"A": "x\0y"}, {"A=B": "x"}, {"": "x"}):
        with pytest.raises(ValueError, match="NUL"):
            environment_arguments(refused)
    with pytest.raises(ValueError, match="end with '--'"):
        with_environment(["/usr/bin/bwrap"], 7)
