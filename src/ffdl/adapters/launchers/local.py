"""The local launcher: every learner is a process on this machine, under a learner agent (architecture §6).

Each learner runs as ``python -I -u -m ffdl.learner.agent -- <command>`` in a new session, so the
agent is the leader of a process group whose id is its pid; stopping a learner signals that group
(the agent passes the signal on into the learner's sandbox). A job's files live under
``work_dir/<job_id>/`` (the learners' root, outside the platform's data directory)::

    work/                                 the learners' working directory and HOME      learner's
    checkpoints/                          FFDL_CHECKPOINT_DIR, shared by the job's attempts  learner's
    results/                              RESULT_DIR unless the spec names one          learner's
    logs/attempt-<n>/learner-<r>.log      the learner's output (FFDL_LOG_FILE), 0600
    logs/attempt-<n>/agent-<r>.log        the agent's own log, 0600
    channels/attempt-<n>-rank-<r>/        the agent's working directory, where it listens for the
                                          learner's reports (report.sock, FFDL_REPORT_SOCKET)
    run/attempt-<n>.launch                the attempt's launch claim: created once, never removed
    run/attempt-<n>-rank-<r>.pid          the agent's pid (its process group) and its start time

Isolation: every learner's command runs in a sandbox of its own
(:mod:`ffdl.adapters.launchers.sandbox`: bubblewrap; its own PID, IPC, mount and user namespaces,
and its job's network namespace, made at launch and removed at stop:
:mod:`ffdl.adapters.launchers.job_network`) that holds only what is marked "learner's" above,
writable, and its report socket (``run/nsswitch.conf`` read-only: names from files); in a cgroup with
the manifest's ``cpus`` and ``memory_mb`` where the host has cgroups
(:mod:`ffdl.adapters.launchers.cgroups`). ``logs/``, ``run/`` and ``channels/`` are the platform's
(0700) and exist in no sandbox. The agent runs isolated (``-I``) from its channel directory, which no
learner can write, and gets an environment the platform builds (never the platform's own: its
credentials stay out); the job's env reaches only the command. Without a sandbox (the operator
opted out: ``sandbox=None``) and where the platform runs as root, the command runs as the learner
user (:mod:`ffdl.adapters.launchers.isolation`), in its cgroup, switched to it by
:mod:`ffdl.adapters.launchers.user_switch` (checked once at start), and owns the learner's
directories: learners are then kept from the platform, not from each other.

The files are the launcher's whole memory, so a restarted platform adopts the learners that kept
running: ``running`` and ``stop`` work from the pidfiles, whoever started the agents. A pidfile
holds the agent's start time (from ``/proc``) beside its pid, so a pid that was reused by an
unrelated process is never mistaken for a learner nor signalled.

Idempotency: an attempt is launched at most once. ``launch`` creates the attempt's claim file with
``O_EXCL`` before it starts anything; when the claim exists already (launched before, by this or
another platform process, even if its learners have exited or were stopped since) it starts
nothing. Attempt numbers are never reused by the platform, so a re-delivered launch request never
starts a second set of learners. A launch that fails halfway kills what it started and withdraws
the claim, so it can be retried.

Concurrency: ``launch`` and ``stop`` of one job are serialised by an asyncio lock per job (a stop
waiting out its grace holds up no other job). Every agent this object starts gets a reaper task
that waits on a pidfd (no polling) and collects the exit status, so no zombie is left behind.
``close`` cancels the reapers and leaves the learners running. Linux only: pidfds and ``/proc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from ffdl.adapters.launchers import job_network
from ffdl.adapters.launchers.cgroups import Limits, remove_job_groups
from ffdl.adapters.launchers.environment import (
    CGROUP_VARIABLE,
    COMMAND_DIR_VARIABLE,
    HEARTBEATS_PASSWORD_VARIABLE,
    HEARTBEATS_USERNAME_VARIABLE,
    REPORT_SOCKET_NAME,
    REPORT_SOCKET_VARIABLE,
    RUN_AS_VARIABLE,
    SANDBOX_VARIABLE,
    LearnerSite,
    inherited_environment,
    learner_command,
    learner_environment,
    local_worker_addresses,
)
from ffdl.adapters.launchers.isolation import (
    LEARNER_DIR_MODE,
    PLATFORM_DIR_MODE,
    TRAVERSE_ONLY_MODE,
    check_interpreter_reachable,
    check_user_switch,
    learner_user,
    make_directory,
    prepare_learners_root,
)
from ffdl.adapters.launchers.logins import HeartbeatLogins, new_password
from ffdl.adapters.launchers.sandbox import REPORT_SOCKET_INSIDE, LearnerPlaces, Sandbox
from ffdl.adapters.processes import wait_for_exit
from ffdl.events.model import LearnerPlacement
from ffdl.handlers.ports import LaunchRequest, LearnerHandle

log = structlog.get_logger(__name__)

MASTER_ADDR = "127.0.0.1"
STOP_POLL_INTERVAL_S = 0.05
KILL_WAIT_S = 5.0
#: The least time between two sweeps of leftover job networks.
SWEEP_INTERVAL_S = 60.0

_PIDFILE = re.compile(r"\Aattempt-(\d+)-rank-(\d+)\.pid\Z")


@dataclass(frozen=True, slots=True)
class _ProcessStat:
    """The parts of ``/proc/<pid>/stat`` the launcher needs."""

    state: str
    process_group: int
    start_ticks: int

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")  # a zombie has exited; it only waits to be reaped


@dataclass(frozen=True, slots=True)
class _RecordedLearner:
    """One pidfile: a learner agent that was started, and how to recognise it."""

    pidfile: Path
    handle: LearnerHandle
    pid: int
    start_ticks: int

    def is_alive(self) -> bool:
        stat = _process_stat(self.pid)
        return stat is not None and stat.start_ticks == self.start_ticks and stat.alive

    def process_group(self) -> int | None:
        """The learner's process group, unless its pid now belongs to an unrelated process.

        While any process of the group lives, its id (the agent's pid) cannot be reused, so a pid
        with no process at all still names the group of the learner's leftover processes.
        """
        stat = _process_stat(self.pid)
        if stat is not None and stat.start_ticks != self.start_ticks:
            return None
        return self.pid


class LocalLauncher:
    """A :class:`~ffdl.handlers.ports.Launcher` that runs learners as local processes."""

    def __init__(
        self,
        work_dir: Path,
        heartbeats_url: str,
        *,
        heartbeat_ttl_s: float = 5.0,
        python: str = sys.executable,
        user: str | None = None,
        log_format: str = "console",
        logins: HeartbeatLogins | None = None,
        sandbox: Sandbox | None = None,
        data_roots: Sequence[Path] = (),
        result_roots: Sequence[Path] = (),
    ) -> None:
        """``user``: whom learners' commands run as where the platform runs as root (a name,
        ``UID`` or ``UID:GID``; None: the platform's user). ``logins``: where the heartbeat store
        authenticates, each job's agents get a login of their own. ``sandbox``: how learners are
        contained (None: not at all, the operator's explicit choice). ``data_roots``,
        ``result_roots``: where a manifest's absolute places must lie, links resolved. Creates and
        checks ``work_dir``; makes one sandbox to check that learners can run in it, or raises
        :class:`~ffdl.adapters.launchers.sandbox.SandboxUnavailable` naming the cause and the fix."""
        self._work_dir = work_dir.resolve()
        self._heartbeats_url = heartbeats_url
        self._heartbeat_ttl_s = heartbeat_ttl_s
        self._python = python
        self._user = learner_user(user) if user is not None else None
        self._log_format = log_format
        self._logins = logins
        self._sandbox = sandbox
        self._data_roots = tuple(root.resolve() for root in data_roots)
        self._result_roots = tuple(root.resolve() for root in result_roots)
        if sandbox is not None:
            prepare_learners_root(self._work_dir, None)
            uid, gid = self._sandbox_identity()
            sandbox.check(uid, gid, inherited_environment(os.environ))
        else:
            prepare_learners_root(self._work_dir, self._user)
            if self._user is not None:
                check_interpreter_reachable(self._user, python)
                check_user_switch(self._user, python)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._reapers: set[asyncio.Task[None]] = set()
        # keeps a sweep of leftover job networks apart from a launch making its job's (see ensure)
        self._networks = asyncio.Lock()
        self._next_sweep = 0.0

    # -- where things are -----------------------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        """The job's directory (and its learners' working directory)."""
        if not job_id or job_id in (".", "..") or "/" in job_id or "\0" in job_id:
            raise ValueError(f"job id {job_id!r} cannot name a directory")
        return self._work_dir / job_id

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        """The output (stdout and stderr) of one learner of one attempt."""
        return self._attempt_logs(job_id, attempt) / f"learner-{rank}.log"

    def _attempt_logs(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / "logs" / f"attempt-{attempt}"

    def _learner_work_dir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "work"

    def _checkpoint_dir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "checkpoints"

    def _default_result_dir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "results"

    def _run_dir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "run"

    def _channel_dir(self, job_id: str, attempt: int, rank: int) -> Path:
        """The learner's agent's working directory, where it listens for the learner's reports."""
        return self.job_dir(job_id) / "channels" / f"attempt-{attempt}-rank-{rank}"

    def _sandbox_identity(self) -> tuple[int, int]:
        """The uid and gid a sandboxed learner has inside (mapped to the platform's user outside)."""
        if self._user is not None:
            return self._user.uid, self._user.gid
        return os.geteuid(), os.getegid()

    def _pidfile(self, job_id: str, attempt: int, rank: int) -> Path:
        return self._run_dir(job_id) / f"attempt-{attempt}-rank-{rank}.pid"

    # -- the port -------------------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> None:
        async with self._job_lock(request.job_id):
            bound = log.bind(job_id=request.job_id, attempt=request.attempt)
            master_port = _free_port()
            if not self._claim(request, master_port):
                bound.info("attempt launched before: nothing to start")
                return
            started: list[tuple[LearnerHandle, subprocess.Popen[bytes]]] = []
            try:
                self._make_directories(request)
                network = self._network_of(request.job_id)
                if network is not None:
                    async with self._networks:
                        await job_network.ensure(request.job_id)
                    job_network.write_nsswitch(network.nsswitch)
                login = await self._login(request.job_id)
                for learner in request.placement.learners:
                    handle = LearnerHandle(request.job_id, request.attempt, learner.rank)
                    process = self._start_agent(request, learner, master_port, login)
                    started.append((handle, process))
                    self._write_pidfile(handle, process.pid)
            except BaseException:
                bound.exception("launch failed: killing the learners it started")
                self._abort(started)
                self._claim_path(request.job_id, request.attempt).unlink(missing_ok=True)
                raise
            for handle, process in started:
                self._reap_when_done(handle, process)
            bound.info("learners launched", learners=len(started), master_port=master_port)

    async def stop(self, job_id: str, grace_s: float) -> None:
        async with self._job_lock(job_id):
            recorded = self._recorded(self._run_dir(job_id))
            groups = {
                learner: group for learner in recorded if (group := learner.process_group()) is not None
            }
            for group in set(groups.values()):
                _signal_group(group, signal.SIGTERM)
            remaining = await _wait_until_gone(set(groups.values()), grace_s)
            if remaining:
                log.warning(
                    "learners outlived the grace: killing them",
                    job_id=job_id,
                    process_groups=sorted(remaining),
                )
                for group in remaining:
                    _signal_group(group, signal.SIGKILL)
                remaining = await _wait_until_gone(remaining, KILL_WAIT_S)
            for learner in recorded:
                if groups.get(learner) in remaining:
                    log.error(
                        "learner survived SIGKILL",
                        job_id=job_id,
                        pid=learner.pid,
                        pidfile=str(learner.pidfile),
                    )
                else:
                    learner.pidfile.unlink(missing_ok=True)
            if self._logins is not None:
                await self._logins.revoke(job_id)
            if not remaining:
                await self._remove_cgroups(job_id)
                if self._network_of(job_id) is not None:
                    await job_network.remove(job_id)
            await self._sweep_networks()
            log.info("learners stopped", job_id=job_id, learners=len(recorded), grace_s=grace_s)

    async def _sweep_networks(self) -> None:
        """Remove the job namespaces left behind (:func:`job_network.sweep`), at most every
        :data:`SWEEP_INTERVAL_S` (each namespace costs a look at who is in it), and whatever the
        network learners get now: a platform that ran them in job networks before may have left some."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_INTERVAL_S
        async with self._networks:
            await job_network.sweep()

    async def _remove_cgroups(self, job_id: str) -> None:
        """Remove the cgroups an agent killed after the grace left; its sandbox's processes, killed
        with it, may take a moment to leave them."""
        deadline = time.monotonic() + KILL_WAIT_S
        while problems := remove_job_groups(job_id):
            if time.monotonic() >= deadline:
                log.warning("learner cgroups left behind", job_id=job_id, problems=problems)
                return
            await asyncio.sleep(STOP_POLL_INTERVAL_S)

    async def running(self) -> list[LearnerHandle]:
        run_dirs = sorted(self._work_dir.glob("*/run")) if self._work_dir.is_dir() else []
        alive = [
            learner.handle
            for run_dir in run_dirs
            for learner in self._recorded(run_dir)
            if learner.is_alive()
        ]
        return sorted(alive, key=lambda handle: (handle.job_id, handle.attempt, handle.rank))

    async def close(self) -> None:
        """Stop reaping; the learners run on, for a restarted platform to adopt."""
        for reaper in self._reapers:
            reaper.cancel()
        await asyncio.gather(*self._reapers, return_exceptions=True)
        self._reapers.clear()

    def _job_lock(self, job_id: str) -> asyncio.Lock:
        """The lock that serialises launching and stopping one job (held locks stay in the map)."""
        lock = self._locks.get(job_id)
        if lock is None:
            lock = self._locks[job_id] = asyncio.Lock()
        return lock

    # -- launching ------------------------------------------------------------------------------

    def _claim_path(self, job_id: str, attempt: int) -> Path:
        return self._run_dir(job_id) / f"attempt-{attempt}.launch"

    def _claim(self, request: LaunchRequest, master_port: int) -> bool:
        """Claim the attempt for this launch; False when it was claimed before."""
        claim = self._claim_path(request.job_id, request.attempt)
        make_directory(self.job_dir(request.job_id), TRAVERSE_ONLY_MODE)
        make_directory(claim.parent, PLATFORM_DIR_MODE)
        try:
            descriptor = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            return False
        record = {
            "master_port": master_port,
            "learners": len(request.placement.learners),
            "launched_at": time.time(),
        }
        with os.fdopen(descriptor, "w") as stream:
            json.dump(record, stream)
        return True

    async def _login(self, job_id: str) -> dict[str, str]:
        """The agents' variables of the job's heartbeat login (a fresh password per launch), if any."""
        if self._logins is None:
            return {}
        password = new_password()
        username = await self._logins.grant(job_id, password)
        return {HEARTBEATS_USERNAME_VARIABLE: username, HEARTBEATS_PASSWORD_VARIABLE: password}

    def _start_agent(
        self,
        request: LaunchRequest,
        learner: LearnerPlacement,
        master_port: int,
        login: dict[str, str],
    ) -> subprocess.Popen[bytes]:
        environment = {**self._learner_environment(request, learner, master_port), **login}
        agent_log = self._attempt_logs(request.job_id, request.attempt) / f"agent-{learner.rank}.log"
        descriptor = os.open(
            agent_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        with os.fdopen(descriptor, "ab") as agent_output:
            # -I: no user site, no working directory on sys.path, no PYTHON* variable: the agent
            # imports only the platform's code, whatever a learner wrote anywhere (and so -u: it
            # would not read PYTHONUNBUFFERED, and its log must be current)
            return subprocess.Popen(
                [self._python, "-I", "-u", "-m", "ffdl.learner.agent", "--", learner_command(request.spec)],
                cwd=self._channel_dir(request.job_id, request.attempt, learner.rank),
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=agent_output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _learner_environment(
        self, request: LaunchRequest, learner: LearnerPlacement, master_port: int
    ) -> dict[str, str]:
        """The learner environment contract over what a learner keeps of this process's environment;
        the learner's GPUs by index; whom the agent runs the command as."""
        log_file = self.log_path(request.job_id, request.attempt, learner.rank)
        channel = self._channel_dir(request.job_id, request.attempt, learner.rank)
        site = LearnerSite(
            master_addr=MASTER_ADDR,
            master_port=master_port,
            checkpoint_dir=str(self._checkpoint_dir(request.job_id)),
            default_result_dir=str(self._default_result_dir(request.job_id)),
            heartbeats_url=self._heartbeats_url,
            heartbeat_ttl_s=self._heartbeat_ttl_s,
            files={
                "FFDL_LOG_FILE": str(log_file),
                REPORT_SOCKET_VARIABLE: REPORT_SOCKET_INSIDE
                if self._sandbox
                else str(channel / REPORT_SOCKET_NAME),
            },
            base={
                **inherited_environment(os.environ),
                "HOME": str(self._learner_work_dir(request.job_id)),
                "FFDL_LOG_FORMAT": self._log_format,
                # Learners of one machine rendezvous on loopback: NCCL's sockets too (a job may change it).
                "NCCL_SOCKET_IFNAME": "lo",
            },
            worker_addresses=local_worker_addresses(
                MASTER_ADDR, master_port, len(request.placement.learners)
            ),
        )
        environment = learner_environment(request, learner, learner.gpus, site)
        if request.resume_from is not None and not environment["FFDL_RESUME_FROM"]:
            log.warning(
                "checkpoint outside the job's checkpoint directory not handed to the learner",
                job_id=request.job_id,
                tenant=request.tenant,
                uri=request.resume_from.uri[:300],
            )
        environment[COMMAND_DIR_VARIABLE] = str(self._learner_work_dir(request.job_id))
        limits = Limits.for_learner(
            request.job_id, request.attempt, learner.rank, request.spec.cpus, request.spec.memory_mb
        )
        environment[CGROUP_VARIABLE] = limits.to_json()
        if self._sandbox is not None:
            uid, gid = self._sandbox_identity()
            places = self._places(request, learner, channel / REPORT_SOCKET_NAME)
            environment[SANDBOX_VARIABLE] = json.dumps(self._sandbox.arguments(places, uid, gid))
        elif self._user is not None:
            environment[RUN_AS_VARIABLE] = self._user.run_as
        return environment

    def _places(
        self, request: LaunchRequest, learner: LearnerPlacement, report_socket: Path
    ) -> LearnerPlaces:
        """What of the host a learner's sandbox holds: its job's own directories, writable; the data
        and result places the manifest names by absolute path (which the API accepts only under the
        operator's roots) where they exist."""
        job_id, spec = request.job_id, request.spec
        writable = [self._learner_work_dir(job_id), self._checkpoint_dir(job_id)]
        writable.append(Path(spec.result_dir) if spec.result_dir else self._default_result_dir(job_id))
        readable = [Path(spec.data_dir)] if spec.data_dir else []
        present = [path for path in writable if path.is_absolute() and path.is_dir()]
        readable = [path for path in readable if path.is_absolute() and path.is_dir()]
        for path in {*writable, *readable} - {*present, *readable}:
            if path.is_absolute():
                log.warning(
                    "a place the manifest names does not exist: not in the sandbox",
                    job_id=job_id,
                    path=str(path),
                )
        # the API checks a manifest's places as written; a learner of an earlier job may have made
        # one a link (to /, to the data directory), which bwrap would follow, as root
        own = self.job_dir(job_id)
        present = [
            path
            for path in present
            if path.is_relative_to(own) or self._within_roots(path, self._result_roots, request)
        ]
        readable = [path for path in readable if self._within_roots(path, self._data_roots, request)]
        return LearnerPlaces(
            writable=present,
            readable=readable,
            report_socket=report_socket,
            work_dir=self._learner_work_dir(job_id),
            gpus=learner.gpus,
            network=self._network_of(job_id),
        )

    def _network_of(self, job_id: str) -> job_network.JobNetwork | None:
        """The job's network, where its learners get one (sandboxed, ``network="job"``)."""
        if self._sandbox is None or self._sandbox.network != "job":
            return None
        return job_network.JobNetwork(
            job_network.namespace_path(job_id), self._run_dir(job_id) / "nsswitch.conf"
        )

    def _within_roots(self, path: Path, roots: Sequence[Path], request: LaunchRequest) -> bool:
        """Whether ``path``, links resolved, still lies under one of ``roots``; logged if not."""
        resolved = path.resolve()
        if any(resolved.is_relative_to(root) for root in roots):
            return True
        log.warning(
            "a place the manifest names leads outside its roots: not in the sandbox",
            job_id=request.job_id,
            tenant=request.tenant,
            path=str(path),
            resolved=str(resolved)[:300],
        )
        return False

    def _make_directories(self, request: LaunchRequest) -> None:
        """The learner's own directories (the learner user's where it runs as one, unsandboxed; in a
        sandbox the learner writes as the platform's user), the platform's log directories (0700)
        and each learner's channel directory (the learner user must reach its socket unsandboxed)."""
        job_id = request.job_id
        owner = None if self._sandbox is not None else self._user
        learners_own = [self._learner_work_dir(job_id), self._checkpoint_dir(job_id)]
        if request.spec.result_dir is None:
            learners_own.append(self._default_result_dir(job_id))
        for directory in learners_own:
            make_directory(directory, LEARNER_DIR_MODE, owner)
        logs = self._attempt_logs(job_id, request.attempt)
        make_directory(logs.parent, PLATFORM_DIR_MODE)
        make_directory(logs, PLATFORM_DIR_MODE)
        channel_mode = PLATFORM_DIR_MODE if owner is None else TRAVERSE_ONLY_MODE
        make_directory(self.job_dir(job_id) / "channels", channel_mode)
        for placed in request.placement.learners:
            make_directory(self._channel_dir(job_id, request.attempt, placed.rank), channel_mode)

    def _write_pidfile(self, handle: LearnerHandle, pid: int) -> None:
        """Record the agent atomically: a pidfile is either absent or complete."""
        stat = _process_stat(pid)
        if stat is None:
            raise RuntimeError(f"learner agent {pid} vanished before it could be recorded")
        pidfile = self._pidfile(handle.job_id, handle.attempt, handle.rank)
        partial = pidfile.with_suffix(".pid.tmp")
        partial.write_text(f"{pid}\n{stat.start_ticks}\n")
        partial.replace(pidfile)

    def _abort(self, started: Iterable[tuple[LearnerHandle, subprocess.Popen[bytes]]]) -> None:
        for handle, process in started:
            _signal_group(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=KILL_WAIT_S)
            self._pidfile(handle.job_id, handle.attempt, handle.rank).unlink(missing_ok=True)

    def _reap_when_done(self, handle: LearnerHandle, process: subprocess.Popen[bytes]) -> None:
        reaper = asyncio.create_task(_reap(handle, process))
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)

    # -- what the pidfiles say ------------------------------------------------------------------

    def _recorded(self, run_dir: Path) -> list[_RecordedLearner]:
        if not run_dir.is_dir():
            return []
        recorded = []
        for pidfile in sorted(run_dir.iterdir()):
            match = _PIDFILE.match(pidfile.name)
            if match is None:
                continue
            try:
                pid_text, start_text = pidfile.read_text().split()
                pid, start_ticks = int(pid_text), int(start_text)
            except FileNotFoundError:
                continue  # stopped meanwhile
            except ValueError:
                log.warning("unreadable pidfile ignored", pidfile=str(pidfile))
                continue
            handle = LearnerHandle(run_dir.parent.name, int(match[1]), int(match[2]))
            recorded.append(_RecordedLearner(pidfile, handle, pid, start_ticks))
        return recorded


