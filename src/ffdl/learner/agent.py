"""The learner agent: runs one learner's command and keeps its heartbeat (architecture §6).

A launcher starts one agent per learner as ``python -I -u -m ffdl.learner.agent -- <shell command>``
(isolated: no user site, no working directory on ``sys.path``, no ``PYTHON*`` variable read), in a
new session, from a working directory the learner cannot write, with the learner environment
(``FFDL_JOB_ID``, ``FFDL_TENANT``, ``FFDL_ATTEMPT``, ``RANK``, ``FFDL_HEARTBEATS``,
``FFDL_HEARTBEAT_TTL``, ``FFDL_LOG_FILE``, ``FFDL_REPORT_SOCKET``...). So nothing the learner
writes is ever imported or read as configuration by the agent: it reads only its environment,
and what the learner sends it, as bounded data (:mod:`ffdl.learner.channel`).

The agent runs the command with ``/bin/sh -c`` (in ``FFDL_COMMAND_DIR``) with the command's
environment (the agent's own, less what is the agent's alone, with the job's ``env`` unwrapped:
:func:`~ffdl.adapters.launchers.environment.command_environment`; the job's env never reaches the
agent's own interpreter). Where the launcher gives a sandbox (``FFDL_SANDBOX``: bwrap's arguments,
:mod:`ffdl.adapters.launchers.sandbox`) the shell runs inside it, in a cgroup with the learner's
limits where ``FFDL_CGROUP`` names them and the host has cgroups
(:mod:`ffdl.adapters.launchers.cgroups`), and only bwrap gives the command its environment: the
programs that make the sandbox as the platform's user (the shell that joins the cgroup, ``nsenter``,
bwrap) start with the platform's ``PATH`` alone, and bwrap reads the command's variables from a
descriptor (``--clearenv``, ``--setenv``: none of the job's is in their environment or on their
command lines). Unsandboxed, the command runs in the agent's process group, in its cgroup likewise.
When ``FFDL_RUN_AS=UID:GID`` says so (a root platform's learner user), the shell that joins the
cgroup and then the user switch (:mod:`ffdl.adapters.launchers.user_switch`) run as root with the
platform's ``PATH`` alone; the switch reads the command's environment from the same kind of
descriptor, gives up root for good (that user's ids, no supplementary group, no capability,
``no_new_privs``) and starts the command, while the agent keeps the platform's user. Otherwise
nothing changes users, and the command's environment is its first program's. For as long as the
command runs the agent keeps the learner's key
``/ffdl/jobs/<job>/learners/<rank>`` in the heartbeat store, bound to a lease, holding a
:class:`~ffdl.handlers.heartbeat_keys.LearnerBeat`. When the command ends it writes the exit record
``/ffdl/jobs/<job>/exits/<attempt>/<rank>`` (no lease, so it outlives the agent), then revokes the
lease, and exits with the command's status.

Concurrency: one asyncio loop, one child process. Beside the coroutine that waits for the child
(on a pidfd, so a daemon the command leaves behind holding its output pipe cannot delay the exit
report), four tasks share the in-memory beat, which only this loop touches:

* the output pump copies the child's stdout and stderr (one pipe) into ``FFDL_LOG_FILE`` as it comes,
  at most :data:`OUTPUT_BYTES_PER_S` (past it the pipe waits, and the learner's writes with it);
  any new output counts as progress (``last_progress``, not ``step``), so a program that uses no
  helper is still watched for hangs;
* the report channel (:class:`~ffdl.learner.channel.ReportChannel`, a unix socket in the agent's
  working directory, the learner's ``FFDL_REPORT_SOCKET``) takes the JSON lines :mod:`ffdl.learner`
  sends (``progress``: step and metrics, each metric keeping its latest value; ``checkpoint``, only
  inside ``FFDL_CHECKPOINT_DIR``), one task per connection;
* the lease keeper renews the lease every TTL/3. A store outage is not a learner death: while the
  store is unreachable it keeps trying and the learner runs on; when a renewal (or a write of the
  key) finds the lease expired (the outage outlasted the TTL, and etcd expires leases it could not
  renew even when it was the one frozen), it grants a new lease at once and has the key written
  again, which is how the learner re-registers within the monitor's grace period;
* the publisher writes the key whenever the beat changed, at most every
  :data:`MIN_PUBLISH_INTERVAL_S`, so a chatty program costs the store at most four writes a second.

Every store call is bounded by a timeout, so a frozen store looks like an unreachable one.

Signals: a launcher stops a learner by signalling its process group, so SIGTERM (or SIGINT) reaches
the agent and, unsandboxed, the command alike; a sandbox runs in a process group of its own (bwrap
would die of the signal and take the learner with it at once), so the agent passes the signal on to
every process inside it. The agent does not die of it: it waits for the command to finish
(a learner typically checkpoints and exits) and reports that exit as usual. ``/bin/sh`` would die
of SIGTERM at once and orphan the command it waits for, so the agent prefixes the command with a
trap that makes the shell wait for its foreground command and then exit with that command's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, TypeVar

import structlog

from ffdl.adapters.heartbeats import EtcdCredentials, exit_key, learner_key, open_store
from ffdl.adapters.launchers.cgroups import LearnerGroup, Limits, joining_command, make_group
from ffdl.adapters.launchers.environment import (
    CGROUP_VARIABLE,
    COMMAND_DIR_VARIABLE,
    HEARTBEATS_PASSWORD_VARIABLE,
    HEARTBEATS_USERNAME_VARIABLE,
    REPORT_SOCKET_VARIABLE,
    RUN_AS_VARIABLE,
    SANDBOX_VARIABLE,
    checkpoint_path,
    command_environment,
)
from ffdl.adapters.launchers.sandbox import (
    environment_file,
    filter_pipe,
    filtered,
    setup_environment,
    signal_sandbox,
    with_environment,
)
from ffdl.adapters.launchers.user_switch import switching_command
from ffdl.adapters.processes import exit_code_of, wait_for_exit
from ffdl.events.model import Checkpoint
from ffdl.events.reports import MAX_METRICS
from ffdl.handlers.heartbeat_keys import LearnerBeat, encode_exit
from ffdl.handlers.ports import HeartbeatStore, StoreUnavailable
from ffdl.learner import checkpoints
from ffdl.learner.channel import (
    CheckpointReport,
    LearnerBudget,
    LearnerNotes,
    ProgressReport,
    Report,
    ReportChannel,
)
from ffdl.learner.workers import WorkerSteps
from ffdl.wiring.logging import configure_logging

log = structlog.get_logger(__name__)

DEFAULT_HEARTBEAT_TTL_S = 5.0
MIN_PUBLISH_INTERVAL_S = 0.25
OUTPUT_CHUNK_BYTES = 64 * 1024
#: What copying a learner's output into its log may cost the agent (outside the learner's cgroup):
#: bytes a second, and at once. Copying a MB costs the agent about 1.5 ms of CPU, several times what
#: writing it into the pipe cost the learner, so a learner limited to a tenth of a core that printed
#: as fast as it could made its agent spend 2.7 CPU-s in 11.5 s (3 GB) for its own 1.0; past this
#: the pipe is not read, and the learner's writes wait.
OUTPUT_BYTES_PER_S = 16 * 1024 * 1024
OUTPUT_BURST_BYTES = 64 * 1024 * 1024
OUTPUT_DRAIN_TIMEOUT_S = 2.0
EXIT_REPORT_TIMEOUT_S = 30.0
RETRY_INTERVAL_S = 0.5
MIN_CALL_TIMEOUT_S = 2.0
CGROUP_RETRY_S = 0.05
#: How deep in the checkpoint directory a reported checkpoint may lie: checking a path 2,000
#: directories deep cost the agent's event loop 0.14 s of CPU a report.
REPORTED_DEPTH_MAX = 32

SHELL = "/bin/sh"
# On SIGTERM/SIGINT the shell runs the trap only after its foreground command finished, and then
# exits with that command's status instead of dying at once and leaving the command orphaned.
SHELL_PRELUDE = "trap 'exit $?' TERM INT\n"

_REQUIRED = ("FFDL_JOB_ID", "FFDL_ATTEMPT", "RANK", "FFDL_HEARTBEATS")

_Value = TypeVar("_Value")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What the agent reads from its environment."""

    job_id: str
    attempt: int
    rank: int
    heartbeats_url: str
    #: What the learner's command runs with (never the agent's environment as it is).
    command_environment: Mapping[str, str] = field(repr=False)
    tenant: str = ""
    heartbeat_ttl_s: float = DEFAULT_HEARTBEAT_TTL_S
    log_file: Path | None = None
    #: Where the agent listens for reports (its channel's directory); None: no channel.
    report_dir: Path | None = None
    #: Where checkpoints may be reported (the job's checkpoint place).
    checkpoint_dir: str = ""
    #: Where the command runs; None: the agent's working directory.
    command_dir: Path | None = None
    #: bwrap's arguments up to the command; empty: no sandbox.
    sandbox: tuple[str, ...] = ()
    #: The learner's cgroup limits; None: none asked for.
    limits: Limits | None = None
    #: The unprivileged (uid, gid) the command runs as; None: the agent's own user.
    run_as: tuple[int, int] | None = None
    #: The heartbeat store's login (a per-job etcd user on Kubernetes); never the command's.
    heartbeats_credentials: EtcdCredentials | None = None
    #: What the programs the agent starts as root before the command run with (the shell that joins
    #: the cgroup, and bwrap or the user switch): the platform's ``PATH``, nothing of the job's.
    root_side_environment: Mapping[str, str] = field(default_factory=lambda: setup_environment({}))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> AgentConfig:
        missing = [name for name in _REQUIRED if not environ.get(name)]
        if missing:
            raise ValueError(f"the learner agent needs {', '.join(missing)} in its environment")
        attempt = _parse(environ, "FFDL_ATTEMPT", int)
        rank = _parse(environ, "RANK", int)
        ttl_s = _parse(environ, "FFDL_HEARTBEAT_TTL", float, DEFAULT_HEARTBEAT_TTL_S)
        if attempt < 1 or rank < 0 or not ttl_s > 0:
            raise ValueError(
                f"need FFDL_ATTEMPT >= 1, RANK >= 0, FFDL_HEARTBEAT_TTL > 0; got {attempt}, {rank}, {ttl_s}"
            )
        return cls(
            job_id=environ["FFDL_JOB_ID"],
            attempt=attempt,
            rank=rank,
            heartbeats_url=environ["FFDL_HEARTBEATS"],
            command_environment=command_environment(environ),
            tenant=environ.get("FFDL_TENANT", ""),
            heartbeat_ttl_s=ttl_s,
            log_file=Path(environ["FFDL_LOG_FILE"]) if environ.get("FFDL_LOG_FILE") else None,
            report_dir=Path() if environ.get(REPORT_SOCKET_VARIABLE) else None,
            checkpoint_dir=environ.get("FFDL_CHECKPOINT_DIR", ""),
            command_dir=Path(environ[COMMAND_DIR_VARIABLE]) if environ.get(COMMAND_DIR_VARIABLE) else None,
            sandbox=_sandbox(environ.get(SANDBOX_VARIABLE, "")),
            limits=Limits.from_json(environ[CGROUP_VARIABLE]) if environ.get(CGROUP_VARIABLE) else None,
            run_as=_user_and_group(environ.get(RUN_AS_VARIABLE, "")),
            heartbeats_credentials=_credentials(environ),
            root_side_environment=setup_environment(environ),
        )


