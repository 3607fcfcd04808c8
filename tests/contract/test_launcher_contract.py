"""The launcher contract, run against every launcher adapter, and what only the local launcher does.

An adapter joins the contract with one entry in :data:`LAUNCHER_RIGS`.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import pwd
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from launcher_contract import (
    SHORT_GRACE_S,
    STOP_SLACK_S,
    WAIT_FOR_GO,
    CheckpointConfinementContract,
    LauncherContract,
    LauncherRig,
    beat,
    environment_of,
    exit_code,
    go_file_in,
    launch_request,
    new_job_id,
    wait_for_output,
    wait_for_running,
)

from ffdl.adapters.heartbeats import open_store
from ffdl.adapters.launchers import local as local_module
from ffdl.adapters.launchers.environment import COMMAND_DIR_VARIABLE, command_environment
from ffdl.adapters.launchers.local import LocalLauncher
from ffdl.adapters.launchers.sandbox import Sandbox
from ffdl.handlers.ports import HeartbeatStore, Launcher
from tests.kube import kubernetes_rig
from tests.services import wait_until_async

HEARTBEAT_TTL_S = 2.0
CLEANUP_GRACE_S = 1.0


class LocalRig:
    """Local launchers over one work directory, their learners reporting to an embedded store."""

    def __init__(
        self, work_dir: Path, heartbeats_url: str, sandbox: Sandbox | None = None, user: str | None = None
    ) -> None:
        self.work_dir = work_dir
        self.heartbeats_url = heartbeats_url
        self.sandbox = sandbox
        self.user = user
        self._store = open_store(heartbeats_url)
        self._launchers = [self.new_launcher()]

    def new_launcher(self, python: str | None = None) -> LocalLauncher:
        extra = {"python": python} if python else {}
        signals = [self.work_dir.parent / "signals"]  # the data place of go_file_in: a root, as an operator's
        return LocalLauncher(
            self.work_dir,
            self.heartbeats_url,
            heartbeat_ttl_s=HEARTBEAT_TTL_S,
            user=self.user,
            sandbox=self.sandbox,
            data_roots=signals,
            **extra,
        )

    @property
    def launcher(self) -> LocalLauncher:
        return self._launchers[-1]

    @property
    def store(self) -> HeartbeatStore:
        return self._store

    async def restart_launcher(self) -> Launcher:
        await self.launcher.close()
        self._launchers.append(self.new_launcher())
        return self.launcher

    async def use_python(self, python: str) -> None:
        """Launch learners' agents with ``python`` from now on."""
        await self.launcher.close()
        self._launchers.append(self.new_launcher(python))

    def visible_devices(self, gpus: tuple[int, ...]) -> str:
        """A local learner sees every GPU of the machine and is told which of them are its own."""
        return ",".join(str(gpu) for gpu in gpus)

    def checkpoint_dir(self, job_id: str) -> str:
        return str(self.launcher.job_dir(job_id) / "checkpoints")

    async def learner_output(self, job_id: str, attempt: int, rank: int) -> str:
        path = self.launcher.log_path(job_id, attempt, rank)
        return path.read_text(errors="replace") if path.exists() else ""

    def pidfile(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.launcher.job_dir(job_id) / "run" / f"attempt-{attempt}-rank-{rank}.pid"

    async def shutdown(self) -> None:
        """Stop whatever a test left running, then close the launchers and the store."""
        if self.work_dir.is_dir():
            for job_dir in self.work_dir.iterdir():
                await self.launcher.stop(job_dir.name, CLEANUP_GRACE_S)
        for launcher in self._launchers:
            await launcher.close()
        await self._store.close()


@contextlib.asynccontextmanager
async def local_rig(tmp_path: Path) -> AsyncIterator[LocalRig]:
    rig = LocalRig(tmp_path / "jobs", f"embedded://{tmp_path / 'heartbeats.sqlite'}")
    try:
        yield rig
    finally:
        await rig.shutdown()


@contextlib.asynccontextmanager
async def sandboxed_local_rig(tmp_path: Path) -> AsyncIterator[LocalRig]:
    """The local launcher as ``ffdl up`` makes it by default: every learner in a bubblewrap sandbox
    (the heartbeat store, in ``tmp_path``, stays out of it)."""
    sandbox = Sandbox.for_this_interpreter([tmp_path / "heartbeats.sqlite"])
    rig = LocalRig(tmp_path / "jobs", f"embedded://{tmp_path / 'heartbeats.sqlite'}", sandbox)
    try:
        yield rig
    finally:
        await rig.shutdown()


#: Adapter name -> a context manager that gives a rig in a fresh directory and cleans it up.
LAUNCHER_RIGS: dict[str, Callable[[Path], AbstractAsyncContextManager[LauncherRig]]] = {
    "local": local_rig,
    "local-sandboxed": sandboxed_local_rig,
    "kubernetes": kubernetes_rig,
}


@pytest.fixture(params=sorted(LAUNCHER_RIGS))
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LauncherRig]:
    async with LAUNCHER_RIGS[request.param](tmp_path) as launcher_rig:
        yield launcher_rig