def _free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now: the attempt's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((MASTER_ADDR, 0))
        port: int = probe.getsockname()[1]
        return port


def _process_stat(pid: int) -> _ProcessStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may contain anything; the fields after it
    # are: state (3), ppid (4), process group (5), ... start time in clock ticks (22).
    fields = raw[raw.rindex(")") + 2 :].split()
    return _ProcessStat(state=fields[0], process_group=int(fields[2]), start_ticks=int(fields[19]))


def _live_groups(groups: set[int]) -> set[int]:
    """The ``groups`` that still have a process that has not exited.

    ``killpg(group, 0)`` answers cheaply for a group that is gone, but succeeds for a group of
    zombies too, so only the groups it finds are looked for in ``/proc``.
    """
    existing = {group for group in groups if _group_exists(group)}
    if not existing:
        return set()
    live = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _process_stat(int(entry.name))) is not None and stat.alive:
            live.add(stat.process_group)
    return existing & live


def _group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, but belongs to another user
    return True


async def _wait_until_gone(groups: set[int], timeout_s: float) -> set[int]:
    """Wait until no live process is left in ``groups``; returns the groups that still have one."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = _live_groups(groups)
        if not remaining or time.monotonic() >= deadline:
            return remaining
        await asyncio.sleep(STOP_POLL_INTERVAL_S)


def _signal_group(group: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)


async def _reap(handle: LearnerHandle, process: subprocess.Popen[bytes]) -> None:
    """Wait for an agent this launcher started to exit, and collect its status (no zombie stays)."""
    returncode = await wait_for_exit(process)
    log.info(
        "learner agent ended",
        job_id=handle.job_id,
        attempt=handle.attempt,
        rank=handle.rank,
        returncode=returncode,
    )
