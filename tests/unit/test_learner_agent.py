"""The learner agent: what it publishes, how it rides out a store outage, how it stops and exits.

Most tests run the agent in this process against :class:`FlakyStore`, an in-memory heartbeat
store that can be taken down and can expire leases on demand; the signal tests run the agent as the
launcher does (its own process and session) against the embedded store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog

from ffdl.adapters.heartbeats import exit_key, learner_key, open_store
from ffdl.adapters.launchers.environment import JOB_ENV_PREFIX, RUN_AS_VARIABLE, SANDBOX_VARIABLE
from ffdl.adapters.processes import exit_code_of
from ffdl.events.reports import MAX_METRICS
from ffdl.handlers.heartbeat_keys import LearnerBeat, parse_exit
from ffdl.handlers.ports import Snapshot, StoreUnavailable, WatchEvent
from ffdl.learner import agent as agent_module
from ffdl.learner import checkpoints
from ffdl.learner.agent import REPORTED_DEPTH_MAX, AgentConfig, LearnerAgent, main
from ffdl.learner.channel import NOTES_PER_INTERVAL, CheckpointReport
from tests.services import wait_until_async

JOB = "job-agent"
WAIT_S = 10.0

AgentRunner = Callable[[LearnerAgent], "asyncio.Task[int]"]


class FlakyStore:
    """A heartbeat store in memory that fails every call while ``down`` is set."""

    def __init__(self) -> None:
        self.down = False
        self.failed_calls = 0
        self.leases: set[int] = set()
        self.keys: dict[str, tuple[bytes, int | None]] = {}
        self._next_lease = 1

    def expire_all_leases(self) -> None:
        self.keys = {key: (value, lease) for key, (value, lease) in self.keys.items() if lease is None}
        self.leases.clear()

    def beat(self, rank: int = 0) -> LearnerBeat | None:
        entry = self.keys.get(learner_key(JOB, rank))
        return LearnerBeat.from_json(entry[0]) if entry else None

    def _check_up(self) -> None:
        if self.down:
            self.failed_calls += 1
            raise StoreUnavailable("store is down")

    async def grant(self, ttl_s: float) -> int:
        self._check_up()
        lease, self._next_lease = self._next_lease, self._next_lease + 1
        self.leases.add(lease)
        return lease

    async def keepalive(self, lease: int) -> bool:
        self._check_up()
        return lease in self.leases

    async def revoke(self, lease: int) -> None:
        self._check_up()
        self.leases.discard(lease)
        self.keys = {key: entry for key, entry in self.keys.items() if entry[1] != lease}

    async def put(self, key: str, value: bytes, lease: int | None = None) -> None:
        self._check_up()
        if lease is not None and lease not in self.leases:
            raise LookupError(f"lease {lease} not found")
        self.keys[key] = (value, lease)

    async def delete(self, key: str) -> None:
        self._check_up()
        self.keys.pop(key, None)

    async def snapshot(self, prefix: str) -> Snapshot:
        self._check_up()
        return Snapshot({key: value for key, (value, _) in self.keys.items() if key.startswith(prefix)}, 0)

    def watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        raise StoreUnavailable("this store has no watches: the agent never watches")

    async def close(self) -> None:
        return None


def config(tmp_path: Path, ttl_s: float = 0.3) -> AgentConfig:
    return AgentConfig(
        job_id=JOB,
        attempt=1,
        rank=0,
        heartbeats_url="memory://",
        command_environment=dict(os.environ),  # the command runs with the test process's environment
        heartbeat_ttl_s=ttl_s,
        log_file=tmp_path / "learner.log",
        report_dir=tmp_path,
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )


@pytest.fixture
async def run_agent() -> AsyncIterator[AgentRunner]:
    """Runs agents in this process; one a failed test left running is cancelled (its learner killed)."""
    tasks: list[asyncio.Task[int]] = []

    def start(agent: LearnerAgent) -> asyncio.Task[int]:
        tasks.append(asyncio.create_task(agent.run()))
        return tasks[-1]

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def until_go(go_file: Path) -> str:
    return f'while [ ! -e "{go_file}" ]; do sleep 0.05; done'


async def test_the_beat_carries_progress_metrics_and_the_latest_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_agent: AgentRunner
) -> None:
    store = FlakyStore()
    monkeypatch.setenv("FFDL_REPORT_SOCKET", str(tmp_path / "report.sock"))
    (tmp_path / "checkpoints").mkdir()
    checkpoint = tmp_path / "checkpoints" / "step-7.bin"
    program = (
        "from ffdl import learner; from pathlib import Path\n"
        "learner.report_progress(5, loss=0.5, accuracy=0.8)\n"
        f"Path({str(checkpoint)!r}).write_bytes(b'weights')\n"
        f"learner.report_checkpoint({str(checkpoint)!r}, 7)\n"
        "learner.report_progress(7, loss=0.25)\n"
    )
    command = f'{sys.executable} -c "{program}" && {until_go(tmp_path / "go")}'
    agent = LearnerAgent(config(tmp_path), store, command)
    running = run_agent(agent)

    await wait_until_async(lambda: (b := store.beat()) is not None and b.step == 7, WAIT_S, what="step 7")
    beat = store.beat()
    assert beat is not None
    assert beat.metrics == {"loss": 0.25, "accuracy": 0.8}
    assert beat.checkpoint is not None
    assert beat.checkpoint["step"] == 7
    assert beat.checkpoint["uri"] == f"file://{checkpoint}"
    assert beat.checkpoint["size_bytes"] == len(b"weights")
    assert beat.checkpoint["checksum"].startswith("sha256:")
    assert beat.attempt == 1
    assert beat.agent_pid == os.getpid()
    assert beat.pid is not None and beat.pid != os.getpid()
    assert beat.host

    (tmp_path / "go").touch()
    assert await running == 0
    assert parse_exit(store.keys[exit_key(JOB, 1, 0)][0]).exit_code == 0
    assert learner_key(JOB, 0) not in store.keys  # the lease was revoked


async def test_the_beat_keeps_at_most_the_first_metric_names_a_learner_sends_whatever_it_sends_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_agent: AgentRunner
) -> None:
    """Each report is bounded; so is what the beat keeps of them all: a learner sending new names
    report after report grew it without end (and etcd refuses a beat over its request limit)."""
    store = FlakyStore()
    monkeypatch.setenv("FFDL_REPORT_SOCKET", str(tmp_path / "report.sock"))
    program = (
        "from ffdl import learner\n"
        "for batch in range(20):\n"
        f"    metrics = {{'m%d_%d' % (batch, i): 1.0 for i in range({MAX_METRICS})}}\n"
        "    metrics['m0_0'] = batch\n"
        "    learner.report_progress(batch, **metrics)\n"
    )
    command = f'{sys.executable} -c "{program}" && {until_go(tmp_path / "go")}'
    running = run_agent(LearnerAgent(config(tmp_path), store, command))

    await wait_until_async(lambda: (b := store.beat()) is not None and b.step == 19, WAIT_S, what="step 19")
    written = json.loads(store.keys[learner_key(JOB, 0)][0])  # as the agent wrote it, not as read
    assert written["metrics"] == {f"m0_{i}": 1.0 for i in range(MAX_METRICS)} | {"m0_0": 19.0}
    (tmp_path / "go").touch()
    assert await running == 0


async def test_each_workers_reports_arrive_over_the_channel_apart_and_the_learner_is_at_the_slowest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_agent: AgentRunner
) -> None:
    """Under torchrun a learner's workers report with their LOCAL_RANK: learner 1 of two workers each
    holds global ranks 2 and 3, and its step is the slower one's."""
    store = FlakyStore()
    monkeypatch.setenv("FFDL_REPORT_SOCKET", str(tmp_path / "report.sock"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")

    def worker(local_rank: int, step: int) -> str:
        program = f"from ffdl import learner; learner.report_progress({step})"
        return f'LOCAL_RANK={local_rank} {sys.executable} -c "{program}"'

    command = f"{worker(0, 5)} && {worker(1, 3)} && {until_go(tmp_path / 'go')}"
    agent = LearnerAgent(replace(config(tmp_path), rank=1), store, command)
    running = run_agent(agent)

    await wait_until_async(
        lambda: (b := store.beat(1)) is not None and b.workers == {2: 5, 3: 3}, WAIT_S, what="both workers"
    )
    beat = store.beat(1)
    assert beat is not None and beat.step == 3
    (tmp_path / "go").touch()
    assert await running == 0


async def test_new_output_counts_as_progress_but_does_not_move_the_step(
    tmp_path: Path, run_agent: AgentRunner
) -> None:
    store = FlakyStore()
    go_file = tmp_path / "go"
    command = f"echo first; sleep 0.3; echo second; {until_go(go_file)}"
    agent = LearnerAgent(config(tmp_path), store, command)
    running = run_agent(agent)

    def second_line_seen() -> bool:
        beat = store.beat()
        return beat is not None and beat.last_progress - beat.started_at >= 0.3

    await wait_until_async(second_line_seen, WAIT_S, what="progress from the second line")
    go_file.touch()
    assert await running == 0
    assert agent.beat.step == 0
    assert (tmp_path / "learner.log").read_text() == "first\nsecond\n"


async def test_a_store_outage_longer_than_the_lease_neither_stops_the_learner_nor_loses_its_key(
    tmp_path: Path, run_agent: AgentRunner
) -> None:
    store = FlakyStore()
    go_file = tmp_path / "go"
    agent = LearnerAgent(config(tmp_path), store, until_go(go_file))
    running = run_agent(agent)
    await wait_until_async(lambda: store.beat() is not None, WAIT_S, what="the first heartbeat")
    (_, first_lease) = store.keys[learner_key(JOB, 0)]

    store.down = True
    store.expire_all_leases()
    await wait_until_async(lambda: store.failed_calls >= 3, WAIT_S, what="calls failing during the outage")
    assert not running.done()
    store.down = False

    def re_established() -> bool:
        entry = store.keys.get(learner_key(JOB, 0))
        return (
            entry is not None
            and entry[1] is not None
            and entry[1] != first_lease
            and entry[1] in store.leases
        )

    await wait_until_async(re_established, WAIT_S, what="the key under a new lease")
    go_file.touch()
    assert await running == 0
    assert parse_exit(store.keys[exit_key(JOB, 1, 0)][0]).exit_code == 0


async def test_the_exit_is_reported_once_the_store_is_back(tmp_path: Path, run_agent: AgentRunner) -> None:
    store = FlakyStore()
    go_file = tmp_path / "go"
    agent = LearnerAgent(config(tmp_path), store, f"{until_go(go_file)}; exit 4")
    running = run_agent(agent)
    await wait_until_async(lambda: store.beat() is not None, WAIT_S, what="the first heartbeat")

    store.down = True
    go_file.touch()
    await wait_until_async(lambda: store.failed_calls >= 2, WAIT_S, what="the exit report failing")
    store.down = False

    assert await running == 4
    assert parse_exit(store.keys[exit_key(JOB, 1, 0)][0]).exit_code == 4


async def test_a_daemon_left_holding_the_output_does_not_hold_up_the_exit_report(
    tmp_path: Path, run_agent: AgentRunner
) -> None:
    store = FlakyStore()
    daemon_pid = tmp_path / "daemon.pid"
    agent = LearnerAgent(config(tmp_path), store, f"sleep 30 & echo $! > {daemon_pid}; echo bye; exit 5")
    try:
        assert await asyncio.wait_for(run_agent(agent), WAIT_S) == 5
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int(daemon_pid.read_text()), signal.SIGKILL)
    assert parse_exit(store.keys[exit_key(JOB, 1, 0)][0]).exit_code == 5
    assert (tmp_path / "learner.log").read_text() == "bye\n"


def test_the_shell_status_of_a_signalled_command_becomes_a_negative_exit_code() -> None:
    assert [exit_code_of(code) for code in (0, 3, 126, 128, 137, 143, 255, -9)] == [
        0,
        3,
        126,
        128,
        -9,
        -15,
        255,
        -9,
    ]


def test_the_agent_refuses_to_start_without_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FFDL_JOB_ID", raising=False)
    assert main(["--", "true"]) == os.EX_CONFIG
    assert main(["--"]) == os.EX_USAGE


#: Stands in for bwrap: writes down its arguments, its environment and what it read from ``--args``.
RECORDING_BWRAP = """
import json, os, sys
arguments = sys.argv[1:]
given = b""
if "--args" in arguments:
    descriptor = int(arguments[arguments.index("--args") + 1])
    while chunk := os.read(descriptor, 65536):
        given += chunk
started_with = open("/proc/self/environ", "rb").read().split(b"\\0")  # before Python's locale coercion
environment = dict(os.fsdecode(entry).split("=", 1) for entry in started_with if entry)
record = {"arguments": arguments, "environment": environment, "given": os.fsdecode(given)}
with open(sys.argv[0] + ".json", "w") as out:
    json.dump(record, out)
"""


def recorded(bwrap: Path) -> str:
    return Path(f"{bwrap}.json").read_text()


async def test_a_sandboxed_command_gets_its_environment_from_bwrap_and_bwrap_only_the_platforms_path(
    tmp_path: Path, run_agent: AgentRunner
) -> None:
    """The job's env was the environment of the programs that make the sandbox (root): now they get
    the platform's PATH, and bwrap reads the command's whole environment from a descriptor, never
    from its command line (a tenant's secret would be in /proc/*/cmdline for every host user)."""
    bwrap = tmp_path / "bwrap"
    bwrap.write_text(f"#!{sys.executable} -I\n{RECORDING_BWRAP}")
    bwrap.chmod(0o755)
    job_env = {
        "MALLOC_PERTURB_": "85",
        "MALLOC_ARENA_MAX": "1",
        "POSIXLY_CORRECT": "1",
        "LANGUAGE": "xx",
        "SECRET": "tenant-secret-7f3a with spaces\nand = \u00e9",
    }
    agent_environment = rank_zero_environment(
        job_env, {SANDBOX_VARIABLE: json.dumps([str(bwrap), "--unshare-pid", "--"])}
    )
    agent_config = replace(AgentConfig.from_environ(agent_environment), log_file=tmp_path / "learner.log")

    assert await run_agent(LearnerAgent(agent_config, FlakyStore(), "true")) == 0

    record = json.loads(recorded(bwrap))
    assert record["environment"] == {"PATH": "/usr/bin:/bin"}
    assert not any("tenant-secret" in argument for argument in record["arguments"])
    options = record["arguments"][: record["arguments"].index("--")]  # bwrap's, before the command
    assert "--args" in options and "--seccomp" in options
    words = record["given"].split("\0")
    assert words[0] == "--clearenv" and words[-1] == ""
    triples = [words[index : index + 3] for index in range(1, len(words) - 1, 3)]
    assert {triple[0] for triple in triples} == {"--setenv"}
    command = {name: value for _, name, value in triples}
    assert command == agent_config.command_environment
    assert {name: command[name] for name in job_env} == job_env
    assert command["PATH"] == "/usr/bin:/bin" and SANDBOX_VARIABLE not in command


def rank_zero_environment(job_env: dict[str, str], platform: dict[str, str]) -> dict[str, str]:
    """The environment the launcher gives rank 0's agent: the platform's ``PATH`` and ``LANG``, the
    ``platform`` variables that say how to start the command, and the job's env under its prefix."""
    return {
        "FFDL_JOB_ID": JOB,
        "FFDL_ATTEMPT": "1",
        "RANK": "0",
        "FFDL_HEARTBEATS": "memory://",
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        **platform,
        **{JOB_ENV_PREFIX + name: value for name, value in job_env.items()},
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="only root switches users")
async def test_an_unsandboxed_command_runs_as_the_learner_user_through_the_switch_given_the_platforms_path(
    tmp_path: Path, run_agent: AgentRunner
) -> None:
    """Unsandboxed, the command ran as the learner user from its first program on (Python switched
    users before it started), which could then not join the learner's cgroup: now the user switch
    (root, the platform's PATH alone) reads the command's environment from a descriptor and gives
    up root for good before it starts the command."""
    job_env = {"MALLOC_PERTURB_": "85", "SECRET": "tenant-secret-7f3a with spaces\nand = \u00e9"}
    agent_environment = rank_zero_environment(job_env, {RUN_AS_VARIABLE: "65534:65534"})
    agent_config = replace(
        AgentConfig.from_environ(agent_environment), log_file=tmp_path / "learner.log", command_dir=Path("/")
    )
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def recording_popen(arguments: list[str], **options: Any) -> subprocess.Popen[bytes]:
        started.append([*arguments, repr(options["env"])])
        return real_popen(arguments, **options)

    command = "grep -E '^(Uid|CapEff|NoNewPrivs):' /proc/$$/status; tr '\\0' '\\n' < /proc/$$/environ"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent_module.subprocess, "Popen", recording_popen)
        assert await run_agent(LearnerAgent(agent_config, FlakyStore(), command)) == 0

    (arguments,) = started
    assert arguments[-1] == repr({"PATH": "/usr/bin:/bin"})  # root's programs': nothing of the job's
    assert arguments[1:3] == ["-I", "-S"] and arguments[3].endswith("/ffdl/adapters/launchers/user_switch.py")
    assert not any("tenant-secret" in argument for argument in arguments)
    log = (tmp_path / "learner.log").read_text()
    status = dict(line.split(":", 1) for line in log.splitlines()[:3])
    assert status["Uid"].split() == ["65534"] * 4
    assert status["CapEff"].strip() == "0" * 16 and status["NoNewPrivs"].strip() == "1"
    given = log.split("\n", 3)[3]
    expected = agent_config.command_environment
    assert given == "".join(f"{name}={value}\n" for name, value in expected.items())
    assert "tenant-secret-7f3a with spaces" in given