def _credentials(environ: Mapping[str, str]) -> EtcdCredentials | None:
    username = environ.get(HEARTBEATS_USERNAME_VARIABLE, "")
    password = environ.get(HEARTBEATS_PASSWORD_VARIABLE, "")
    if bool(username) != bool(password):
        raise ValueError(f"{HEARTBEATS_USERNAME_VARIABLE} and {HEARTBEATS_PASSWORD_VARIABLE} go together")
    return EtcdCredentials(username, password) if username else None


def _sandbox(raw: str) -> tuple[str, ...]:
    if not raw:
        return ()
    arguments = json.loads(raw)
    if (
        not isinstance(arguments, list)
        or not all(isinstance(word, str) for word in arguments)
        or arguments[-1:] != ["--"]
    ):
        raise ValueError(f"{SANDBOX_VARIABLE} is not a JSON list of bwrap's arguments ending in --")
    return tuple(arguments)


def _user_and_group(run_as: str) -> tuple[int, int] | None:
    if not run_as:
        return None
    uid, _, gid = run_as.partition(":")
    if not (uid.isdigit() and gid.isdigit()):
        raise ValueError(f"{RUN_AS_VARIABLE}={run_as!r} is not UID:GID")
    return int(uid), int(gid)


def _parse(
    environ: Mapping[str, str], name: str, kind: Callable[[str], _Value], default: _Value | None = None
) -> _Value:
    raw = environ.get(name, "")
    if not raw and default is not None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid {getattr(kind, '__name__', kind)}") from None


