"""The contract every Launcher passes (architecture §2: one suite, every adapter).

A launcher adapter joins the suite through a :class:`LauncherRig`: the launcher under test, the
heartbeat store its learners' agents report to, and a way to read a learner's output. The tests
are the methods of :class:`LauncherContract`; ``test_launcher_contract.py`` runs them once per rig.

Learner commands are small POSIX shell programs. Learners that must stay up until the test lets
them go wait for a file (``$GO``) to appear, so no test depends on how fast anything runs, and
every wait is bounded.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path
from typing import Protocol

from ffdl.adapters.heartbeats import exit_key, learner_key
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, Placement
from ffdl.handlers.heartbeat_keys import LearnerBeat, parse_exit
from ffdl.handlers.ports import HeartbeatStore, Launcher, LaunchRequest, LearnerHandle
from tests.services import wait_until_async

START_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 20.0
STOP_GRACE_S = 10.0
SHORT_GRACE_S = 1.0
#: How long a stop may take beyond its grace: the SIGKILL, the wait for the processes to go.
STOP_SLACK_S = 8.0

WAIT_FOR_GO = 'echo ready; while [ ! -e "$GO" ]; do sleep 0.05; done'


class LauncherRig(Protocol):
    """A launcher adapter under test, with what the suite needs to watch its learners."""

    @property
    def launcher(self) -> Launcher:
        """The launcher the tests drive."""

    @property
    def store(self) -> HeartbeatStore:
        """The heartbeat store the learners' agents report to."""

    async def restart_launcher(self) -> Launcher:
        """Close the launcher as a platform shutting down does (its learners run on); a new one."""

    async def learner_output(self, job_id: str, attempt: int, rank: int) -> str:
        """What the learner wrote to stdout and stderr so far ("" before it started)."""

    def visible_devices(self, gpus: tuple[int, ...]) -> str:
        """``CUDA_VISIBLE_DEVICES`` of a learner placed on these GPUs of its node, as it must see them."""

    def checkpoint_dir(self, job_id: str) -> str:
        """``FFDL_CHECKPOINT_DIR`` of the job's learners, as they see it."""


def new_job_id() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def go_file_in(tmp_path: Path) -> Path:
    """A file a test creates to let its learners go on, in a directory of its own that the requests
    name as their data place, so that a sandboxed learner sees it too (read-only)."""
    directory = tmp_path / "signals"
    directory.mkdir(exist_ok=True)
    return directory / "go"


def launch_request(
    job_id: str,
    command: str,
    *,
    attempt: int = 1,
    nodes: tuple[str, ...] = ("node-a", "node-a"),
    gpus: tuple[tuple[int, ...], ...] | None = None,
    go_file: Path | None = None,
    resume_from: Checkpoint | None = None,
    spec_env: dict[str, str] | None = None,
    request_env: dict[str, str] | None = None,
    data_dir: str | None = None,
) -> LaunchRequest:
    """A request for ``len(nodes)`` learners, learner ``r`` on ``nodes[r]`` holding ``gpus[r]``."""
    gpus = gpus or tuple(() for _ in nodes)
    env = dict(spec_env or {})
    if go_file is not None:
        env["GO"] = str(go_file)
        data_dir = data_dir or str(go_file.parent)
    spec = JobSpec(
        name="contract",
        command=command,
        learners=len(nodes),
        gpus=len(gpus[0]),
        data_dir=data_dir,
        env=env,
    )
    placement = Placement(
        learners=tuple(
            LearnerPlacement(rank=rank, node=node, gpus=gpus[rank]) for rank, node in enumerate(nodes)
        )
    )
    return LaunchRequest(
        job_id=job_id,
        tenant="tenant-a",
        attempt=attempt,
        spec=spec,
        placement=placement,
        resume_from=resume_from,
        env=request_env or {},
    )