# --------------------------------------------------------------------------- a real agent process


def start_agent(tmp_path: Path, command: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FFDL_JOB_ID": JOB,
        "FFDL_ATTEMPT": "1",
        "RANK": "0",
        "FFDL_HEARTBEATS": f"embedded://{tmp_path / 'heartbeats.sqlite'}",
        "FFDL_HEARTBEAT_TTL": "2",
        "FFDL_LOG_FILE": str(tmp_path / "learner.log"),
        "FFDL_REPORT_SOCKET": str(tmp_path / "report.sock"),
    }
    return subprocess.Popen(
        [sys.executable, "-I", "-m", "ffdl.learner.agent", "--", command],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


async def stop_group_and_collect(tmp_path: Path, agent: subprocess.Popen[bytes]) -> tuple[int, int]:
    """SIGTERM the learner's process group once it is ready; the agent's status and reported exit."""
    log_file = tmp_path / "learner.log"
    try:
        await wait_until_async(
            lambda: log_file.exists() and "ready" in log_file.read_text(), WAIT_S, what="the learner to start"
        )
        os.killpg(agent.pid, signal.SIGTERM)
        status = await asyncio.to_thread(agent.wait, WAIT_S)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    store = open_store(f"embedded://{tmp_path / 'heartbeats.sqlite'}")
    try:
        values = (await store.snapshot(exit_key(JOB, 1, 0))).values
    finally:
        await store.close()
    return status, parse_exit(values[exit_key(JOB, 1, 0)]).exit_code


async def test_on_sigterm_the_agent_waits_for_the_learner_and_reports_its_exit(tmp_path: Path) -> None:
    command = "trap 'sleep 0.3; echo checkpointed; exit 0' TERM; echo ready; while :; do sleep 0.05; done"

    status, reported = await stop_group_and_collect(tmp_path, start_agent(tmp_path, command))

    assert (status, reported) == (0, 0)
    assert "checkpointed" in (tmp_path / "learner.log").read_text()


async def test_a_learner_ended_by_sigterm_is_reported_as_signal_15(tmp_path: Path) -> None:
    command = f"echo ready; exec {sys.executable} -c 'import time; time.sleep(60)'"

    status, reported = await stop_group_and_collect(tmp_path, start_agent(tmp_path, command))

    assert (status, reported) == (128 + signal.SIGTERM, -signal.SIGTERM)


def with_checkpoint_dir(tmp_path: Path, directory: Path, keep: int = 3) -> AgentConfig:
    environment = {
        **config(tmp_path).command_environment,
        "FFDL_CHECKPOINT_DIR": str(directory),
        "FFDL_KEEP_CHECKPOINTS": str(keep),
    }
    return replace(config(tmp_path), command_environment=environment)


async def test_a_checkpoint_the_program_saves_without_ffdl_is_discovered_while_it_runs(
    tmp_path: Path, run_agent: AgentRunner
) -> None:
    store = FlakyStore()
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    command = f"printf weights > {directory}/ckpt_step_12.pt.tmp && mv {directory}/ckpt_step_12.pt.tmp "
    command += f"{directory}/ckpt_step_12.pt && {until_go(tmp_path / 'go')}"
    running = run_agent(LearnerAgent(with_checkpoint_dir(tmp_path, directory), store, command))

    await wait_until_async(
        lambda: (b := store.beat()) is not None and b.checkpoint is not None, WAIT_S, what="a checkpoint"
    )
    beat = store.beat()
    assert beat is not None and beat.checkpoint is not None
    assert beat.checkpoint["step"] == 12
    assert beat.checkpoint["uri"] == f"file://{directory}/ckpt_step_12.pt"
    assert beat.checkpoint["size_bytes"] == len(b"weights")
    assert beat.checkpoint["checksum"] == "sha256:" + hashlib.sha256(b"weights").hexdigest()
    (tmp_path / "go").touch()
    assert await running == 0


async def test_a_checkpoint_written_just_before_the_exit_is_in_the_last_beat(
    tmp_path: Path, run_agent: AgentRunner
) -> None:
    store = FlakyStore()
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    for step in (10, 20):
        (directory / f"{step}.pt").write_bytes(b"old")
    agent = LearnerAgent(
        with_checkpoint_dir(tmp_path, directory, keep=1), store, f"printf new > {directory}/30.pt"
    )
    assert await run_agent(agent) == 0
    assert agent.beat.checkpoint is not None and agent.beat.checkpoint["step"] == 30
    assert sorted(path.name for path in directory.iterdir()) == ["30.pt"]  # kept: the newest one
    # the exit record names it too: it outlives the beat, which goes with the lease
    record = parse_exit(store.keys[exit_key(JOB, 1, 0)][0])
    assert record.exit_code == 0
    assert record.checkpoint == agent.beat.checkpoint
    assert learner_key(JOB, 0) not in store.keys


class ExpiringStore(FlakyStore):
    """A store whose leases expire ``ttl_s`` after their last grant or keepalive, taking their keys
    with them (``expired``), as etcd's do: checked whenever the store is called."""

    def __init__(self) -> None:
        super().__init__()
        self.renewed: dict[int, tuple[float, float]] = {}  # lease -> (last renewed, ttl)
        self.expired: list[str] = []

    def _check_up(self) -> None:
        super()._check_up()
        now = time.monotonic()
        for lease, (at, ttl_s) in list(self.renewed.items()):
            if now - at > ttl_s:
                del self.renewed[lease]
                self.leases.discard(lease)
                gone = [key for key, (_, held) in self.keys.items() if held == lease]
                self.expired += gone
                for key in gone:
                    del self.keys[key]

    async def grant(self, ttl_s: float) -> int:
        lease = await super().grant(ttl_s)
        self.renewed[lease] = (time.monotonic(), ttl_s)
        return lease

    async def keepalive(self, lease: int) -> bool:
        alive = await super().keepalive(lease)
        if alive:
            self.renewed[lease] = (time.monotonic(), self.renewed[lease][1])
        return alive


async def test_the_lease_is_kept_while_a_final_checkpoint_is_hashed_after_the_command_ended(
    tmp_path: Path, run_agent: AgentRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program that saves gigabytes on its way out and exits 0: hashing it takes longer than the
    lease lives. A lease let go at the command's end expired meanwhile, the beat's key with it, and
    the monitor reported the learner lost before its exit record came."""
    ttl_s = 1.0
    hashing = checkpoints.final_scan

    async def slow_final_scan(*args: Any) -> None:
        await asyncio.sleep(3 * ttl_s)
        await hashing(*args)

    monkeypatch.setattr(checkpoints, "final_scan", slow_final_scan)
    store = ExpiringStore()
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    settings = replace(with_checkpoint_dir(tmp_path, directory, keep=1), heartbeat_ttl_s=ttl_s)
    agent = LearnerAgent(settings, store, f"printf w > {directory}/7.pt")

    assert await run_agent(agent) == 0
    assert store.expired == []
    record = parse_exit(store.keys[exit_key(JOB, 1, 0)][0])
    assert record.exit_code == 0 and record.checkpoint is not None and record.checkpoint["step"] == 7


def test_a_reported_checkpoint_nested_too_deep_is_refused_before_its_path_is_looked_at(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "checkpoints"
    shallow = directory / "a" / "b"
    shallow.mkdir(parents=True)
    (shallow / "7.pt").write_bytes(b"w")
    agent = LearnerAgent(with_checkpoint_dir(tmp_path, directory), FlakyStore(), "true")
    deep = "/".join(["d"] * (REPORTED_DEPTH_MAX + 1))

    assert agent._checkpoint_problem(f"file://{shallow}/7.pt") is None
    assert agent._checkpoint_problem(f"file://{directory}/{deep}/7.pt") == (
        f"nested deeper than {REPORTED_DEPTH_MAX} directories in the job's checkpoint directory"
    )


async def test_a_checkpoint_name_that_is_not_utf8_is_passed_over_and_the_clean_exit_is_recorded(
    tmp_path: Path, run_agent: AgentRunner
) -> None:
    """The kernel takes any bytes for a name; the record of a checkpoint named so raised inside the
    agent's final scan, before its exit record: a clean exit became a lost learner (P200)."""
    store = FlakyStore()
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    bad_name = "$(printf 'ckpt_step_9\\377.pt')"  # one byte that is not UTF-8
    command = f"printf good > {directory}/ckpt_step_5.pt && printf bad > {directory}/{bad_name}"
    agent = LearnerAgent(with_checkpoint_dir(tmp_path, directory), store, command)

    assert await run_agent(agent) == 0
    record = parse_exit(store.keys[exit_key(JOB, 1, 0)][0])
    assert record.exit_code == 0
    assert record.checkpoint is not None and record.checkpoint["uri"] == f"file://{directory}/ckpt_step_5.pt"


def test_checkpoints_a_learner_reports_or_saves_again_and_again_are_logged_within_its_bound(
    tmp_path: Path,
) -> None:
    """Each accepted report was a line of the platform's log: one report of a long path, sent again
    and again, wrote 12 MB a second there."""
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "7.pt").write_bytes(b"w")
    with structlog.testing.capture_logs() as logs:
        agent = LearnerAgent(with_checkpoint_dir(tmp_path, directory), FlakyStore(), "true")
        for _ in range(NOTES_PER_INTERVAL):
            agent._take_report(CheckpointReport(7, f"file://{directory}/7.pt"))
        for step in range(8, 8 + NOTES_PER_INTERVAL):
            agent._found(checkpoints.Found(f"{step}.pt", step, 1, "sha256:x", 0))

    assert agent.beat.checkpoint is not None and agent.beat.checkpoint["step"] == 7 + NOTES_PER_INTERVAL
    events = [entry["event"] for entry in logs]
    assert events == ["checkpoint reported"] * NOTES_PER_INTERVAL


async def test_a_checkpoint_report_naming_a_file_that_is_not_utf8_is_dropped_and_the_next_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_agent: AgentRunner
) -> None:
    """The file exists, so the report passed the agent's checks, and the record refused its URI:
    the connection's task ended there, with a traceback, and what the learner sent after was lost."""
    monkeypatch.setenv("FFDL_REPORT_SOCKET", str(tmp_path / "report.sock"))
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / os.fsdecode(b"x\xff")).write_bytes(b"w")
    reports = tmp_path / "reports"
    reports.write_bytes(
        b'{"type": "checkpoint", "step": 1, "uri": "file://%s/x\\udcff"}\n' % bytes(directory)
        + b'{"type": "progress", "step": 2}\n'
    )
    program = (
        "import os, socket; s = socket.socket(socket.AF_UNIX); s.connect(os.environ['FFDL_REPORT_SOCKET']); "
        f"s.sendall(open({str(reports)!r}, 'rb').read())"
    )
    agent = LearnerAgent(config(tmp_path), FlakyStore(), f'{sys.executable} -c "{program}"')
    with structlog.testing.capture_logs() as logs:
        assert await run_agent(agent) == 0

    assert agent.beat.step == 2 and agent.beat.checkpoint is None
    [dropped] = [entry for entry in logs if entry["event"] == "learner report dropped"]
    assert dropped["reason"].startswith("checkpoint uri: ")


async def test_a_learner_printing_past_its_output_budget_waits_in_its_writes_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_agent: AgentRunner
) -> None:
    """Copying output into the log costs the agent, outside the learner's cgroup, several times what
    writing it cost the learner: a learner limited to a tenth of a core printing as fast as it could
    made its agent spend more than twice its CPU. Past the budget the pipe is not read."""
    monkeypatch.setattr(agent_module, "OUTPUT_BYTES_PER_S", 2 << 20)
    monkeypatch.setattr(agent_module, "OUTPUT_BURST_BYTES", 1 << 20)
    took = tmp_path / "took"
    program = (
        "import os, time; started = time.monotonic()\n"
        "for _ in range(64): os.write(1, b'x' * 65535 + b'\\n')\n"  # 4 MiB
        f"open({str(took)!r}, 'w').write(str(time.monotonic() - started))\n"
    )
    agent = LearnerAgent(config(tmp_path), FlakyStore(), f'{sys.executable} -c "{program}"')

    assert await run_agent(agent) == 0
    assert float(took.read_text()) >= 1.0  # (4 MiB - 1 MiB at once - what the pipe holds) at 2 MiB/s
    assert (tmp_path / "learner.log").stat().st_size == 4 << 20