class LearnerAgent:
    """Runs one learner's command to its end and keeps its heartbeat; see the module docstring."""

    def __init__(
        self,
        config: AgentConfig,
        store: HeartbeatStore,
        command: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._store = store
        self._command = command
        self._clock = clock
        self._log = log.bind(
            job_id=config.job_id, tenant=config.tenant, rank=config.rank, attempt=config.attempt
        )
        self._notes = LearnerNotes(self._log, time.monotonic)  # what the learner makes it log, bounded
        self._output_budget = LearnerBudget(OUTPUT_BYTES_PER_S, OUTPUT_BURST_BYTES, time.monotonic)
        self._key = learner_key(config.job_id, config.rank)
        self._ttl_s = config.heartbeat_ttl_s
        self._call_timeout_s = max(config.heartbeat_ttl_s, MIN_CALL_TIMEOUT_S)
        now = clock()
        self._beat = LearnerBeat(
            attempt=config.attempt,
            agent_pid=os.getpid(),
            host=socket.gethostname(),
            started_at=now,
            last_progress=now,
        )
        self._lease: int | None = None
        self._expired_lease: int | None = None
        self._changed = asyncio.Event()
        self._lease_doubted = asyncio.Event()
        self._store_reachable = True
        self._stop_signal: int | None = None
        self._sandbox_pid: int | None = None
        self._channel = (
            ReportChannel(config.report_dir, self._take_report, self._notes, owner=config.run_as)
            if config.report_dir is not None
            else None
        )
        self._checkpoints = checkpoints.scanner_for(config.command_environment, config.rank, self._notes)
        self._workers = WorkerSteps.from_environment(config.command_environment, config.rank)

    @property
    def beat(self) -> LearnerBeat:
        return self._beat

    def on_stop_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT: the learner got it too (one process group); wait for it to exit."""
        self._log.info(
            "stop signal received: waiting for the learner to exit", signal=signal.Signals(signum).name
        )
        if self._stop_signal is None:
            self._stop_signal = signum
        if self._sandbox_pid is not None:
            signal_sandbox(self._sandbox_pid, signum)

    async def run(self) -> int:
        """Run the command to its end; returns its exit code (negative: killed by that signal)."""
        if self._stop_signal is not None:
            self._log.info("stopped before the learner started")
            return await self._finish(-self._stop_signal)
        group = self._learner_group()
        async with self._lease_kept():
            try:
                if self._channel is not None:
                    await self._channel.start()
                returncode = await self._run_command(group)
            finally:
                if self._channel is not None:
                    # what the learner sent before it ended is still in the socket: read it
                    await self._channel.close(OUTPUT_DRAIN_TIMEOUT_S)
                if group is not None:
                    await self._remove_group(group)
        return await self._finish(exit_code_of(returncode))

    @contextlib.asynccontextmanager
    async def _lease_kept(self) -> AsyncIterator[None]:
        """The heartbeat lease renewed until the exit is about to be reported: after the command
        ends come the final checkpoint scan (up to ``FINAL_SCAN_TIMEOUT_S``), the channel's drain and
        the group's removal, and a lease let go at the command's end expired meanwhile, so the
        monitor took a learner that exited 0 after saving a big checkpoint for a lost one."""
        keeper = asyncio.create_task(self._keep_lease())
        try:
            yield
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)

    async def _run_command(self, group: LearnerGroup | None) -> int:
        """Start the command and keep its heartbeat until it exits; its status."""
        with self._output_sink() as sink:
            child = self._start_command(group)
            if self._config.sandbox:
                self._sandbox_pid = child.pid
            self._beat = replace(self._beat, pid=child.pid)
            self._log.info("learner started", pid=child.pid, command=self._command)
            assert child.stdout is not None  # asked for a pipe
            output = asyncio.StreamReader()
            loop = asyncio.get_running_loop()
            pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(output), child.stdout)
            pump = asyncio.create_task(self._pump_output(output, sink))
            helpers = [asyncio.create_task(self._publish())]
            if self._checkpoints is not None:
                helpers.append(asyncio.create_task(checkpoints.discover(self._checkpoints, self._found)))
            try:
                returncode = await wait_for_exit(child)
                # Output still in the pipe belongs to the log; a daemon the command left behind may
                # hold the pipe open for ever, so the wait for the end of output is bounded.
                await asyncio.wait({pump}, timeout=OUTPUT_DRAIN_TIMEOUT_S)
            finally:
                self._sandbox_pid = None
                if child.returncode is None:
                    child.kill()
                    child.wait()
                for task in (pump, *helpers):
                    task.cancel()
                await asyncio.gather(pump, *helpers, return_exceptions=True)
                pipe.close()
        if self._checkpoints is not None:
            await checkpoints.final_scan(self._checkpoints, self._found)
        return returncode

    def _learner_group(self) -> LearnerGroup | None:
        """The learner's cgroup with its limits, where the launcher asks for one; what cannot be
        enforced on this host is logged."""
        if self._config.limits is None:
            return None
        group = make_group(self._config.limits)
        if group.not_enforced:
            self._log.warning(
                "learner limits not enforced on this host", controllers=list(group.not_enforced)
            )
        return group

    async def _remove_group(self, group: LearnerGroup) -> None:
        """Remove the learner's cgroup; what its sandbox's init left is killed as the init exits, and
        may take a moment to leave the group."""
        deadline = asyncio.get_running_loop().time() + OUTPUT_DRAIN_TIMEOUT_S
        while problems := group.remove():
            if asyncio.get_running_loop().time() >= deadline:
                self._log.warning("learner cgroup left behind", problems=problems)
                return
            await asyncio.sleep(CGROUP_RETRY_S)

    def _start_command(self, group: LearnerGroup | None) -> subprocess.Popen[bytes]:
        """The learner's command under ``/bin/sh``, output on one pipe, with its own environment: in
        its sandbox and cgroup, in a process group of its own (see the module docstring on signals);
        or, with no sandbox, in its cgroup in the agent's process group, as the learner user when the
        launcher names one, else as the agent's. The programs the agent starts before the command,
        as the platform's user, root (the shell that joins the cgroup, bwrap or the user switch),
        get the platform's ``PATH`` alone, and the command its environment from a descriptor they
        read (bwrap, the user switch); with neither, nothing changes users, and the command's
        environment is its first program's."""
        command = [SHELL, "-c", SHELL_PRELUDE + self._command]
        environment = self._config.command_environment
        passed: list[int] = []
        with contextlib.ExitStack() as descriptors:
            if self._config.sandbox or self._config.run_as is not None:
                given = environment_file(self._config.command_environment)
                descriptors.callback(os.close, given)
                if self._config.sandbox:
                    seccomp = filter_pipe()
                    descriptors.callback(os.close, seccomp)
                    command = [*with_environment(filtered(self._config.sandbox, seccomp), given), *command]
                    passed = [seccomp, given]
                elif self._config.run_as is not None:
                    command = switching_command(sys.executable, given, *self._config.run_as, command)
                    passed = [given]
                environment = self._config.root_side_environment
            return subprocess.Popen(
                joining_command(group, command) if group is not None else command,
                cwd=self._config.command_dir,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                process_group=0 if self._config.sandbox else None,
                pass_fds=passed,
            )

    # -- the tasks ------------------------------------------------------------------------------

    async def _pump_output(self, output: asyncio.StreamReader, sink: BinaryIO) -> None:
        sink_broken = False
        while chunk := await output.read(OUTPUT_CHUNK_BYTES):
            if not sink_broken:
                try:
                    sink.write(chunk)
                    sink.flush()
                except OSError as error:
                    # Keep draining the pipe: a learner blocked on a full pipe would look hung.
                    sink_broken = True
                    self._log.error("learner log cannot be written: dropping its output", error=str(error))
            self._beat = replace(self._beat, last_progress=self._clock())
            self._changed.set()
            await asyncio.sleep(self._output_budget.spend(len(chunk)))

    async def _keep_lease(self) -> None:
        while True:
            await self._renew_lease()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._ttl_s / 3):
                    await self._lease_doubted.wait()
            self._lease_doubted.clear()

    async def _publish(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            lease = self._lease
            if lease is None:
                continue  # the lease keeper marks the beat changed once it holds a lease
            try:
                async with asyncio.timeout(self._call_timeout_s):
                    await self._store.put(self._key, self._beat.to_json(), lease)
                self._note_store_reachable()
            except LookupError:
                if self._lease == lease:
                    self._lease, self._expired_lease = None, lease
                self._lease_doubted.set()
                self._changed.set()
            except (StoreUnavailable, TimeoutError) as error:
                self._note_store_unreachable(error)
                self._changed.set()
            await asyncio.sleep(MIN_PUBLISH_INTERVAL_S)

    # -- steps ----------------------------------------------------------------------------------

    async def _renew_lease(self) -> None:
        """Keep the lease alive; grant a new one when there is none or it expired."""
        lease = self._lease
        try:
            async with asyncio.timeout(self._call_timeout_s):
                if lease is not None and await self._store.keepalive(lease):
                    self._note_store_reachable()
                    return
                if lease is not None:
                    self._lease, self._expired_lease = None, lease
                self._lease = await self._store.grant(self._ttl_s)
        except (StoreUnavailable, TimeoutError) as error:
            self._note_store_unreachable(error)
            return
        self._note_store_reachable()
        if self._expired_lease is None:
            self._log.info("heartbeat lease granted", lease=self._lease)
        else:
            self._log.warning(
                "heartbeat lease had expired: re-established", expired=self._expired_lease, lease=self._lease
            )
            self._expired_lease = None
        self._changed.set()

    def _take_report(self, report: Report) -> None:
        """A report from the channel (already bounded): into the beat, or refused with a reason."""
        now = self._clock()
        if isinstance(report, ProgressReport):
            for reason in report.dropped:
                self._notes.warning("learner metric dropped", reason=reason, local_rank=report.local_rank)
            metrics = dict(self._beat.metrics)
            for name, value in report.metrics.items():
                # the beat's metrics are bounded as one report's: the names first seen are kept
                if name in metrics or len(metrics) < MAX_METRICS:
                    metrics[name] = value
                else:
                    self._notes.warning(
                        "learner metric dropped",
                        reason=f"metric {name!r} over the limit of {MAX_METRICS} names",
                        local_rank=report.local_rank,
                    )
            step = self._workers.report(report.local_rank, report.step)
            self._beat = replace(
                self._beat, step=step, metrics=metrics, workers=self._workers.by_rank, last_progress=now
            )
        elif isinstance(report, CheckpointReport):
            problem = self._checkpoint_problem(report.uri)
            if problem is not None:
                self._notes.warning(
                    "learner checkpoint refused",
                    uri=report.uri[:300],
                    reason=problem,
                    local_rank=report.local_rank,
                )
                return
            checkpoint = Checkpoint(
                rank=self._config.rank,
                attempt=self._config.attempt,
                step=report.step,
                uri=report.uri,
                size_bytes=report.size_bytes,
                checksum=report.checksum,
            )
            self._beat = replace(self._beat, checkpoint=checkpoint.model_dump(mode="json"), last_progress=now)
            # the learner's to repeat at will (one report sent again and again wrote 12 MB a second)
            self._notes.info("checkpoint reported", step=checkpoint.step, uri=checkpoint.uri)
        self._changed.set()

    def _found(self, found: checkpoints.Found) -> None:
        """A checkpoint discovered in the checkpoint directory: the learner's, if it is the newest."""
        known = self._beat.checkpoint
        if known is not None and int(known.get("step", -1)) >= found.step:
            return
        # the directory as the learner sees it (its sandbox binds it at the same path, so it is
        # also where the agent scanned): inside the job's checkpoint place, as the owner requires
        checkpoint = checkpoints.as_checkpoint(
            found, self._config.checkpoint_dir, rank=self._config.rank, attempt=self._config.attempt
        )
        self._beat = replace(
            self._beat, checkpoint=checkpoint.model_dump(mode="json"), last_progress=self._clock()
        )
        self._notes.info("checkpoint discovered", step=checkpoint.step, uri=checkpoint.uri)
        self._changed.set()

    def _checkpoint_problem(self, uri: str) -> str | None:
        """Why a checkpoint at ``uri`` is not the job's, or None: it must be a ``file://`` URI or an
        absolute path inside the job's checkpoint directory, reached without a symbolic link (which
        could lead out)."""
        root = self._config.checkpoint_dir
        path = checkpoint_path(uri, root) if root else None
        if path is None:
            return f"not a file:// URI or absolute path inside the job's checkpoint directory {root!r}"
        parts = Path(path).relative_to(root).parts
        if len(parts) > REPORTED_DEPTH_MAX:  # each part costs a lookup of the whole path so far
            return f"nested deeper than {REPORTED_DEPTH_MAX} directories in the job's checkpoint directory"
        current = Path(root)
        for part in parts:
            current = current / part
            try:
                if current.is_symlink():
                    return f"{current} is a symbolic link"
            except OSError as error:
                return f"{current}: {error.strerror}"
        if not current.exists():
            return "no such file or directory"
        return None

    async def _finish(self, exit_code: int) -> int:
        """Publish the final beat and the exit record, then revoke the lease; bounded by a deadline.
        The exit record names the beat's checkpoint again: the beat goes with the lease, and the
        relaunch of a gang this rank was stopped from reads what it saved on its way out there."""
        deadline = asyncio.get_running_loop().time() + EXIT_REPORT_TIMEOUT_S
        while True:
            try:
                async with asyncio.timeout(self._call_timeout_s):
                    lease = self._lease
                    if lease is None:
                        lease = self._lease = await self._store.grant(self._ttl_s)
                    await self._put_final_beat(lease)
                    key = exit_key(self._config.job_id, self._config.attempt, self._config.rank)
                    await self._store.put(key, encode_exit(exit_code, self._beat.checkpoint))
                break
            except (LookupError, StoreUnavailable, TimeoutError) as error:
                if isinstance(error, LookupError):
                    self._lease = None
                if asyncio.get_running_loop().time() >= deadline:
                    self._log.error(
                        "learner exit could not be reported", exit_code=exit_code, error=str(error)
                    )
                    return exit_code
                await asyncio.sleep(RETRY_INTERVAL_S)
        self._log.info("learner exited", exit_code=exit_code, step=self._beat.step)
        with contextlib.suppress(LookupError, StoreUnavailable, TimeoutError):
            async with asyncio.timeout(self._call_timeout_s):
                await self._store.revoke(lease)
        return exit_code

    async def _put_final_beat(self, lease: int) -> None:
        """The final beat, unless the store refuses it as a request (not an outage): the exit record
        must follow whatever the beat holds."""
        try:
            await self._store.put(self._key, self._beat.to_json(), lease)
        except (LookupError, StoreUnavailable, TimeoutError):
            raise
        except Exception as error:
            self._log.error("final heartbeat refused: reporting the exit without it", error=str(error))

    @contextlib.contextmanager
    def _output_sink(self) -> Iterator[BinaryIO]:
        if self._config.log_file is None:
            yield sys.stdout.buffer
            return
        self._config.log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # the platform's alone: a job's output may hold what another job must not read
        descriptor = os.open(
            self._config.log_file,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        with os.fdopen(descriptor, "ab") as sink:
            yield sink

    def _note_store_reachable(self) -> None:
        if not self._store_reachable:
            self._store_reachable = True
            self._log.info("heartbeat store reachable again")

    def _note_store_unreachable(self, error: BaseException) -> None:
        if self._store_reachable:
            self._store_reachable = False
            self._log.warning(
                "heartbeat store unreachable: the learner runs on", error=str(error) or type(error).__name__
            )


async def run_agent(config: AgentConfig, store: HeartbeatStore, command: str) -> int:
    """Run a learner under an agent in this process, with SIGTERM and SIGINT handled as stops."""
    agent = LearnerAgent(config, store, command)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, agent.on_stop_signal, signum)
    try:
        return await agent.run()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await store.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -I -u -m ffdl.learner.agent -- COMMAND...``: the words after ``--`` form one shell command."""
    configure_logging(os.environ.get("FFDL_LOG_FORMAT", "console"), os.environ.get("FFDL_LOG_LEVEL", "info"))
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["--"]:
        words = words[1:]
    command = " ".join(words)
    if not command.strip():
        print("usage: python -m ffdl.learner.agent -- <shell command>", file=sys.stderr)
        return os.EX_USAGE
    try:
        config = AgentConfig.from_environ(os.environ)
        store = open_store(config.heartbeats_url, config.heartbeats_credentials)
    except ValueError as error:
        log.error("learner agent misconfigured", error=str(error))
        return os.EX_CONFIG
    exit_code = asyncio.run(run_agent(config, store, command))
    return exit_code if exit_code >= 0 else 128 - exit_code


if __name__ == "__main__":
    sys.exit(main())