def handles(job_id: str, attempt: int, ranks: range | list[int]) -> list[LearnerHandle]:
    return [LearnerHandle(job_id, attempt, rank) for rank in ranks]


async def exit_code(store: HeartbeatStore, job_id: str, attempt: int, rank: int) -> int:
    """The exit code the learner's agent reported, once it has."""
    key = exit_key(job_id, attempt, rank)
    found: list[bytes] = []

    async def reported() -> bool:
        found[:] = (await store.snapshot(key)).values.values()
        return bool(found)

    await wait_until_async(reported, EXIT_TIMEOUT_S, what=f"exit of {job_id} rank {rank}")
    return parse_exit(found[0]).exit_code


async def beat(store: HeartbeatStore, job_id: str, rank: int) -> LearnerBeat | None:
    values = (await store.snapshot(learner_key(job_id, rank))).values
    value = values.get(learner_key(job_id, rank))
    return LearnerBeat.from_json(value) if value is not None else None


async def wait_for_output(rig: LauncherRig, job_id: str, attempt: int, rank: int, text: str) -> None:
    async def printed() -> bool:
        return text in await rig.learner_output(job_id, attempt, rank)

    await wait_until_async(printed, START_TIMEOUT_S, what=f"{text!r} from {job_id} rank {rank}")


async def wait_for_running(launcher: Launcher, expected: list[LearnerHandle]) -> None:
    async def as_expected() -> bool:
        return await launcher.running() == expected

    await wait_until_async(as_expected, START_TIMEOUT_S, what=f"running() == {expected}")


def environment_of(output: str) -> dict[str, str]:
    """The variables that ``env`` printed (one ``NAME=value`` a line)."""
    return dict(
        line.split("=", 1) for line in output.splitlines() if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", line)
    )