class TestLauncherContract(LauncherContract, CheckpointConfinementContract):
    """Every contract test, once per launcher adapter."""


# --------------------------------------------------------------------------- local launcher only


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalRig]:
    async with local_rig(tmp_path) as launcher_rig:
        yield launcher_rig


def process_exists(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def processes_in_group(group: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except FileNotFoundError:
            continue
        state, _, process_group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(process_group) == group and state not in "ZX":
            members.append(int(entry.name))
    return members


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""


def children_of(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def agent_pid(local: LocalRig, job_id: str, attempt: int, rank: int) -> int:
    return int(local.pidfile(job_id, attempt, rank).read_text().split()[0])


async def test_learners_run_in_the_job_directory_with_its_files(local: LocalRig) -> None:
    job_id = new_job_id()

    await local.launcher.launch(launch_request(job_id, "pwd; env", nodes=("node-a",)))

    assert await exit_code(local.store, job_id, 1, 0) == 0
    output = await local.learner_output(job_id, 1, 0)
    job_dir = local.work_dir.resolve() / job_id
    env = environment_of(output)
    assert output.splitlines()[0] == env["HOME"] == str(job_dir / "work")
    assert env["FFDL_CHECKPOINT_DIR"] == str(job_dir / "checkpoints")
    assert (job_dir / "checkpoints").is_dir()
    assert env["RESULT_DIR"] == str(job_dir / "results")
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["FFDL_HEARTBEATS"] == local.heartbeats_url
    assert float(env["FFDL_HEARTBEAT_TTL"]) == HEARTBEAT_TTL_S
    assert env["FFDL_LOG_FILE"] == str(local.launcher.log_path(job_id, 1, 0))
    assert Path(env["FFDL_REPORT_SOCKET"]).parent == job_dir / "channels" / "attempt-1-rank-0"


async def test_a_learner_process_killed_by_sigkill_is_reported_with_exit_code_minus_9(
    local: LocalRig,
) -> None:
    job_id = new_job_id()
    await local.launcher.launch(launch_request(job_id, "echo ready; sleep 60", nodes=("node-a",)))
    await wait_for_output(local, job_id, 1, 0, "ready")
    shells: list[int] = []

    async def shell_started_the_command() -> bool:
        learner = await beat(local.store, job_id, 0)
        shells[:] = [learner.pid] if learner is not None and learner.pid is not None else []
        return bool(shells) and bool(children_of(shells[0]))

    await wait_until_async(shell_started_the_command, 10.0, what="the learner's command to start")
    (user_process,) = children_of(shells[0])

    os.kill(user_process, signal.SIGKILL)

    assert await exit_code(local.store, job_id, 1, 0) == -9
    await wait_for_running(local.launcher, [])


async def test_stop_leaves_no_process_of_the_learner_behind(local: LocalRig) -> None:
    job_id = new_job_id()
    # A background process that ignores SIGTERM outlives the learner's shell: only SIGKILL ends it.
    command = "(trap '' TERM; sleep 60) & echo ready; wait"
    await local.launcher.launch(launch_request(job_id, command, nodes=("node-a",)))
    await wait_for_output(local, job_id, 1, 0, "ready")
    group = agent_pid(local, job_id, 1, 0)
    await wait_until_async(
        lambda: any(command_of(pid) == "sleep" for pid in processes_in_group(group)), 10.0, what="the sleep"
    )

    started = time.monotonic()
    await local.launcher.stop(job_id, SHORT_GRACE_S)

    assert SHORT_GRACE_S <= time.monotonic() - started < SHORT_GRACE_S + STOP_SLACK_S
    assert processes_in_group(group) == []
    assert not local.pidfile(job_id, 1, 0).exists()


async def test_agents_that_exit_are_reaped(local: LocalRig) -> None:
    job_id = new_job_id()
    await local.launcher.launch(launch_request(job_id, "exit 0", nodes=("node-a",)))
    pid = agent_pid(local, job_id, 1, 0)

    assert await exit_code(local.store, job_id, 1, 0) == 0
    await wait_until_async(lambda: not Path(f"/proc/{pid}").exists(), 10.0, what="the agent to be reaped")


async def test_a_failed_launch_starts_nothing_and_can_be_retried(local: LocalRig) -> None:
    job_id = new_job_id()
    request = launch_request(job_id, "exit 0")
    broken = local.new_launcher(python=str(local.work_dir / "no-such-python"))

    with pytest.raises(FileNotFoundError):
        await broken.launch(request)

    assert await local.launcher.running() == []
    await local.launcher.launch(request)
    assert [await exit_code(local.store, job_id, 1, rank) for rank in range(2)] == [0, 0]


async def test_a_restarted_launcher_stops_agents_that_are_no_longer_its_children(local: LocalRig) -> None:
    job_id = new_job_id()
    await local.launcher.launch(launch_request(job_id, "echo ready; sleep 60"))
    pids = [agent_pid(local, job_id, 1, rank) for rank in range(2)]
    await wait_for_output(local, job_id, 1, 1, "ready")

    restarted = await local.restart_launcher()
    await restarted.stop(job_id, SHORT_GRACE_S)

    assert not any(process_exists(pid) for pid in pids)
    assert [processes_in_group(pid) for pid in pids] == [[], []]


# ---------------------------------------------------------- the job's env and the sandbox's makers

#: A job's env as glibc, getopt and the shells read it: the allocator's tuning, getopt's order, a
#: shell's directories and the messages' language; a job's own PATH; and values no command line may
#: show (a tenant's secret), that must reach the learner as they are (spaces, newlines, ``=``,
#: non-ASCII, what looks like one of bwrap's options, nothing).
HOSTILE_ENV = {
    "MALLOC_PERTURB_": "85",
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_CHECK_": "3",
    "MALLOC_TOP_PAD_": "1",
    "POSIXLY_CORRECT": "1",
    "CDPATH": "/",
    "LANGUAGE": "xx",
    "TMPDIR": "/nonexistent",
    "PATH": "/opt/job/bin:/usr/bin:/bin",
    "TENANT_SECRET": "tenant-secret-7f3a with  spaces\nand a second line = \u00e9 \u65e5\u672c",
    "LOOKS_LIKE_AN_OPTION": "--bind / /",
    "EMPTY": "",
}
SECRET = "tenant-secret-7f3a"
#: What the programs that make a sandbox (as the platform's user, root) may have in their
#: environment: the platform's PATH, and the PWD the shell that joins the cgroup sets.
SETUP_NAMES = {"PATH", "PWD"}
as_root_with_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="a sandbox in its job's network needs bubblewrap and root",
)


def descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(FileNotFoundError):
            for child in map(int, (task / "children").read_text().split()):
                found += [child, *descendants(child)]
    return found


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(os.fsdecode(entry).split("=", 1) for entry in raw.split(b"\0") if b"=" in entry)


def command_line_of(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def learner_file(path: Path) -> bytes:
    return path.read_bytes()


def traced_python(tmp_path: Path, strace: str, trace: Path) -> str:
    """This Python, under strace: every program started below it, with its arguments and environment."""
    wrapper = tmp_path / "traced-python"
    wrapper.write_text(
        f'#!/bin/sh\nexec {strace} -f -qq -e trace=execve -v -s 1000000 -o {trace} {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def executions(trace: Path) -> list[tuple[list[bytes], list[bytes]]]:
    """The arguments and environment of each program strace saw started."""
    found = []
    for line in trace.read_text().splitlines():
        if " execve(" not in line:
            continue
        lists: list[list[bytes]] = []
        for token in re.findall(r'"(?:[^"\\]|\\.)*"|\[|\]', line.split(" execve(", 1)[1]):
            if token == "[":
                lists.append([])
            elif token != "]" and lists:
                lists[-1].append(codecs.escape_decode(token[1:-1].encode())[0])
        if len(lists) >= 2:
            found.append((lists[0], lists[1]))
    return found


@as_root_with_bwrap
async def test_the_programs_that_make_a_sandbox_get_nothing_of_the_jobs_env_and_the_learner_all_of_it(
    tmp_path: Path,
) -> None:
    """The job's env was the environment of the shell that joins the cgroup, nsenter and bwrap, all
    root (a denylist kept the loader's and glibc's file-reading variables out; the allocator's, the
    locale's, getopt's and the shells' got in). Now they start with the platform's PATH alone, bwrap
    gives the learner its environment from a descriptor, and no value is on a command line."""
    strace = shutil.which("strace")
    trace = tmp_path / "execve.trace"
    async with sandboxed_local_rig(tmp_path) as rig:
        if strace is not None:
            await rig.use_python(traced_python(tmp_path, strace, trace))
        job_id, go = new_job_id(), go_file_in(tmp_path)
        command = f'env -0 > "$RESULT_DIR/environment"; {WAIT_FOR_GO}'
        request = launch_request(job_id, command, nodes=("node-a",), go_file=go, spec_env=HOSTILE_ENV)
        await rig.launcher.launch(request)
        await wait_for_output(rig, job_id, 1, 0, "ready")

        agent = agent_pid(rig, job_id, 1, 0)
        sandbox = [pid for pid in descendants(agent) if command_of(pid) == "bwrap"]
        assert len(sandbox) == 2  # bwrap, and its init inside the sandbox: both root outside
        for pid in sandbox:
            assert set(environ_of(pid)) <= SETUP_NAMES, pid
        for pid in [agent, *descendants(agent)]:
            assert SECRET.encode() not in command_line_of(pid)
        agent_environment = environ_of(agent)
        given = learner_file(rig.launcher.job_dir(job_id) / "results" / "environment")
        learner = dict(os.fsdecode(entry).split("=", 1) for entry in given.split(b"\0") if entry)
        assert learner == {
            **command_environment(agent_environment),
            "PWD": agent_environment[COMMAND_DIR_VARIABLE],  # bwrap's, where the command runs
        }
        assert {name: learner[name] for name in HOSTILE_ENV} == HOSTILE_ENV
        go.touch()
        assert await exit_code(rig.store, job_id, 1, 0) == 0

    if strace is None:
        return
    makers = {"sh": 0, "nsenter": 0, "bwrap": 0}
    for arguments, environment in executions(trace):
        program = os.path.basename(arguments[0]).decode()
        if program not in makers or (program == "sh" and b"ffdl-cgroup" not in arguments):
            continue  # the agent, and the learner's own shell and programs
        makers[program] += 1
        assert {entry.split(b"=", 1)[0].decode() for entry in environment} <= SETUP_NAMES, program
        assert not any(SECRET.encode() in argument for argument in arguments), program
    assert makers["nsenter"] == makers["bwrap"] == 1


@contextlib.asynccontextmanager
async def learner_user_local_rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalRig]:
    """The local launcher of a root platform with the sandbox off (the operator's choice): learners
    run as ``nobody``, from a learners' root it can reach (``tmp_path`` is closed to it). This Python
    may lie where ``nobody`` cannot reach it (under ``/root``), which the launcher refuses at start:
    the learners here run none."""
    monkeypatch.setattr(local_module, "check_interpreter_reachable", lambda *_: None)
    work_dir = Path(tempfile.mkdtemp(prefix="ffdl-contract-"))
    os.chmod(work_dir, 0o711)
    rig = LocalRig(work_dir, f"embedded://{tmp_path / 'heartbeats.sqlite'}", user="nobody")
    try:
        yield rig
    finally:
        await rig.shutdown()
        shutil.rmtree(work_dir, ignore_errors=True)


as_root_with_cgroups = pytest.mark.skipif(
    os.geteuid() != 0
    or not (os.access("/sys/fs/cgroup/memory", os.W_OK) or os.access("/sys/fs/cgroup", os.W_OK)),
    reason="a learner user's cgroup needs root and a writable cgroup hierarchy",
)


@as_root_with_cgroups
async def test_unsandboxed_the_programs_that_switch_to_the_learner_user_get_nothing_of_the_jobs_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unsandboxed, a root platform's learner runs as the learner user in its cgroup: the shell that
    joins the cgroup and the user switch run as root, with the platform's PATH alone, and the switch
    gives the command its environment from a descriptor. Before, the joining shell already ran as
    the learner user, with the job's env: it could not join, and every learner exited with 125."""
    strace = shutil.which("strace")
    trace = tmp_path / "execve.trace"
    nobody = pwd.getpwnam("nobody")
    async with learner_user_local_rig(tmp_path, monkeypatch) as rig:
        if strace is not None:
            await rig.use_python(traced_python(tmp_path, strace, trace))
        job_id, go = new_job_id(), rig.work_dir / "go"  # the learner user reaches it (the root is 0711)
        learner_says = 'cat /proc/$$/environ > "$RESULT_DIR/environment"; cat /proc/$$/status /proc/$$/cgroup'
        command = f"{learner_says}; {WAIT_FOR_GO}"
        request = launch_request(job_id, command, nodes=("node-a",), go_file=go, spec_env=HOSTILE_ENV)
        await rig.launcher.launch(request)
        await wait_for_output(rig, job_id, 1, 0, "ready")
        agent_environment = environ_of(agent_pid(rig, job_id, 1, 0))
        go.touch()

        assert await exit_code(rig.store, job_id, 1, 0) == 0, await rig.learner_output(job_id, 1, 0)
        output = await rig.learner_output(job_id, 1, 0)
        status = dict(line.split(":", 1) for line in output.splitlines() if ":" in line)
        assert status["Uid"].split() == [str(nobody.pw_uid)] * 4
        assert status["CapEff"].strip() == status["CapPrm"].strip() == "0" * 16
        assert status["NoNewPrivs"].strip() == "1"
        assert re.search(rf"^\d+:[^:\n]*:/ffdl/{job_id}-a1-r0$", output, re.MULTILINE), output
        given = learner_file(rig.launcher.job_dir(job_id) / "results" / "environment")
        learner = dict(os.fsdecode(entry).split("=", 1) for entry in given.split(b"\0") if entry)
        assert learner == command_environment(agent_environment)
        assert {name: learner[name] for name in HOSTILE_ENV} == HOSTILE_ENV

    if strace is None:
        return
    makers = {"sh": 0, "user_switch.py": 0}
    for arguments, environment in executions(trace):
        assert not any(SECRET.encode() in argument for argument in arguments), arguments[0]
        if os.path.basename(arguments[0]) == b"sh" and b"ffdl-cgroup" in arguments:
            program = "sh"
        elif arguments[1:3] == [b"-I", b"-S"] and arguments[3].endswith(b"/user_switch.py"):
            program = "user_switch.py"
        else:
            continue  # the agent, and the learner's own shell and programs
        makers[program] += 1
        assert {entry.split(b"=", 1)[0].decode() for entry in environment} <= SETUP_NAMES, program
    assert makers == {"sh": 1, "user_switch.py": 1}