class LauncherContract:
    """The behaviour every launcher shows; a test module runs it by providing a ``rig`` fixture."""

    async def test_every_learner_starts_with_the_environment_contract(self, rig: LauncherRig) -> None:
        job_id = new_job_id()
        checkpoints = rig.checkpoint_dir(job_id)
        checkpoint = Checkpoint(
            rank=0, attempt=1, step=40, uri=f"file://{checkpoints}/step-40", size_bytes=10
        )
        request = launch_request(
            job_id,
            "env",
            attempt=2,
            nodes=("node-a", "node-a", "node-b"),
            gpus=((0,), (3,), (1,)),
            resume_from=checkpoint,
            spec_env={"FROM_SPEC": "spec value"},
            request_env={"FROM_PLATFORM": "platform value"},
            data_dir="/data/digits",
        )
        assert await rig.launcher.running() == []

        await rig.launcher.launch(request)

        assert [await exit_code(rig.store, job_id, 2, rank) for rank in range(3)] == [0, 0, 0]
        environments = [environment_of(await rig.learner_output(job_id, 2, rank)) for rank in range(3)]
        for rank, env in enumerate(environments):
            assert env["FFDL_JOB_ID"] == job_id
            assert env["FFDL_TENANT"] == "tenant-a"
            assert env["FFDL_ATTEMPT"] == "2"
            assert env["FFDL_RESUME_FROM"] == f"{checkpoints}/step-40"
            assert env["FFDL_CHECKPOINT_DIR"] == checkpoints
            assert env["CHECKPOINT_DIR"] == env["FFDL_CHECKPOINT_DIR"]
            assert env["FFDL_HEARTBEATS"]
            assert env["RANK"] == str(rank)
            assert env["WORLD_SIZE"] == env["NUM_LEARNERS"] == "3"
            assert env["LEARNER_ID"] == str(rank + 1)
            assert env["MASTER_ADDR"]
            assert env["MASTER_PORT"].isdigit()
            assert env["RESULT_DIR"]
            assert env["DATA_DIR"] == "/data/digits"
            assert env["FROM_SPEC"] == "spec value"
            assert env["FROM_PLATFORM"] == "platform value"
        # Each learner is one torch elastic node whose only worker sees only its own GPUs.
        for rank, env in enumerate(environments):
            assert env["LOCAL_RANK"] == "0"
            assert env["LOCAL_WORLD_SIZE"] == "1"
            assert env["GROUP_RANK"] == env["NODE_RANK"] == env["ROLE_RANK"] == str(rank)
            assert env["GROUP_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "3"
            assert env["TORCHELASTIC_RUN_ID"] == job_id
            assert env["TORCHELASTIC_RESTART_COUNT"] == "1"
            assert env["OMP_NUM_THREADS"].isdigit()
        visible = [rig.visible_devices(gpus) for gpus in ((0,), (3,), (1,))]
        assert [env["CUDA_VISIBLE_DEVICES"] for env in environments] == visible
        shared = ("MASTER_ADDR", "MASTER_PORT", "FFDL_CHECKPOINT_DIR", "RESULT_DIR")
        assert len({tuple(env[name] for name in shared) for env in environments}) == 1

    async def test_a_fresh_start_has_an_empty_resume_point_and_no_gpus(self, rig: LauncherRig) -> None:
        job_id = new_job_id()

        await rig.launcher.launch(launch_request(job_id, "env", nodes=("node-a",)))

        assert await exit_code(rig.store, job_id, 1, 0) == 0
        env = environment_of(await rig.learner_output(job_id, 1, 0))
        assert env["FFDL_RESUME_FROM"] == ""
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["DATA_DIR"] == ""

    async def test_exit_codes_reach_the_heartbeat_store(self, rig: LauncherRig) -> None:
        job_id = new_job_id()
        command = 'if [ "$RANK" = 0 ]; then exit 3; else kill -KILL $$; fi'

        await rig.launcher.launch(launch_request(job_id, command))

        assert await exit_code(rig.store, job_id, 1, 0) == 3
        assert await exit_code(rig.store, job_id, 1, 1) == -9

    async def test_launching_an_attempt_twice_or_concurrently_starts_no_second_set(
        self, rig: LauncherRig, tmp_path: Path
    ) -> None:
        job_id = new_job_id()
        go_file = go_file_in(tmp_path)
        request = launch_request(job_id, f"echo started; {WAIT_FOR_GO}", go_file=go_file)
        await asyncio.gather(rig.launcher.launch(request), rig.launcher.launch(request))
        await wait_for_running(rig.launcher, handles(job_id, 1, range(2)))

        await rig.launcher.launch(request)

        assert await rig.launcher.running() == handles(job_id, 1, range(2))
        go_file.touch()
        await wait_for_running(rig.launcher, [])
        for rank in range(2):
            assert (await rig.learner_output(job_id, 1, rank)).count("started") == 1
            assert await exit_code(rig.store, job_id, 1, rank) == 0

    async def test_stop_ends_learners_that_honour_sigterm_without_waiting_for_the_grace(
        self, rig: LauncherRig
    ) -> None:
        job_id = new_job_id()
        command = "trap 'echo stopping; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
        await rig.launcher.launch(launch_request(job_id, command))
        for rank in range(2):
            await wait_for_output(rig, job_id, 1, rank, "ready")

        started = time.monotonic()
        await rig.launcher.stop(job_id, STOP_GRACE_S)

        assert time.monotonic() - started < STOP_GRACE_S
        assert await rig.launcher.running() == []
        for rank in range(2):
            assert await exit_code(rig.store, job_id, 1, rank) == 0
            assert "stopping" in await rig.learner_output(job_id, 1, rank)

    async def test_stop_kills_learners_that_ignore_sigterm_after_the_grace(self, rig: LauncherRig) -> None:
        job_id = new_job_id()
        command = "trap '' TERM; echo ready; while :; do sleep 0.05; done"
        await rig.launcher.launch(launch_request(job_id, command))
        for rank in range(2):
            await wait_for_output(rig, job_id, 1, rank, "ready")

        started = time.monotonic()
        await rig.launcher.stop(job_id, SHORT_GRACE_S)
        took = time.monotonic() - started

        assert SHORT_GRACE_S <= took < SHORT_GRACE_S + STOP_SLACK_S
        assert await rig.launcher.running() == []

    async def test_stop_covers_every_attempt_of_the_job_and_no_other_job(
        self, rig: LauncherRig, tmp_path: Path
    ) -> None:
        job_id, other_job_id = new_job_id(), new_job_id()
        go_file = go_file_in(tmp_path)
        for attempt in (1, 2):
            await rig.launcher.launch(
                launch_request(job_id, WAIT_FOR_GO, attempt=attempt, nodes=("n",), go_file=go_file)
            )
        await rig.launcher.launch(launch_request(other_job_id, WAIT_FOR_GO, nodes=("n",), go_file=go_file))
        everyone = sorted(
            [*handles(job_id, 1, [0]), *handles(job_id, 2, [0]), *handles(other_job_id, 1, [0])],
            key=lambda handle: (handle.job_id, handle.attempt),
        )
        await wait_for_running(rig.launcher, everyone)

        await rig.launcher.stop(job_id, STOP_GRACE_S)

        assert await rig.launcher.running() == handles(other_job_id, 1, [0])
        go_file.touch()
        assert await exit_code(rig.store, other_job_id, 1, 0) == 0

    async def test_running_lists_the_learners_that_are_alive(self, rig: LauncherRig, tmp_path: Path) -> None:
        job_id = new_job_id()
        go_file = go_file_in(tmp_path)
        command = f'if [ "$RANK" = 0 ]; then exit 0; fi; {WAIT_FOR_GO}'
        assert await rig.launcher.running() == []

        await rig.launcher.launch(launch_request(job_id, command, go_file=go_file))

        assert await exit_code(rig.store, job_id, 1, 0) == 0
        await wait_for_running(rig.launcher, handles(job_id, 1, [1]))
        go_file.touch()
        assert await exit_code(rig.store, job_id, 1, 1) == 0
        await wait_for_running(rig.launcher, [])

    async def test_a_new_launcher_sees_and_stops_the_learners_of_the_old_one(self, rig: LauncherRig) -> None:
        job_id = new_job_id()
        # ``exec``: the command is the process the stop signal kills. A shell loop stopped between two of
        # its commands would exit with the last one's status (the agent's trap), not by the signal.
        await rig.launcher.launch(launch_request(job_id, "echo ready; exec sleep 600"))
        for rank in range(2):
            await wait_for_output(rig, job_id, 1, rank, "ready")

        restarted = await rig.restart_launcher()

        assert await restarted.running() == handles(job_id, 1, range(2))
        await restarted.stop(job_id, STOP_GRACE_S)
        assert await restarted.running() == []
        assert [await exit_code(rig.store, job_id, 1, rank) for rank in range(2)] == [-15, -15]


class CheckpointConfinementContract:
    """Tests every launcher passes: no learner is handed a checkpoint outside its job's place."""

    async def test_a_checkpoint_outside_the_jobs_place_is_never_handed_to_a_learner(
        self, rig: LauncherRig
    ) -> None:
        job_id = new_job_id()
        climbing = f"file://{rig.checkpoint_dir(job_id)}/../../other-job/checkpoints/step-9"
        for uri in ("file:///tmp/evil-ckpt.pt", climbing):
            attempt = 1 if uri.startswith("file:///tmp") else 2
            evil = Checkpoint(rank=0, attempt=1, step=9, uri=uri)
            await rig.launcher.launch(
                launch_request(job_id, "env", attempt=attempt, nodes=("node-a",), resume_from=evil)
            )
            assert await exit_code(rig.store, job_id, attempt, 0) == 0
            env = environment_of(await rig.learner_output(job_id, attempt, 0))
            assert env["FFDL_RESUME_FROM"] == ""
